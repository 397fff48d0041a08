// The part of tally's case space the Hugging Face worker executes (adapters/tally_adapters/hf/worker.py):
// tally's dense GPT as the transformers architecture of its shape (Llama; Qwen3 with qk-layernorm),
// transformers' own LlamaForCausalLM / Qwen3ForCausalLM, laid out as an accelerate 1.15 user lays it
// out: FSDP2 through accelerate (FullyShardedDataParallelPlugin(fsdp_version=2), HSDP over
// ParallelismConfig.dp_replicate_size) at TP 1, or tensor parallelism over the whole world
// (transformers' TP plan on accelerate's tp mesh) at DP 1; the norm computed by accelerate's
// Accelerator.clip_grad_norm_ or by the Trainer's _clip_grad_norm. What lies outside is named with
// the reason: the stack's own check (file:line at transformers 5.17.0 and accelerate 1.15.0) or
// what the worker does not build.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "run/contributions.h"
#include "run/framework_worker.h"

namespace tally::run {

// Why the Hugging Face worker at `version` cannot execute `c`, as one line naming the field and the
// rule; nullopt when it can. Faults must be among those the worker plants (`plants`, its hello's).
std::optional<std::string> hf_refusal(const casefile::Case& c, std::string_view version, const FaultPlants& plants = {});

// `c` within the worker's space: a dense GPT with RMSNorm, rotary positions and a gated MLP (no
// linear biases with qk-layernorm), PP 1, CP 1, tally's default order, one optimizer instance, the
// plain optimizer model, fp32 gradients, and TP either 1 (FSDP2) or the world (TP alone), dividing
// what transformers' plan shards. A case without an `hf` section gets one drawn from `draw`: the
// norm (accelerate's or the Trainer's), the HSDP replicate degree (a divisor of DP below it, or 1)
// and, under FSDP2, where the gradients enter. A planted fault gets what shows it. A custom layout
// has no transformers counterpart and is returned as it is.
casefile::Case within_hf(casefile::Case c, const FaultPlants& plants, std::uint64_t draw);

// The code that computes the norm of `c`: "accelerate Accelerator.clip_grad_norm_" or "transformers
// Trainer._clip_grad_norm", then " over FSDP2", " over HSDP" or " over TP".
std::string hf_norm_code(const casefile::Case& c);

// `base`, a dense model as the Llama and as the Qwen3 of its size, with each norm, with FSDP and
// HSDP replicating over two, each with the gradients entering after FSDP2's reduction and before it
// ("fsdp", "fsdp-unreduced", "hsdp", "trainer-fsdp", "qwen3-trainer-hsdp-unreduced", ...), and, at
// TP equal to the world, "tp" and "trainer-tp"; a MoE model once per norm, for the worker to refuse.
// The worker's refusals decide which run.
std::vector<std::pair<std::string, casefile::Case>> hf_sweep_variants(const casefile::Case& base);

// The configuration the worker builds with (`case-<K>.engine.json`, and `tally show`), in
// accelerate's and transformers' names: `parallelism_config` (dp_replicate_size, dp_shard_size,
// tp_size), `fsdp_version` (2, or null without FSDP2), `norm` ("accelerate" or "trainer"),
// `max_grad_norm`, and `architecture` ("LlamaForCausalLM" or "Qwen3ForCausalLM").
nlohmann::ordered_json hf_recipe(const casefile::Case& c);

// How FSDP2 reduces `c`'s gradients under accelerate, where they enter before that reduction
// (nullopt where they enter after it): summed over dp_replicate x dp_shard, the world at TP 1, and
// averaged, FSDP2's default (accelerate 1.15 sets no gradient divide factor).
std::optional<ReductionGroups> hf_reduction_groups(const casefile::Case& c);

// One line of what the worker gives transformers and accelerate, for `tally show`.
std::string hf_model_description(const casefile::Case& c);

}  // namespace tally::run
