// megatron-core's row of the real targets' table (run/target.h): its worker, its rules
// (run/megatron_core/rules.h); Megatron's own flags build the case, so no engine configuration.
#pragma once

#include "run/target.h"

namespace tally::run {

const FrameworkTarget& megatron_core_target();

}  // namespace tally::run
