// What tally's DeepSpeed worker builds for a case: the configuration it passes to
// deepspeed.initialize, written here once. The worker pool sends it with each case
// (`case-<K>.engine.json`, docs/real-targets.md) and the worker uses it as it is; `tally show`
// prints the same function's result, so a configuration pasted from show is what tally ran.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "run/contributions.h"

namespace tally::run {

// The DeepSpeed configuration of `c`, which must have a deepspeed section.
nlohmann::ordered_json deepspeed_engine_config(const casefile::Case& c);

// One line saying what model and optimizer the worker gives DeepSpeed for `c`.
std::string deepspeed_model_description(const casefile::Case& c);

// DeepSpeed's reduction of `c`'s gradients, which the worker runs with each rank's share: a dense
// gradient summed over the DP group, an expert's over its expert-DP group (with expert TP, DP / EP
// ranks of its TP lane; without it, and for AutoEP, a stage's ranks / EP, TP ranks included), each
// divided by the DP size (runtime/engine.py:3795-3817 allreduce_bucket, :3898-3901
// _reduce_expert_gradients "utilize dp_world_size for allreduce average", at 0.19.8; ZeRO's
// reduce-scatter the same). With PP the DP group is the pipeline grid's. `c` has a deepspeed
// section.
ReductionGroups deepspeed_reduction_groups(const casefile::Case& c);

}  // namespace tally::run
