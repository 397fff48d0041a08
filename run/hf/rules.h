// The part of tally's case space the Hugging Face worker executes (adapters/tally_adapters/hf/worker.py):
// tally's dense GPT as the transformers architecture of its shape (Llama; Qwen3 with qk-layernorm),
// transformers' own LlamaForCausalLM / Qwen3ForCausalLM, and a GPT with experts as its family's MoE
// class (hf_moe_family: a preset's own, else Mixtral or Qwen3-MoE), laid out as an accelerate 1.15
// user lays it out: FSDP2 through accelerate (FullyShardedDataParallelPlugin(fsdp_version=2), HSDP
// over ParallelismConfig.dp_replicate_size) at TP 1, tensor parallelism over the whole world
// (transformers' TP plan on accelerate's tp mesh) at DP 1, or expert parallelism over the whole world
// (DistributedConfig(enable_expert_parallel=True): the class's EP plan on that mesh, the experts
// sharded on dim 0, every other param plain) at TP 1; the norm computed by accelerate's
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
#include "topologies/model_spec.h"

namespace tally::run {

// The family (tally_adapters.hf_families.FAMILIES) a model with experts is built as: a preset's own
// (mixtral, qwen3-moe, gpt-oss, deepseek-v3), else "qwen3-moe" with qk-layernorm, "mixtral" without.
std::string hf_moe_family(const topologies::ModelSpec& m);

// transformers' class the worker builds `m` as: LlamaForCausalLM, Qwen3ForCausalLM, or the family's
// MoE class (MixtralForCausalLM, Qwen3MoeForCausalLM, GptOssForCausalLM, DeepseekV3ForCausalLM).
std::string hf_architecture(const topologies::ModelSpec& m);

// Why the Hugging Face worker at `version` cannot execute `c`, as one line naming the field and the
// rule; nullopt when it can. Faults must be among those the worker plants (`plants`, its hello's).
std::optional<std::string> hf_refusal(const casefile::Case& c, std::string_view version, const FaultPlants& plants = {});

// `c` within the worker's space: a dense GPT with RMSNorm, rotary positions and a gated MLP (no
// linear biases with qk-layernorm), PP 1, CP 1, tally's default order, one optimizer instance, the
// plain optimizer model, fp32 gradients, and TP either 1 (FSDP2) or the world (TP alone), dividing
// what transformers' plan shards; a model with experts as its family's class (as_hf_architecture), on
// EP over the world where the case asks for EP (or a fault in the Trainer's expert norm needs it) and
// the experts divide. A case without an `hf` section gets one drawn from `draw`: the
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
// TP equal to the world, "tp" and "trainer-tp"; a model with experts as its family's class alone, at
// EP (or TP) equal to the world "ep" and "trainer-ep" ("tp", "trainer-tp").
// The worker's refusals decide which run.
std::vector<std::pair<std::string, casefile::Case>> hf_sweep_variants(const casefile::Case& base);

// The configuration the worker builds with (`case-<K>.engine.json`, and `tally show`), in
// accelerate's and transformers' names: `parallelism_config` (dp_replicate_size, dp_shard_size,
// tp_size), `fsdp_version` (2, or null without FSDP2), `norm` ("accelerate" or "trainer"),
// `max_grad_norm`, `architecture` (hf_architecture), `family` (hf_moe_family, null for a dense model)
// and `expert_parallel` (EP over tp_size, the whole world).
nlohmann::ordered_json hf_recipe(const casefile::Case& c);

// How FSDP2 reduces `c`'s gradients under accelerate, where they enter before that reduction
// (nullopt where they enter after it): summed over dp_replicate x dp_shard, the world at TP 1, and
// averaged, FSDP2's default (accelerate 1.15 sets no gradient divide factor).
std::optional<ReductionGroups> hf_reduction_groups(const casefile::Case& c);

// One line of what the worker gives transformers and accelerate, for `tally show`.
std::string hf_model_description(const casefile::Case& c);

}  // namespace tally::run
