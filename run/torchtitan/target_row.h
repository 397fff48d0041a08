// torchtitan's row of the real targets' table (run/target.h): its worker, its rules
// (run/torchtitan/rules.h) and its section of the case.
#pragma once

#include "run/target.h"

namespace tally::run {

const FrameworkTarget& torchtitan_target();

}  // namespace tally::run
