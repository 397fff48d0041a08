#include "run/hf/rules.h"

#include <algorithm>
#include <array>

#include "run/hf/section.h"
#include "run/target.h"
#include "topologies/model_spec.h"
#include "vocab/faults.h"

namespace tally::run {

namespace {

using topologies::ModelSpec;
using topologies::ParallelConfig;

// The faults planted in accelerate's own norm (Accelerator._clip_grad_norm_dtensor_aware), which the
// Trainer's mixed-mesh path does not call: a case with one runs accelerate's norm.
bool accelerate_norm_fault(const vocab::FaultSet& faults) {
  return faults.has(vocab::Fault::average_rank_norms) || faults.has(vocab::Fault::clip_per_child_norm);
}

// The faults planted in the Trainer's _mixed_mesh_grad_norm (transformers/trainer.py:2618), as expert
// faults: under expert parallelism its DTensor gradients are exactly the experts.
bool trainer_expert_fault(const vocab::FaultSet& faults) {
  return faults.has(vocab::Fault::expert_norm_dropped) || faults.has(vocab::Fault::missing_ep_reduction) ||
         faults.has(vocab::Fault::clip_per_ep_group_norm);
}

// tally_adapters.hf_families.FAMILIES with experts: a preset that names one is built as its class.
constexpr std::array<std::string_view, 4> kMoeFamilies = {"mixtral", "qwen3-moe", "gpt-oss", "deepseek-v3"};

bool moe_preset(const ModelSpec& m) {
  return std::find(kMoeFamilies.begin(), kMoeFamilies.end(), m.preset) != kMoeFamilies.end();
}

}  // namespace

std::string hf_moe_family(const ModelSpec& m) {
  if (moe_preset(m)) return m.preset;
  return m.qk_layernorm ? "qwen3-moe" : "mixtral";
}

std::string hf_architecture(const ModelSpec& m) {
  if (m.num_experts == 0) return m.qk_layernorm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
  const std::string family = hf_moe_family(m);
  if (family == "qwen3-moe") return "Qwen3MoeForCausalLM";
  if (family == "gpt-oss") return "GptOssForCausalLM";
  if (family == "deepseek-v3") return "DeepseekV3ForCausalLM";
  return "MixtralForCausalLM";
}

namespace {

// What a TP size refuses, over the whole world (the worker's only TP layout): transformers' own check
// of the output it gathers (lm_head's plan, "colwise_gather_output"), then the uneven shards its plan
// would make of the heads and the MLP, which tally's worker does not build (transformers checks none
// of them when it shards: a forward would split a head).
std::optional<std::string> tp_refuses(const ModelSpec& m, int tp) {
  if (tp == 1) return std::nullopt;
  if (!m.untie_embeddings_and_output_weights)
    return "model.untie_embeddings_and_output_weights false with topology.tp " + std::to_string(tp) +
           ": tally's worker does not build it: transformers 5.17.0's TP plan replaces lm_head.weight by a sharded "
           "param of its own (\"colwise_gather_output\"), and the model then holds the embedding and the output "
           "as two params where the case has one tied param";
  const auto divides = [&](int size, const char* what, const std::string& why) -> std::optional<std::string> {
    if (size % tp == 0) return std::nullopt;
    return "topology.tp " + std::to_string(tp) + ": " + what + " " + std::to_string(size) + " is not divisible by it: " +
           why;
  };
  if (auto why = divides(m.vocab_size, "model.vocab_size",
                         "transformers' TP plan gathers lm_head's output (\"colwise_gather_output\") and raises "
                         "ValueError (\"The output size of `lm_head` (" +
                             std::to_string(m.vocab_size) + ") must be divisible by the tensor parallel size (" +
                             std::to_string(tp) +
                             ") when gathering a colwise output.\", transformers/distributed/tensor_parallel.py:186)"))
    return why;
  const std::string uneven = "tally's worker does not build uneven TP shards (transformers' plan shards ";
  // What each class's plan shards (its config's base_model_tp_plan): GptOssForCausalLM's names
  // lm_head alone (its class's _tp_plan), DeepseekV3ForCausalLM's no attention (multi-latent).
  const std::string family = m.num_experts > 0 ? hf_moe_family(m) : "";
  if (family != "gpt-oss" && family != "deepseek-v3") {
    if (auto why = divides(topologies::resolved_query_groups(m), "model.num_query_groups (the key-value heads)",
                           uneven + "k_proj and v_proj by rows, a head per row block)"))
      return why;
    if (auto why = divides(m.num_attention_heads, "model.num_attention_heads", uneven + "q_proj by rows)")) return why;
  }
  if (family == "gpt-oss") return std::nullopt;
  if (family != "mixtral")
    if (auto why = divides(topologies::resolved_ffn_hidden(m), "model.ffn_hidden_size",
                           uneven + "gate_proj and up_proj by rows, down_proj by columns)"))
      return why;
  if (family.empty()) return std::nullopt;
  if (family == "deepseek-v3")
    if (auto why = divides(m.moe_shared_expert_intermediate_size, "model.moe_shared_expert_intermediate_size",
                           uneven + "the shared experts' gate_proj and up_proj by rows, down_proj by columns)"))
      return why;
  return divides(topologies::resolved_moe_ffn_hidden(m), "model.moe_ffn_hidden_size",
                 uneven + "the experts' gate_up_proj by packed columns, gate and up halves each, down_proj by rows)");
}

// `m` as the Llama (or, with qk-layernorm, the Qwen3) of its size: RMSNorm, rotary positions, a gated
// MLP, no experts, MTP or sinks; no linear biases with qk-layernorm; hidden a multiple of the heads
// in a Llama.
// A model with experts as its family's class (hf_moe_family): a preset as it is, less deepseek-v3's
// MTP layers (DeepseekV3ForCausalLM has none); any other as the Mixtral (or, with qk-layernorm, the
// Qwen3-MoE) of its size: no shared experts, biases, sinks or multi-latent attention, every layer MoE
// in a Mixtral.
void as_hf_moe_architecture(ModelSpec& m) {
  m.mtp_num_layers = 0;
  m.mtp_detach_heads = false;
  if (moe_preset(m)) return;
  m.moe_shared_expert_intermediate_size = 0;
  m.moe_shared_expert_gate = false;
  if (!m.qk_layernorm) {
    m.moe_layer_freq = 1;
    m.moe_layer_pattern.clear();
  }
  m.softmax_type = topologies::SoftmaxType::vanilla;
  m.multi_latent_attention = false;
  m.normalization = topologies::Normalization::rms_norm;
  m.position_embedding = topologies::PositionEmbedding::rope;
  m.swiglu = true;
  m.add_bias_linear = false;
  m.kv_channels = topologies::resolved_kv_channels(m);
}

void as_hf_architecture(ModelSpec& m) {
  if (m.num_experts > 0) {
    as_hf_moe_architecture(m);
    return;
  }
  m.moe_ffn_hidden_size.reset();
  m.moe_shared_expert_intermediate_size = 0;
  m.moe_shared_expert_gate = false;
  m.moe_layer_freq = 1;
  m.moe_layer_pattern.clear();
  m.mtp_num_layers = 0;
  m.mtp_detach_heads = false;
  m.softmax_type = topologies::SoftmaxType::vanilla;
  m.multi_latent_attention = false;
  m.normalization = topologies::Normalization::rms_norm;
  m.position_embedding = topologies::PositionEmbedding::rope;
  m.swiglu = true;
  if (m.qk_layernorm) m.add_bias_linear = false;
  // A Llama's hidden size is a multiple of its heads (LlamaConfig checks it): the next one up.
  if (!m.qk_layernorm && m.hidden_size % m.num_attention_heads != 0)
    m.hidden_size = (m.hidden_size / m.num_attention_heads + 1) * m.num_attention_heads;
}

// `m` with what transformers' TP plan shards over `tp` divisible by it (rounded up: the vocabulary,
// the MLP, the heads, each head its own key-value head) and an untied output, so the plan runs.
void divisible_by_tp(ModelSpec& m, int tp) {
  const auto round_up = [tp](int n) { return (n + tp - 1) / tp * tp; };
  m.untie_embeddings_and_output_weights = true;
  m.vocab_size = round_up(m.vocab_size);
  m.ffn_hidden_size = round_up(topologies::resolved_ffn_hidden(m));
  m.kv_channels = topologies::resolved_kv_channels(m);  // each head keeps its width as the heads grow
  m.num_attention_heads = round_up(m.num_attention_heads);
  m.num_query_groups = m.num_attention_heads;
  if (m.num_experts > 0) {
    m.moe_ffn_hidden_size = round_up(topologies::resolved_moe_ffn_hidden(m));
    m.moe_shared_expert_intermediate_size = round_up(m.moe_shared_expert_intermediate_size);
  }
  if (!m.qk_layernorm && m.hidden_size % m.num_attention_heads != 0)
    m.hidden_size = (m.hidden_size / m.num_attention_heads + 1) * m.num_attention_heads;
}

}  // namespace

// Each refusal names the input first, then the stack's own check it mirrors (file:line at
// transformers 5.17.0, accelerate 1.15.0), or what tally's worker does not build.
std::optional<std::string> hf_refusal(const casefile::Case& c, std::string_view, const FaultPlants& plants) {
  const ModelSpec& m = c.model;
  const ParallelConfig& t = c.topology;
  const vocab::PathOptions& o = c.path;
  if (m.kind != topologies::ModelKind::gpt)
    return "model.kind custom: tally's worker does not build a custom layout (it builds tally's GPT family as "
           "transformers' Llama or Qwen3)";
  if (auto why = other_frameworks_section(c, "hf")) return why;
  // Not a limit of the stack's: the field is Megatron-LM's stage; the hf section has its own field.
  if (c.path.gradients.before_reduction)
    return "gradients.enter before_reduction: the field says where gradients enter Megatron-LM's path (tally's "
           "model and megatron-core); the Hugging Face stack's is hf.gradients_enter";
  // A model with experts is its family's transformers class (hf_moe_family), which holds sinks
  // (GptOssForCausalLM) and multi-latent attention (DeepseekV3ForCausalLM).
  const std::string family = m.num_experts > 0 ? hf_moe_family(m) : "";
  const std::string built = family.empty() ? "Llama and Qwen3, which have" : "transformers' " + hf_architecture(m) + ", which has";
  if (m.mtp_num_layers > 0)
    return "model.mtp_num_layers: tally's worker does not build multi-token prediction (it builds " + built +
           " none; transformers 5.17.0 builds DeepSeek-V3's MTP layers only for speculative decoding, in MtpModel, "
           "transformers/modeling_layers.py:359)";
  if (m.softmax_type != topologies::SoftmaxType::vanilla && family != "gpt-oss")
    return "model.softmax_type learnable: tally's worker does not build attention sinks (it builds " + built +
           " none; gpt-oss's GptOssForCausalLM has them)";
  if (m.multi_latent_attention && family != "deepseek-v3")
    return "model.multi_latent_attention: tally's worker does not build multi-latent attention (it builds " + built +
           " none; deepseek-v3's DeepseekV3ForCausalLM has it)";
  if (m.normalization != topologies::Normalization::rms_norm)
    return "model.normalization LayerNorm: tally's worker does not build LayerNorm (it builds " + built +
           " RMSNorm: a weight, no bias)";
  if (m.position_embedding != topologies::PositionEmbedding::rope)
    return "model.position_embedding_type learned_absolute: tally's worker does not build learned positions (it "
           "builds " + built + " rotary positions)";
  if (!m.swiglu)
    return "model.swiglu false: tally's worker does not build an ungated MLP (it builds " + built +
           " gated MLPs: gate_proj and up_proj)";
  if (family.empty() && m.qk_layernorm && m.add_bias_linear)
    return "model.add_bias_linear with qk_layernorm: tally's worker does not build it: a qk-layernorm model is "
           "transformers' Qwen3, whose MLP, Qwen3MLP, has no biases (transformers/models/qwen3/modeling_qwen3.py:76)";
  if (family.empty() && !m.qk_layernorm && m.hidden_size % m.num_attention_heads != 0)
    return "model.hidden_size " + std::to_string(m.hidden_size) + " with num_attention_heads " +
           std::to_string(m.num_attention_heads) + ": transformers' LlamaConfig raises ValueError (\"The hidden size (" +
           std::to_string(m.hidden_size) + ") is not a multiple of the number of attention heads (" +
           std::to_string(m.num_attention_heads) +
           ").\", transformers/models/llama/configuration_llama.py:97), as StrictDataclassClassValidationError";
  if (!family.empty()) {
    // transformers' TP plan shards the experts over the tp mesh with the rest (GptOssForCausalLM's,
    // which has expert biases, shards none of them): no expert TP of its own.
    const int etp = t.tp > 1 && !m.add_bias_linear ? t.tp : 1;
    if (t.etp != etp && !(t.ep > 1 && t.tp > 1))  // EP beside TP: its own refusal below
      return "topology.etp " + std::to_string(t.etp) + " with topology.tp " + std::to_string(t.tp) +
             ": tally's worker does not build an expert TP of its own: transformers' TP plan of " +
             hf_architecture(m) + " shards the experts over the tp mesh with the rest (etp " + std::to_string(etp) + ")";
  }
  if (!family.empty() && !moe_preset(m)) {
    // Mixtral's and Qwen3-MoE's experts have no biases, and neither class has shared experts.
    if (m.add_bias_linear)
      return "model.add_bias_linear with model.num_experts: tally's worker does not build linear biases in "
             "transformers' " + hf_architecture(m) + " (its experts have none; gpt-oss's GptOssForCausalLM has them, "
             "for model.preset gpt-oss)";
    if (m.moe_shared_expert_intermediate_size > 0)
      return "model.moe_shared_expert_intermediate_size: tally's worker does not build shared experts in transformers' " +
             hf_architecture(m) + " (it has none; DeepseekV3ForCausalLM has them, for model.preset deepseek-v3)";
    if (family == "mixtral" && topologies::moe_layer_count(m) != m.num_layers)
      return "model.moe_layer_freq: tally's worker does not build dense layers in transformers' MixtralForCausalLM, "
             "every layer of which is MoE (with qk_layernorm the model is a Qwen3MoeForCausalLM, which has them)";
  }
  if (topologies::uses_gtp(t))
    return "topology.gtp/egtp: generalized TP is megatron-core's, which tally's worker does not build for the "
           "Hugging Face stack (accelerate has none)";
  if (t.pp > 1 || t.vpp > 1)
    return "topology.pp " + std::to_string(t.pp) +
           ": accelerate 1.15's ParallelismConfig has no pipeline dimension (dp_replicate, dp_shard, cp, sp, tp: "
           "accelerate/parallelism_config.py:267), and tally's worker does not build transformers' own pipeline "
           "(DistributedConfig.pp_size)";
  if (t.cp > 1)
    return "topology.cp " + std::to_string(t.cp) +
           ": tally's worker does not build context parallelism (accelerate's cp_size, which shards the sequence "
           "with torch's context_parallel around each forward)";
  if (!topologies::has_default_order(t))
    return "topology.order " + t.order +
           ": tally's worker does not build other orders: it builds accelerate's mesh, (dp_replicate, dp_shard, tp) "
           "with TP fastest (accelerate/parallelism_config.py:267), tally's default order";
  if (t.dist_opt_instances > 1)
    return "topology.dist_opt_instances: Megatron's distributed-optimizer instances, which tally's worker does not "
           "build for the Hugging Face stack; HSDP's replicate degree is hf.dp_replicate";
  if (t.ep > 1 && m.num_experts == 0)
    return "topology.ep " + std::to_string(t.ep) +
           ": tally's worker does not build expert parallelism (transformers' DistributedConfig("
           "enable_expert_parallel=True)) for a dense model, which has no experts to place";
  if (o.optimizer != vocab::OptimizerModel::plain)
    return "optimizer.model " + std::string(vocab::optimizer_model_name(o.optimizer)) +
           ": a model of Megatron's optimizers, which tally's worker does not build for the Hugging Face stack; its "
           "norm is accelerate's or the Trainer's over the model's params (leave plain)";
  if (!o.p_values.empty())
    return "statistics.p_norms: tally's worker does not build other p-norms: it records the L2 norm only (the "
           "Trainer clips at norm_type 2, accelerate's default)";
  if (o.gradients.generator.dtype != kernels::Dtype::fp32)
    return "gradients.dtype " + std::string(kernels::dtype_name(o.gradients.generator.dtype)) +
           ": tally's worker does not build 16-bit gradients: it holds fp32 parameters and gradients (accelerate "
           "mixed_precision \"no\")";
  if (std::string why = unplantable(o.faults, plants); !why.empty())
    return "faults: tally's worker does not build a counterpart of " + why;
  const std::optional<HfConfig> h = kHfSection.of(c);
  if (!h) return "hf: the case has no Hugging Face configuration (norm, dp_replicate)";
  if (accelerate_norm_fault(o.faults) && h->norm == HfNorm::trainer && (t.tp > 1 || t.ep > 1))
    return "faults: the fault is planted in accelerate's _clip_grad_norm_dtensor_aware, which the Trainer's "
           "_clip_grad_norm does not call under TP or EP (its gradients mix DTensor and plain tensors: "
           "_mixed_mesh_grad_norm, transformers/trainer.py:2618); run it with hf.norm accelerate";
  if (trainer_expert_fault(o.faults) && (h->norm != HfNorm::trainer || t.ep == 1))
    return "faults: the fault is planted in the Trainer's _mixed_mesh_grad_norm (transformers/trainer.py:2618), "
           "whose DTensor gradients are the experts only under expert parallelism (transformers' EP plan shards "
           "nothing else); run it with hf.norm trainer at topology.ep > 1";
  const int dp = topologies::dp(t);
  if (t.ep > 1) {
    // transformers' EP: enable_expert_parallel swaps the model's TP plan for its EP plan (the experts
    // sharded on dim 0, the rest plain), over the TP mesh transformers is given: accelerate's tp.
    if (t.tp > 1)
      return "topology.ep " + std::to_string(t.ep) + " with topology.tp " + std::to_string(t.tp) +
             ": transformers 5.17.0 has no EP beside TP: with enable_expert_parallel the model's TP plan is its EP "
             "plan (transformers/distributed/mixin.py:89), which shards the experts alone; tally's worker builds EP "
             "at topology.tp 1";
    if (t.ep < t.world)
      return "topology.ep " + std::to_string(t.ep) + " with expert data-parallel size " +
             std::to_string(t.world / t.ep) +
             ": tally's worker does not build EP over part of the world: transformers places the experts over the "
             "whole TP mesh it is given (accelerate's tp), and a TP mesh smaller than the world needs FSDP2 beside "
             "it, which accelerate 1.15.0's prepare fails (ImportError of ReplicateParallel, "
             "accelerate/accelerator.py:1618)";
    if (m.num_experts % t.ep != 0)
      return "topology.ep " + std::to_string(t.ep) + " with model.num_experts " + std::to_string(m.num_experts) +
             ": transformers raises ValueError (\"Cannot evenly shard ... experts across ... expert-parallel "
             "ranks.\", transformers/distributed/tensor_parallel.py:539)";
    if (h->dp_replicate > 1)
      return "hf.dp_replicate " + std::to_string(h->dp_replicate) + " with topology.ep " + std::to_string(t.ep) +
             ": EP is built on accelerate's tp mesh over the whole world, and accelerate raises ValueError "
             "(\"Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism ...\", "
             "accelerate/parallelism_config.py:337)";
    if (h->before_reduction)
      return "hf.gradients_enter before_reduction with topology.ep " + std::to_string(t.ep) +
             ": tally's worker does not build it: gradients enter before a reduction through FSDP2's hooks, and EP "
             "over the whole world has no FSDP2";
    return std::nullopt;
  }
  if (vocab::any_reduction_fault(o.faults) && !h->before_reduction)
    return "faults: a reduction fault is planted in FSDP2's reduction (torch's _get_gradient_divide_factors), which "
           "the case's gradients do not go through: give them hf.gradients_enter before_reduction, at TP 1";
  if (t.tp > 1 && t.tp < t.world)
    return "topology.tp " + std::to_string(t.tp) + " with data-parallel size " + std::to_string(dp) +
           ": FSDP2 with TP fails in accelerate 1.15.0's prepare: _prepare_tp replicates the params TP leaves plain "
           "with `from transformers.integrations.tensor_parallel import ReplicateParallel` "
           "(accelerate/accelerator.py:1618), which transformers 5.17.0 no longer has: ImportError (tally's worker "
           "builds TP over the whole world, or FSDP2 at TP 1)";
  if (t.tp > 1 && h->dp_replicate > 1)
    return "hf.dp_replicate " + std::to_string(h->dp_replicate) + " with topology.tp " + std::to_string(t.tp) +
           " over the whole world: accelerate raises ValueError (\"Tensor/Context parallelism (tp/cp_size > 1) cannot "
           "be used with pure data parallelism ...\", accelerate/parallelism_config.py:337)";
  if (t.tp > 1 && h->before_reduction)
    return "hf.gradients_enter before_reduction with topology.tp " + std::to_string(t.tp) +
           ": tally's worker does not build it: gradients enter before a reduction through FSDP2's hooks, and TP "
           "over the whole world has no FSDP2";
  if (t.tp == 1) {
    if (dp % h->dp_replicate != 0)
      return "hf.dp_replicate " + std::to_string(h->dp_replicate) + " with data-parallel size " + std::to_string(dp) +
             ": no dp_shard_size makes the world: accelerate raises ValueError (\"ParallelismConfig total_size (...) "
             "does not match num_processes (" +
             std::to_string(t.world) + ")\", accelerate/parallelism_config.py:373)";
    if (dp / h->dp_replicate == 1)
      return "hf.dp_replicate " + std::to_string(h->dp_replicate) + " with data-parallel size " + std::to_string(dp) +
             ": FSDP2 has no dimension to shard across (dp_shard_size 1): accelerate raises ValueError (\"FSDP is "
             "enabled but the parallelism config has no dimension for FSDP to shard across ...\", "
             "accelerate/parallelism_config.py:382)";
  }
  return tp_refuses(m, t.tp);
}

casefile::Case within_hf(casefile::Case c, const FaultPlants& plants, std::uint64_t draw) {
  ModelSpec& m = c.model;
  ParallelConfig& t = c.topology;
  vocab::PathOptions& o = c.path;
  if (m.kind != topologies::ModelKind::gpt) return c;
  casefile::keep_only_section(c, kHfSection.key);
  c.path.gradients.before_reduction = false;  // the stack's stage is its section's gradients_enter
  as_hf_architecture(m);
  m.first_stage_layers.reset();
  m.last_stage_layers.reset();
  t.gtp = t.egtp = 1;
  t.vpp = 1;
  t.pp = 1;
  t.cp = 1;
  t.order = std::string(topologies::kDefaultOrder);
  t.dist_opt_instances = 1;
  o.optimizer = vocab::OptimizerModel::plain;
  o.p_values.clear();
  o.gradients.generator.dtype = kernels::Dtype::fp32;
  if (!unplantable(o.faults, plants).empty()) o.faults = {};
  // TP over the whole world or none; the whole world where the case asked for some TP, unless what
  // the plan shards does not divide. A fault planted in a per-mesh clip shows only where a mesh's
  // DTensors meet plain params: under TP.
  // Experts: EP over the whole world where the case asked for EP or a fault planted in the Trainer's
  // expert norm needs it, and the experts divide among the ranks; else TP or FSDP2, as a dense model.
  const bool per_mesh_clip = o.faults.has(vocab::Fault::clip_per_child_norm);
  // A fault in the Trainer's expert norm shows on experts under EP: the model gets experts (as many
  // as the ranks, or its own count rounded up to a multiple of them) in every layer.
  if (trainer_expert_fault(o.faults) && t.world > 1) {
    if (m.num_experts == 0) {
      m.moe_ffn_hidden_size = topologies::resolved_ffn_hidden(m);
      m.moe_layer_freq = 1;
      m.moe_layer_pattern.clear();
    }
    m.num_experts = (std::max(m.num_experts, 1) + t.world - 1) / t.world * t.world;
    as_hf_architecture(m);
  }
  if (trainer_expert_fault(o.faults) && t.world == 1) o.faults = {};  // no EP on one rank
  const bool wants_ep = m.num_experts > 0 && t.world > 1 && m.num_experts % t.world == 0 &&
                        !vocab::any_reduction_fault(o.faults) && (t.ep > 1 || trainer_expert_fault(o.faults));
  const bool wants_tp = !wants_ep && ((t.tp > 1 && !vocab::any_reduction_fault(o.faults)) || per_mesh_clip);
  if (per_mesh_clip && !wants_ep && t.world > 1) divisible_by_tp(m, t.world);
  t.tp = wants_tp && t.world > 1 && !tp_refuses(m, t.world) ? t.world : 1;
  t.ep = wants_ep ? t.world : 1;
  // Expert biases (gpt-oss's) are Megatron's at ETP 1 only; GptOssForCausalLM's plan shards no expert.
  t.etp = m.num_experts > 0 && m.add_bias_linear ? 1 : t.tp;
  casefile::drop_stated_gradients_without_a_param(c, {});
  const int dp = topologies::dp(t);
  std::optional<HfConfig> stated = kHfSection.of(c);
  if (!stated) {
    stated = HfConfig{};
    stated->norm = (draw / 2) % 2 == 1 ? HfNorm::trainer : HfNorm::accelerate;
    // HSDP in half the FSDP2 cases where DP allows it, over one of the divisors accelerate accepts.
    std::vector<int> replications;
    for (int r = 2; r < dp; ++r)
      if (dp % r == 0) replications.push_back(r);
    if (!replications.empty() && (draw / 4) % 2 == 1) stated->dp_replicate = replications[(draw / 8) % replications.size()];
    // Half the FSDP2 cases give FSDP2 each rank's contribution, for its own reduction to average; a
    // reduction fault changes nothing otherwise.
    stated->before_reduction = (draw / 128) % 2 == 1 || vocab::any_reduction_fault(o.faults);
  }
  HfConfig& h = *stated;
  const bool whole_world_mesh = t.tp > 1 || t.ep > 1;  // accelerate's tp mesh, no FSDP2
  if (whole_world_mesh || dp % h.dp_replicate != 0 || (h.dp_replicate > 1 && h.dp_replicate >= dp)) h.dp_replicate = 1;
  // A reduction fault changes nothing unless FSDP2 reduces the gradients.
  if (!whole_world_mesh && vocab::any_reduction_fault(o.faults)) h.before_reduction = true;
  if (whole_world_mesh) h.before_reduction = false;
  if (accelerate_norm_fault(o.faults)) h.norm = HfNorm::accelerate;
  if (trainer_expert_fault(o.faults)) h.norm = HfNorm::trainer;
  kHfSection.set(c, h);
  return c;
}

std::optional<ReductionGroups> hf_reduction_groups(const casefile::Case& c) {
  const std::optional<HfConfig> h = kHfSection.of(c);
  if (!h || !h->before_reduction) return std::nullopt;
  const int fsdp_ranks = c.topology.world / std::max(1, c.topology.tp);
  return ReductionGroups{{fsdp_ranks}, fsdp_ranks};
}

std::string hf_norm_code(const casefile::Case& c) {
  const HfConfig h = kHfSection.of(c).value_or(HfConfig{});
  const std::string code =
      h.norm == HfNorm::trainer ? "transformers Trainer._clip_grad_norm" : "accelerate Accelerator.clip_grad_norm_";
  if (c.topology.ep > 1) return code + " over EP";
  if (c.topology.tp > 1) return code + " over TP";
  return code + (h.dp_replicate > 1 ? " over HSDP" : " over FSDP2");
}

std::vector<std::pair<std::string, casefile::Case>> hf_sweep_variants(const casefile::Case& base) {
  std::vector<std::pair<std::string, casefile::Case>> out;
  // The sweep's model of each feature as the transformers architecture of its size: a dense one as
  // the Llama and the Qwen3, one with experts as its family's class (hf_moe_family).
  const bool gpt = base.model.kind == topologies::ModelKind::gpt;
  const bool moe = gpt && base.model.num_experts > 0;
  // TP or EP over the world: no HSDP, no stage before a reduction.
  const bool whole_world_mesh = base.topology.tp > 1 || base.topology.ep > 1;
  const std::string mesh_name = base.topology.ep > 1 ? "ep" : "tp";
  for (bool qwen3 : {false, true}) {
    if (qwen3 && (moe || !gpt)) continue;
    casefile::Case projected = base;
    if (gpt) {
      if (!moe) projected.model.qk_layernorm = qwen3;
      as_hf_architecture(projected.model);
    }
    projected.path.optimizer = vocab::OptimizerModel::plain;
    projected.path.gradients.generator.dtype = kernels::Dtype::fp32;
    for (HfNorm norm : {HfNorm::accelerate, HfNorm::trainer}) {
      const std::string prefix = std::string(qwen3 ? "qwen3-" : "") + (norm == HfNorm::trainer ? "trainer-" : "");
      if (whole_world_mesh) {
        casefile::Case c = projected;
        kHfSection.set(c, {.norm = norm});
        out.emplace_back(prefix + mesh_name, c);
        continue;
      }
      for (int dp_replicate : {1, 2})
        for (bool before_reduction : {false, true}) {
          casefile::Case c = projected;
          kHfSection.set(c, {.norm = norm, .dp_replicate = dp_replicate, .before_reduction = before_reduction});
          out.emplace_back(prefix + (dp_replicate > 1 ? "hsdp" : "fsdp") + (before_reduction ? "-unreduced" : ""), c);
        }
    }
  }
  return out;
}

nlohmann::ordered_json hf_recipe(const casefile::Case& c) {
  const HfConfig h = kHfSection.of(c).value_or(HfConfig{});
  const ParallelConfig& t = c.topology;
  // Under EP the experts are placed on accelerate's tp mesh, over the whole world.
  const int tp = std::max({1, t.tp, t.ep});
  const int replicate = tp > 1 ? 1 : h.dp_replicate;
  return {{"parallelism_config",
           {{"dp_replicate_size", replicate}, {"dp_shard_size", t.world / tp / replicate}, {"tp_size", tp}}},
          {"fsdp_version", tp > 1 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(2)},
          {"norm", hf_norm_name(h.norm)},
          {"max_grad_norm", c.path.max_norm},
          {"architecture", hf_architecture(c.model)},
          // tally_adapters.hf_families' name of the class's family; null for the dense Llama and Qwen3
          {"family", c.model.num_experts > 0 ? nlohmann::ordered_json(hf_moe_family(c.model))
                                             : nlohmann::ordered_json(nullptr)},
          {"expert_parallel", t.ep > 1}};
}

std::string hf_model_description(const casefile::Case& c) {
  const HfConfig h = kHfSection.of(c).value_or(HfConfig{});
  const ParallelConfig& t = c.topology;
  const std::string arch = hf_architecture(c.model);
  const std::string layout =
      t.ep > 1   ? "transformers' EP plan (DistributedConfig(enable_expert_parallel=True)) over tp " + std::to_string(t.ep)
      : t.tp > 1 ? "transformers' TP plan over tp " + std::to_string(t.tp)
               : "accelerate's FSDP2 (dp_replicate " + std::to_string(h.dp_replicate) + ", dp_shard " +
                     std::to_string(t.world / std::max(1, h.dp_replicate)) + ")";
  return "tally's " + std::string(c.model.num_experts > 0 ? "MoE GPT" : "GPT") + " as transformers' " + arch + ", " + layout + ", prepared by Accelerator.prepare, the norm by " +
         hf_norm_code(c);
}

}  // namespace tally::run
