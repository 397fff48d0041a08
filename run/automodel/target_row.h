// NeMo-Automodel's row of run::FrameworkTarget (run/target.h): `--target automodel`.
#pragma once

#include "run/target.h"

namespace tally::run {

const FrameworkTarget& automodel_target();

}  // namespace tally::run
