// The part of tally's case space the megatron-core worker executes
// (adapters/tally_adapters/megatron/build.py): Megatron's own GPTModel from its local layer
// spec (no Transformer Engine, no Apex), its DistributedDataParallel and its optimizers, on every
// parallel configuration Megatron accepts. What lies outside is named, with the reason, so `tally
// run --target megatron-core` refuses such a case in one line and the fuzzer never generates it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "casefile/case.h"
#include "run/contributions.h"
#include "run/framework_worker.h"

namespace tally::run {

// Why the megatron-core worker at `version` ("0.16.1", "0.19.2", ...; "" for the rules of every
// release) cannot execute `c`, as one line naming the field and the rule; nullopt when it can.
// Faults must be among those the worker plants (`plants`, from its hello).
// `cannot_run`: the settings the worker cannot run on its machine, with why (WorkerHello::cannot_run:
// "megatron_fsdp" where einops is missing, or a stand-in that models DDP's path only).
std::optional<std::string> megatron_core_refusal(const casefile::Case& c, std::string_view version,
                                                     const FaultPlants& plants = {},
                                                     const std::map<std::string, std::string>& cannot_run = {});

// `c` with every unsupported choice switched to its simplest supported one (no MTP, no attention
// sinks, no GTP, no p-norms, only plantable faults, ...), for generated cases. A GPT model stays a
// GPT model of the same shape; a custom layout has no Megatron counterpart and is returned as it is.
// A case without a `megatron_fsdp` section gets one, a fifth of the time, drawn from `draw` (a
// release whose Megatron-FSDP tally records, on a worker that can run it): its strategy, and the
// layout Megatron-FSDP runs. A worker that cannot run it has the section dropped.
casefile::Case within_megatron_core(casefile::Case c, std::string_view version, const FaultPlants& plants = {},
                                    std::uint64_t draw = 1,
                                    const std::map<std::string, std::string>& cannot_run = {});

// Where the case's gradients enter before Megatron's own reduction (gradients.enter before_reduction),
// the groups finalize_model_grads reduces them over at megatron-core 0.19.2
// (docs/megatron-reference.md §10), each rank's share summing to the gradient times |dp_cp|, which
// every rank first divides its share by: a dense param's over DP x CP; a routed expert's over its
// expert-DP group (still divided by |dp_cp|); a tied word embedding's over DP x CP of the first
// and the last stage (Megatron sums the two copies after DP); a q/k layernorm's over DP x CP of
// every TP rank (Megatron sums it over TP after DP). nullopt where they enter after it.
std::optional<ReductionGroups> megatron_core_reduction_groups(const casefile::Case& c);

// Whether `version` is older than major.minor (an unparsable version counts as the newest).
bool megatron_core_older_than(std::string_view version, int major, int minor);

}  // namespace tally::run
