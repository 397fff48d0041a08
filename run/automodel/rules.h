// The part of tally's case space the NeMo-Automodel worker executes
// (adapters/tally_adapters/automodel/worker.py): tally's dense GPT as the Hugging Face architecture
// of its shape (Llama; Qwen3 with qk-layernorm), a MoE GPT as Automodel's own Qwen3-MoE (with
// qk-layernorm) or GPT-OSS (with sinks and biases; on a GPU: EP over its MoE mesh, FSDP2 over the
// rest), built with the class Automodel's registry names for
// it, parallelized by Automodel's own parallelizer on its own meshes (pp, dp_replicate, dp_shard, cp,
// tp: FSDP2 over dp_shard_cp, HSDP over dp_replicate, its TP plan with or without sequence
// parallelism), and its norm computed by Automodel's clip_grad_norm. What lies outside is named
// with the reason: the framework's own check (file:line in nemo_automodel 0.7.0) or what the worker
// does not build.
#pragma once

#include <cstdint>
#include <map>
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

// Why the Automodel worker at `version` cannot execute `c`, as one line naming the field and the
// rule; nullopt when it can. Faults must be among those the worker plants (`plants`, its hello's);
// `cannot_run`: what the worker cannot run on its machine, with why (its hello's: MoE without a GPU).
std::optional<std::string> automodel_refusal(const casefile::Case& c, std::string_view version,
                                             const FaultPlants& plants = {},
                                             const std::map<std::string, std::string>& cannot_run = {});

// `c` within the worker's space: a dense GPT with RMSNorm, rotary positions and a gated MLP (no
// linear biases with qk-layernorm), PP 1, VPP 1, tally's default order, one optimizer instance, the
// plain optimizer model, fp32 gradients, TP dividing the heads and query groups. A case without an
// `automodel` section gets one drawn from `draw`: the HSDP replicate degree (a divisor of DP below
// it, or 1) and sequence parallelism where TP > 1. A planted fault gets what shows it (HSDP for the
// replicas' one). A MoE GPT, where the worker can build MoE (`cannot_run` does not name
// model.num_experts, or the case has multi-latent attention), stays MoE as Automodel's DeepSeek-V3
// (multi-latent attention: its dense layers first, no MTP), Qwen3-MoE (qk-layernorm: no biases,
// sinks or shared expert) or GPT-OSS (neither: sinks, biases, every layer MoE, no shared expert),
// TP 1, CP 1, FSDP without HSDP, EP kept where it divides the experts.
// A custom layout has no Automodel counterpart and is returned as it is.
casefile::Case within_automodel(casefile::Case c, const FaultPlants& plants, std::uint64_t draw,
                                const std::map<std::string, std::string>& cannot_run = {});

// The code that computes the norm of `c`: "automodel clip_grad_norm" (after FSDP2's reduction) or
// "automodel scale_grads_and_clip_grad_norm" (before it: the recipe's call, which first divides the
// experts by DP / ep_shard), then " with experts over EP" (a MoE model), " over HSDP" or " with
// sequence parallelism" where the case asks.
std::string automodel_norm_code(const casefile::Case& c);

// `base`, a dense model as the Llama and as the Qwen3 of its size, with FSDP and with HSDP
// replicating over two, each with and, where TP > 1, without sequence parallelism, and each with
// the gradients entering after FSDP2's reduction and before it ("fsdp", "fsdp-unreduced",
// "fsdp-sp", "hsdp", "hsdp-sp-unreduced", "qwen3-fsdp", ...); a MoE model as Automodel's Qwen3-MoE
// and as its GPT-OSS, and one with multi-latent attention as its DeepSeek-V3 too, with FSDP after
// the reduction and before it ("qwen3-moe-fsdp", "gpt-oss-fsdp-unreduced", "deepseek-v3-fsdp", ...),
// EP as the layout has it. The worker's refusals decide which run.
std::vector<std::pair<std::string, casefile::Case>> automodel_sweep_variants(const casefile::Case& base);

// The configuration the worker builds Automodel with (`case-<K>.engine.json`, and `tally show`), in
// the names of an Automodel recipe: `distributed` (dp_replicate_size, tp_size, cp_size, pp_size,
// ep_size, sequence_parallel), `clip_grad.max_norm`, and `architecture` (automodel_architecture).
nlohmann::ordered_json automodel_recipe(const casefile::Case& c);

// The name of the class in Automodel's registry the worker builds `m` as: "LlamaForCausalLM",
// "Qwen3ForCausalLM", "DeepseekV3ForCausalLM" (experts with multi-latent attention),
// "Qwen3MoeForCausalLM" (experts with qk-layernorm) or "GptOssForCausalLM" (experts, neither).
std::string automodel_architecture(const topologies::ModelSpec& m);

// How FSDP2 reduces `c`'s gradients under Automodel, where the case's gradients enter before that
// reduction (nullopt where they enter after it): summed over dp_replicate x dp_shard x cp (FSDP2
// over dp_shard_cp, HSDP's all-reduce over dp_replicate) and averaged, FSDP2's default (Automodel
// sets no gradient divide factor: nemo_automodel 0.7.0 never calls set_gradient_divide_factor);
// with sequence parallelism, a param TP replicates over that group times TP (its gradient is
// Partial over TP, which FSDP2 sums first), divided by the same FSDP group's size; with experts over
// EP, the experts over ep_shard (FSDP2's group of theirs), divided by DP (FSDP2 averages them over
// ep_shard, then the recipe's scale_grads_and_clip_grad_norm divides them by DP / ep_shard).
std::optional<ReductionGroups> automodel_reduction_groups(const casefile::Case& c);

// One line of what the worker gives Automodel, for `tally show`.
std::string automodel_model_description(const casefile::Case& c);

}  // namespace tally::run
