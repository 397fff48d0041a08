// The Hugging Face stack's row of run::FrameworkTarget (run/target.h): `--target hf` (transformers and accelerate).
#pragma once

#include "run/target.h"

namespace tally::run {

const FrameworkTarget& hf_target();

}  // namespace tally::run
