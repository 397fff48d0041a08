// What tally's DeepSpeed worker builds for a case: the configuration it passes to
// deepspeed.initialize, written here once. The worker pool sends it with each case
// (`case-<K>.engine.json`, docs/real-targets.md) and the worker uses it as it is; `tally show`
// prints the same function's result, so a configuration pasted from show is what tally ran.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "casefile/case.h"

namespace tally::run {

// The DeepSpeed configuration of `c`, which must have a deepspeed section.
nlohmann::ordered_json deepspeed_engine_config(const casefile::Case& c);

// One line saying what model and optimizer the worker gives DeepSpeed for `c`.
std::string deepspeed_model_description(const casefile::Case& c);

}  // namespace tally::run
