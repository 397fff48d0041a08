// The part of tally's case space the DeepSpeed worker executes
// (adapters/deepspeed/tally_deepspeed_worker.py): tally's GPT/MoE model presented to DeepSpeed's
// own engine as a Megatron-DeepSpeed model is (TP shards marked tensor_model_parallel, each MoE
// layer a deepspeed.moe.layer.MoE; with PP, a PipelineModule of the same, the word embedding a
// tied layer), with the ZeRO stage and precision of the case's `deepspeed` section. What lies outside
// is named with the reason, so `tally run --target deepspeed` refuses such a case in one line and
// the fuzzer never generates one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "casefile/case.h"
#include "run/framework_worker.h"

namespace tally::run {

// Why the DeepSpeed worker at `version` cannot execute `c`, as one line naming the field and the
// rule; nullopt when it can. Faults must be among those the worker plants (`plants`, from its
// hello).
// `dtypes`: the precisions the worker's machine computes in (WorkerHello::dtypes; empty: all).
std::optional<std::string> deepspeed_unsupported(const casefile::Case& c, std::string_view version,
                                                 const FaultPlants& plants = {},
                                                 const std::vector<std::string>& dtypes = {});

// `c` within the worker's space: a GPT model stays the same shape; CP and VPP become 1, the order
// tally's default, ETP 1 or TP, EP a divisor of the experts and of the ranks DeepSpeed makes its
// expert groups from, one optimizer instance and the plain optimizer model. A case without a `deepspeed` section gets one drawn from `draw` (a ZeRO
// stage with a precision it supports: ZeRO 0 or 1 with PP, ZeRO 3 only for dense models); one
// with a section keeps it, made valid. A custom layout has no DeepSpeed counterpart and is
// returned as it is.
casefile::Case within_deepspeed(casefile::Case c, std::string_view version, const FaultPlants& plants,
                                std::uint64_t draw, const std::vector<std::string>& dtypes = {});

}  // namespace tally::run
