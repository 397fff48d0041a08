// The part of tally's case space the DeepSpeed worker executes
// (adapters/tally_adapters/deepspeed/worker.py): tally's GPT/MoE model presented to DeepSpeed's
// own engine as a Megatron-DeepSpeed model is (TP shards marked tensor_model_parallel, each MoE
// layer a deepspeed.moe.layer.MoE; with PP, a PipelineModule of the same, the word embedding a
// tied layer), or as a Hugging Face-style model DeepSpeed shards itself (AutoTP's linear layers,
// AutoEP's MoE layers, AutoEP folded over AutoTP), with the ZeRO stage and precision of the case's
// `deepspeed` section. What lies outside
// is named with the reason, so `tally run --target deepspeed` refuses such a case in one line and
// the fuzzer never generates one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "casefile/case.h"
#include "run/deepspeed/section.h"
#include "run/framework_worker.h"

namespace tally::run {

// Why the DeepSpeed worker at `version` cannot execute `c`, as one line naming the field and the
// rule: DeepSpeed's own check it mirrors (file:line at 0.19.8), or that tally's worker does not
// build the case; nullopt when it can. Faults must be among those the worker plants (`plants`, from its
// hello).
// `dtypes`: the precisions the worker's machine computes in (WorkerHello::dtypes; empty: all).
// `megatron_model_rules`: the worker builds models under Megatron-LM's rules
// (WorkerHello::megatron_model_rules), which refuse expert biases with expert TP.
// `cannot_run`: the settings the worker cannot run on its machine, with why (WorkerHello::cannot_run:
// "deepspeed.fused_adam" where DeepSpeed's FusedAdam op did not build).
std::optional<std::string> deepspeed_refusal(const casefile::Case& c, std::string_view version,
                                                 const FaultPlants& plants = {},
                                                 const std::vector<std::string>& dtypes = {},
                                                 bool megatron_model_rules = false,
                                                 const std::map<std::string, std::string>& cannot_run = {});

// Whether the worker builds `c` as its preset's Hugging Face transformers class, as DeepSpeed's
// users train those families (adapters/tally_adapters/deepspeed/families.py, uses_family: the same
// rule): a preset, no PP, no AutoEP, TP only through AutoTP (which then cuts the class by its own
// tensor-parallel plan), experts only at EP 1, below ZeRO 3.
bool builds_family(const casefile::Case& c, const DeepSpeedConfig& d);
// `c` within the worker's space: CP and VPP become 1, the order tally's default, ETP 1 or TP, EP a
// divisor of the experts and of the ranks DeepSpeed makes its expert groups from, one optimizer
// instance and the plain optimizer model. A case without a `deepspeed` section gets one drawn from
// `draw`: a ZeRO stage with a precision it supports (ZeRO 0 or 1 with PP), and, for half of the
// cases they fit, AutoTP and AutoEP. A model with experts drawn for AutoEP, or at ZeRO 3 (where
// DeepSpeed runs only AutoEP's experts), gets AutoEP's experts (SwiGLU without biases) where its
// TP and PP allow AutoEP, and ZeRO 3 becomes 2 where they do not. Half the models with expert TP
// get expert biases (Megatron refuses them; DeepSpeed does not), unless `megatron_model_rules`. A
// case with a section keeps it, made valid (FusedAdam dropped where `cannot_run` names it). A custom
// layout has no DeepSpeed counterpart and is returned as it is.
casefile::Case within_deepspeed(casefile::Case c, std::string_view version, const FaultPlants& plants,
                                std::uint64_t draw, const std::vector<std::string>& dtypes = {},
                                bool megatron_model_rules = false,
                                const std::map<std::string, std::string>& cannot_run = {});

// The DeepSpeed code that computes the norm of `c` (which has a deepspeed section):
// "clip_grad_norm_", "FP16_UnfusedOptimizer", "FP16_Optimizer", "BF16_Optimizer",
// "DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer CPU offload" or "DeepSpeedZeroOptimizer_Stage3",
// then " with AutoTP", " with AutoEP" or " with AutoTP and AutoEP" where DeepSpeed shards the model,
// then " through accelerate" or " through the Trainer" where accelerate's prepare builds the engine.
std::string deepspeed_norm_code(const casefile::Case& c);

// `base` on each of DeepSpeed's engine paths a sweep covers: ZeRO 0 to 3, each in fp32 and bf16
// ("zero0-fp32", ..., "zero3-bf16"), the plain optimizer model; the worker's refusals decide
// which run.
std::vector<std::pair<std::string, casefile::Case>> deepspeed_sweep_variants(const casefile::Case& base);

}  // namespace tally::run
