// DeepSpeed's row of the real targets' table (run/target.h): its worker, its rules
// (run/deepspeed/rules.h), its section of the case and its engine configuration
// (run/deepspeed/engine.h).
#pragma once

#include "run/target.h"

namespace tally::run {

const FrameworkTarget& deepspeed_target();

}  // namespace tally::run
