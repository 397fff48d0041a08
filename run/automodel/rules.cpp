#include "run/automodel/rules.h"

#include <algorithm>
#include <numeric>

#include "run/automodel/section.h"
#include "run/target.h"
#include "topologies/model_spec.h"
#include "vocab/faults.h"

namespace tally::run {

namespace {

using topologies::ModelSpec;
using topologies::ParallelConfig;

bool replicas_fault(const vocab::FaultSet& faults) { return faults.has(vocab::Fault::stats_over_replicas); }

// The smallest HSDP replicate degree Automodel accepts above 1: a divisor of DP below it
// (mesh_utils.py:308-311 at nemo_automodel 0.7.0), or 1 where there is none.
int smallest_replication(int dp) {
  for (int r = 2; r < dp; ++r)
    if (dp % r == 0) return r;
  return 1;
}

// What a TP size refuses: Automodel's own check of the heads (validate_tp_mesh, key-value heads first
// as it checks them), then the uneven shards its plan would make of the MLP and the vocabulary, which
// tally's worker does not build (Automodel has no check of them: an uneven vocabulary runs, an uneven
// MLP fails in torch 2.11's DTensor matmul of the forward).
std::optional<std::string> tp_refuses(const ModelSpec& m, int tp) {
  if (tp == 1) return std::nullopt;
  const auto divides = [&](int size, const char* what, const std::string& why) -> std::optional<std::string> {
    if (size % tp == 0) return std::nullopt;
    return "topology.tp " + std::to_string(tp) + ": " + what + " " + std::to_string(size) + " is not divisible by it: " +
           why;
  };
  const auto validate_tp_mesh = [&](const char* field, int size, const char* line) {
    return "Automodel's validate_tp_mesh raises ValueError (\"" + std::string(field) + " (" + std::to_string(size) +
           ") must be divisible by TP size (" + std::to_string(tp) +
           ")\", nemo_automodel/components/distributed/parallelizer.py:" + line + ")";
  };
  const int groups = topologies::resolved_query_groups(m);
  if (auto why = divides(groups, "model.num_query_groups (the key-value heads)",
                         validate_tp_mesh("num_key_value_heads", groups, "1040")))
    return why;
  if (auto why = divides(m.num_attention_heads, "model.num_attention_heads",
                         validate_tp_mesh("num_attention_heads", m.num_attention_heads, "1042")))
    return why;
  if (auto why = divides(topologies::resolved_ffn_hidden(m), "model.ffn_hidden_size",
                         "tally's worker does not build uneven TP shards (Automodel's plan shards gate_proj and "
                         "up_proj by rows, down_proj by columns)"))
    return why;
  return divides(m.vocab_size, "model.vocab_size",
                 "tally's worker does not build uneven TP shards (Automodel's plan shards embed_tokens and lm_head by "
                 "rows)");
}

// `m` as the Llama (or, with qk-layernorm, the Qwen3) of its size: RMSNorm, rotary positions, a gated
// MLP, no experts, MTP or sinks; no linear biases with qk-layernorm; hidden a multiple of the heads
// in a Llama.
void as_hf_architecture(ModelSpec& m) {
  m.num_experts = 0;
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

// Which of Automodel's MoE models a MoE case is built as (tally_adapters/automodel/moe.py `family`):
// with multi-latent attention its DeepSeek-V3, else with qk-layernorm its Qwen3-MoE, else its GPT-OSS.
enum class MoeFamily { qwen3_moe, gpt_oss, deepseek_v3 };

MoeFamily moe_family(const ModelSpec& m) {
  if (m.multi_latent_attention) return MoeFamily::deepseek_v3;
  return m.qk_layernorm ? MoeFamily::qwen3_moe : MoeFamily::gpt_oss;
}

std::string moe_family_name(MoeFamily f) {
  switch (f) {
    case MoeFamily::qwen3_moe: return "Qwen3-MoE";
    case MoeFamily::gpt_oss: return "GPT-OSS";
    case MoeFamily::deepseek_v3: return "DeepSeek-V3";
  }
  return "";
}

// What the three MoE models share: RMSNorm, rotary positions, gated MLPs, an untied output layer, no
// MTP (DeepSeek-V3's has none in Automodel).
void as_automodel_moe(ModelSpec& m) {
  m.untie_embeddings_and_output_weights = true;
  m.mtp_num_layers = 0;
  m.mtp_detach_heads = false;
  m.normalization = topologies::Normalization::rms_norm;
  m.position_embedding = topologies::PositionEmbedding::rope;
  m.swiglu = true;
  m.moe_shared_expert_gate = false;
}

// `m` as Automodel's Qwen3-MoE of its size: qk-layernorm, no linear biases, sinks or shared expert.
void as_qwen3_moe(ModelSpec& m) {
  as_automodel_moe(m);
  m.multi_latent_attention = false;
  m.qk_layernorm = true;
  m.add_bias_linear = false;
  m.softmax_type = topologies::SoftmaxType::vanilla;
  m.moe_shared_expert_intermediate_size = 0;
}

// `m` as Automodel's GPT-OSS of its size: a learnable sink per head, linear, router and expert
// biases, no qk-layernorm or shared expert, every layer MoE.
void as_gpt_oss(ModelSpec& m) {
  as_automodel_moe(m);
  m.multi_latent_attention = false;
  m.qk_layernorm = false;
  m.add_bias_linear = true;
  m.softmax_type = topologies::SoftmaxType::learnable;
  m.moe_shared_expert_intermediate_size = 0;
  m.moe_layer_freq = 1;
  m.moe_layer_pattern.clear();
}

// A shared expert as Automodel's DeepSeek-V3 sizes it: n_shared_experts experts wide (rounded up).
void shared_expert_in_whole_experts(ModelSpec& m) {
  const int expert = topologies::resolved_moe_ffn_hidden(m);
  if (m.moe_shared_expert_intermediate_size % expert != 0)
    m.moe_shared_expert_intermediate_size = (m.moe_shared_expert_intermediate_size / expert + 1) * expert;
}

// `m`, a MoE GPT with multi-latent attention, as Automodel's DeepSeek-V3 of its size: the latent
// norms, no linear biases or sinks, its dense layers the first ones, a shared expert (where there is
// one) a whole number of experts wide.
void as_deepseek_v3(ModelSpec& m) {
  as_automodel_moe(m);
  m.qk_layernorm = true;
  m.add_bias_linear = false;
  m.softmax_type = topologies::SoftmaxType::vanilla;
  // Dense layers first: as many as the case has, at the front (first_k_dense_replace).
  int dense = 0;
  for (int layer = 0; layer < m.num_layers; ++layer) dense += topologies::is_moe_layer(m, layer) ? 0 : 1;
  dense = std::min(dense, m.num_layers - 1);
  m.moe_layer_pattern.assign(static_cast<std::size_t>(m.num_layers), true);
  std::fill_n(m.moe_layer_pattern.begin(), dense, false);
  m.moe_layer_freq = 1;
  shared_expert_in_whole_experts(m);
}

void as_automodel_moe_family(ModelSpec& m) {
  switch (moe_family(m)) {
    case MoeFamily::qwen3_moe: as_qwen3_moe(m); break;
    case MoeFamily::gpt_oss: as_gpt_oss(m); break;
    case MoeFamily::deepseek_v3: as_deepseek_v3(m); break;
  }
}

constexpr const char* kGptOssModel = "nemo_automodel/components/models/gpt_oss/";

// What keeps a MoE case without qk-layernorm from Automodel's GPT-OSS: each is built into the model
// whatever its config says.
std::optional<std::string> gpt_oss_refuses(const ModelSpec& m) {
  if (m.softmax_type != topologies::SoftmaxType::learnable)
    return std::string("model.softmax_type vanilla with experts and without qk_layernorm: tally's worker does not "
                       "build Automodel's other MoE models; it builds Qwen3-MoE (with qk-layernorm) and GPT-OSS, whose "
                       "attention always has a learnable sink per head (GptOssAttention.sinks, ") +
           kGptOssModel + "layers.py:97)";
  if (!m.add_bias_linear)
    return std::string("model.add_bias_linear false with experts and without qk_layernorm: tally's worker does not "
                       "build Automodel's other MoE models; it builds Qwen3-MoE (with qk-layernorm) and GPT-OSS, whose "
                       "q/k/v/o projections are built with bias=True (") +
           kGptOssModel + "layers.py:59-70) and its router and experts with biases (router_bias, expert_bias True, " +
           kGptOssModel + "model.py:129-130)";
  for (int layer = 0; layer < m.num_layers; ++layer)
    if (!topologies::is_moe_layer(m, layer))
      return "model.moe_layer_freq " + topologies::moe_layer_freq_text(m) + ": layer " + std::to_string(layer) +
             " is dense, and Automodel's GPT-OSS builds every layer as MoE (its Block always has a MoE, " +
             kGptOssModel + "model.py:54)";
  return std::nullopt;
}

constexpr const char* kDeepseekV3Model = "nemo_automodel/components/models/deepseek_v3/";

// What keeps a MoE case with multi-latent attention from Automodel's DeepSeek-V3.
std::optional<std::string> deepseek_v3_refuses(const ModelSpec& m) {
  if (!m.qk_layernorm)
    return std::string("model.qk_layernorm false with multi-latent attention: tally's worker does not build it: "
                       "Automodel's DeepSeek-V3 always has its latent norms (kv_a_layernorm, ") +
           kDeepseekV3Model + "layers.py:114; q_a_layernorm with q_lora_rank, :96)";
  if (m.add_bias_linear)
    return std::string("model.add_bias_linear with multi-latent attention: tally's worker does not build it: "
                       "Automodel's DeepSeek-V3 builds its projections with bias=False (") +
           kDeepseekV3Model + "layers.py:85-128)";
  if (m.softmax_type != topologies::SoftmaxType::vanilla)
    return "model.softmax_type learnable with multi-latent attention: tally's worker does not build attention sinks "
           "in Automodel's DeepSeek-V3, which has none";
  bool moe_seen = false;
  for (int layer = 0; layer < m.num_layers; ++layer) {
    const bool moe = topologies::is_moe_layer(m, layer);
    if (moe_seen && !moe)
      return "model.moe_layer_freq " + topologies::moe_layer_freq_text(m) + ": layer " + std::to_string(layer) +
             " is dense after a MoE layer, and Automodel's DeepSeek-V3 makes exactly its first "
             "first_k_dense_replace layers dense (" +
             kDeepseekV3Model + "model.py:55)";
    moe_seen = moe_seen || moe;
  }
  const int expert = topologies::resolved_moe_ffn_hidden(m);
  if (m.moe_shared_expert_intermediate_size % expert != 0)
    return "model.moe_shared_expert_intermediate_size " + std::to_string(m.moe_shared_expert_intermediate_size) +
           " with moe_ffn_hidden_size " + std::to_string(expert) +
           ": tally's worker does not build it: Automodel's DeepSeek-V3 sizes its shared experts as n_shared_experts "
           "experts (" +
           kDeepseekV3Model + "model.py:152)";
  if (m.moe_shared_expert_gate)
    return "model.moe_shared_expert_gate: tally's worker does not build a gated shared expert (Automodel's "
           "DeepSeek-V3 has none)";
  if (m.mtp_num_layers > 0)
    return "model.mtp_num_layers: tally's worker does not build multi-token prediction with Automodel: its "
           "DeepSeek-V3 (0.7.0) builds no MTP layer";
  return std::nullopt;
}

// What keeps a MoE case from Automodel's Qwen3-MoE, GPT-OSS or DeepSeek-V3 as the worker builds
// them: the model's kinds of params first, then the layout (Automodel's own check of EP, then what
// the worker does not build).
std::optional<std::string> moe_refuses(const ModelSpec& m, const ParallelConfig& t) {
  const MoeFamily family = moe_family(m);
  const std::string name = moe_family_name(family);
  switch (family) {
    case MoeFamily::gpt_oss:
      if (auto why = gpt_oss_refuses(m)) return why;
      break;
    case MoeFamily::deepseek_v3:
      if (auto why = deepseek_v3_refuses(m)) return why;
      break;
    case MoeFamily::qwen3_moe:
      if (m.add_bias_linear)
        return "model.add_bias_linear with experts and qk_layernorm: tally's worker does not build linear biases in "
               "Automodel's Qwen3-MoE (it builds the model without them, as Qwen3-MoE is)";
      if (m.softmax_type != topologies::SoftmaxType::vanilla)
        return "model.softmax_type learnable with experts and qk_layernorm: tally's worker does not build attention "
               "sinks in Automodel's Qwen3-MoE, which has none";
      break;
  }
  if (family != MoeFamily::deepseek_v3 && m.moe_shared_expert_intermediate_size > 0)
    return "model.moe_shared_expert_intermediate_size: tally's worker does not build a shared expert (Automodel's " +
           name + " has none)";
  if (!m.untie_embeddings_and_output_weights)
    return "model.untie_embeddings_and_output_weights false with experts: Automodel's " + name +
           " raises NotImplementedError (\"... does not support tie_word_embeddings=True\", "
           "nemo_automodel/components/models/common/tie_word_embeddings.py:61)";
  if (m.mtp_num_layers > 0 || m.normalization != topologies::Normalization::rms_norm ||
      m.position_embedding != topologies::PositionEmbedding::rope || !m.swiglu)
    return "model: tally's worker does not build MTP, LayerNorm, learned positions or an ungated MLP in Automodel's " +
           name + ", which has none of them";
  // EP divides every stage's ranks (Automodel's check, mesh_utils.py:317-318), as tally's topology has it.
  // FSDP2 shards the stacked experts over ep_shard along dim 1 (Automodel's _moe_shard_placement,
  // nemo_automodel/components/moe/parallelizer.py:112): the hidden size of gate_and_up_projs (and of
  // GPT-OSS's down_proj_bias), the expert FFN of down_projs (twice it in gate_up_proj_bias).
  const int ep_shard = t.world / std::max(1, t.pp) / t.ep;
  for (const auto& [field, size] : {std::pair{"model.hidden_size", m.hidden_size},
                                    std::pair{"model.moe_ffn_hidden_size", topologies::resolved_moe_ffn_hidden(m)}})
    if (size % ep_shard != 0)
      return std::string(field) + " " + std::to_string(size) + " with ep_shard " + std::to_string(ep_shard) +
             " (the ranks of a stage over EP): Automodel's FSDP2 shards its stacked experts along dim 1, and torch "
             "raises NotImplementedError (\"FSDP does not support uneven sharding on dim 1\", "
             "torch/distributed/fsdp/_fully_shard/_fsdp_param.py:377 at torch 2.11.0)";
  if (t.tp > 1)
    return "topology.tp " + std::to_string(t.tp) + " with experts: tally's worker does not build TP with Automodel's " +
           name + " yet";
  // Automodel's experts are EP's (and FSDP2's over ep_shard): its MoE TP plan may not shard them.
  if (t.etp != 1)
    return "topology.etp " + std::to_string(t.etp) +
           ": Automodel has no expert TP: its MoE TP plan raises ValueError for a plan that targets routed experts "
           "(\"Tensor parallelism must not target routed-expert parameters ...\", "
           "nemo_automodel/components/moe/tp_plan_validation.py:79)";
  if (t.cp > 1)
    return "topology.cp " + std::to_string(t.cp) + " with experts: tally's worker does not build CP with Automodel's " +
           name + " yet";
  return std::nullopt;
}

}  // namespace

// Each refusal names the input first, then the framework's own check it mirrors (file:line at
// nemo_automodel 0.7.0, transformers 5.18.0), or what tally's worker does not build.
std::optional<std::string> automodel_refusal(const casefile::Case& c, std::string_view, const FaultPlants& plants,
                                             const std::map<std::string, std::string>& cannot_run) {
  const ModelSpec& m = c.model;
  const ParallelConfig& t = c.topology;
  const vocab::PathOptions& o = c.path;
  if (m.kind != topologies::ModelKind::gpt)
    return "model.kind custom: tally's worker does not build a custom layout (it builds tally's GPT family as "
           "Automodel's Llama or Qwen3)";
  if (auto why = other_frameworks_section(c, "automodel")) return why;
  // Not a limit of Automodel's: the field is Megatron-LM's stage; Automodel's has its own field.
  if (c.path.gradients.before_reduction)
    return "gradients.enter before_reduction: the field says where gradients enter Megatron-LM's path (tally's "
           "model and megatron-core); Automodel's is automodel.gradients_enter";
  if (m.num_experts > 0) {
    // The worker says why where it cannot (no GPU: Qwen3-MoE and GPT-OSS build their rotary embedding
    // on CUDA; DeepSeek-V3, the MoE model with multi-latent attention, builds on CPUs).
    if (const auto it = cannot_run.find("model.num_experts"); it != cannot_run.end() && !m.multi_latent_attention)
      return "model.num_experts without multi_latent_attention: " + it->second;
    if (auto why = moe_refuses(m, t)) return why;
  }
  // A dense model: Automodel has other architectures with these (MTP, sinks, LayerNorm, ...); the worker
  // builds two (a MoE model's were checked above, for its family).
  if (m.num_experts == 0) {
    if (m.mtp_num_layers > 0)
      return "model.mtp_num_layers: tally's worker does not build multi-token prediction (it builds Llama and Qwen3, "
             "which have none)";
    if (m.softmax_type != topologies::SoftmaxType::vanilla)
      return "model.softmax_type learnable: tally's worker does not build attention sinks (it builds Llama and Qwen3, "
             "which have none)";
    if (m.multi_latent_attention)
      return "model.multi_latent_attention: tally's worker does not build multi-latent attention (it builds Llama and "
             "Qwen3, which have none)";
    if (m.normalization != topologies::Normalization::rms_norm)
      return "model.normalization LayerNorm: tally's worker does not build LayerNorm (it builds Llama and Qwen3, which "
             "normalize with RMSNorm: a weight, no bias)";
    if (m.position_embedding != topologies::PositionEmbedding::rope)
      return "model.position_embedding_type learned_absolute: tally's worker does not build learned positions (it "
             "builds Llama and Qwen3, which use rotary positions)";
    if (!m.swiglu)
      return "model.swiglu false: tally's worker does not build an ungated MLP (Llama's and Qwen3's have gate_proj and "
             "up_proj)";
    if (m.qk_layernorm && m.add_bias_linear)
      return "model.add_bias_linear with qk_layernorm: tally's worker does not build it: a qk-layernorm model is "
             "Automodel's Qwen3, whose MLP, transformers' Qwen3MLP, has no biases "
             "(transformers/models/qwen3/modeling_qwen3.py:76)";
    if (!m.qk_layernorm && m.hidden_size % m.num_attention_heads != 0)
      return "model.hidden_size " + std::to_string(m.hidden_size) + " with num_attention_heads " +
             std::to_string(m.num_attention_heads) + ": transformers' LlamaConfig raises ValueError (\"The hidden size (" +
             std::to_string(m.hidden_size) + ") is not a multiple of the number of attention heads (" +
             std::to_string(m.num_attention_heads) +
             ").\", transformers/models/llama/configuration_llama.py:97), as StrictDataclassClassValidationError";
  }
  // Not a limit of Automodel's: megatron-core's fields, which Automodel has no counterpart of.
  if (topologies::uses_gtp(t))
    return "topology.gtp/egtp: generalized TP is megatron-core's, which tally's worker does not build for Automodel "
           "(Automodel has none)";
  if (t.pp > 1 || t.vpp > 1)
    return "topology.pp " + std::to_string(t.pp) +
           ": tally's worker does not build a pipeline yet (Automodel's AutoPipeline, which splits the model into "
           "stages)";
  // Automodel can lay its mesh over a list of ranks (MeshContext.build's `ranks`); the worker builds its default.
  if (!topologies::has_default_order(t))
    return "topology.order " + t.order +
           ": tally's worker does not build other orders: it builds Automodel's default FSDP2 mesh, (pp, "
           "dp_replicate, dp_shard, cp, tp) with TP fastest (nemo_automodel/components/distributed/mesh_utils.py:324), "
           "tally's default order";
  if (t.dist_opt_instances > 1)
    return "topology.dist_opt_instances: Megatron's distributed-optimizer instances, which tally's worker does not "
           "build for Automodel; HSDP's replicate degree is automodel.dp_replicate";
  // tally's own check refuses EP without experts (topologies/model_spec.cpp) before a case gets here.
  if (t.ep > 1 && m.num_experts == 0)
    return "topology.ep " + std::to_string(t.ep) +
           " without experts: Automodel's parallelize_model sends EP > 1 to its MoE parallelizer "
           "(nemo_automodel/components/distributed/model_parallelizer.py:71), which raises AttributeError for a dense "
           "model (\"MoE models must expose moe_config ...\", nemo_automodel/components/moe/parallelizer.py:245)";
  if (o.optimizer != vocab::OptimizerModel::plain)
    return "optimizer.model " + std::string(vocab::optimizer_model_name(o.optimizer)) +
           ": a model of Megatron's optimizers, which tally's worker does not build for Automodel; its norm is "
           "Automodel's clip_grad_norm over the DTensor params (leave plain)";
  if (!o.p_values.empty())
    return "statistics.p_norms: tally's worker does not build other p-norms: it records the L2 norm only "
           "(Automodel's clip_grad_norm at its default norm_type 2)";
  if (o.gradients.generator.dtype != kernels::Dtype::fp32)
    return "gradients.dtype " + std::string(kernels::dtype_name(o.gradients.generator.dtype)) +
           ": tally's worker does not build 16-bit gradients: it holds fp32 parameters and gradients (FSDP2 "
           "reduce_dtype float32)";
  if (std::string why = unplantable(o.faults, plants); !why.empty())
    return "faults: tally's worker does not build a counterpart of " + why;
  const std::optional<AutomodelConfig> a = kAutomodelSection.of(c);
  if (!a) return "automodel: the case has no Automodel configuration (dp_replicate, sequence_parallel)";
  const int dp = topologies::dp(t);
  const int replicate = a->dp_replicate;
  if (dp % replicate != 0)
    return "automodel.dp_replicate " + std::to_string(replicate) + " with data-parallel size " + std::to_string(dp) +
           ": Automodel raises ValueError (\"dp_size must be a multiple of dp_replicate_size\", "
           "nemo_automodel/components/distributed/mesh_utils.py:309)";
  if (replicate > 1 && replicate >= dp)
    return "automodel.dp_replicate " + std::to_string(replicate) + " with data-parallel size " + std::to_string(dp) +
           ": Automodel raises ValueError (\"dp_replicate_size=" + std::to_string(replicate) +
           " must be less than dp_size=" + std::to_string(dp) +
           " since DDP usecase is not supported by FSDP2\", nemo_automodel/components/distributed/mesh_utils.py:311)";
  if (m.num_experts > 0 && replicate > 1)
    return "automodel.dp_replicate " + std::to_string(replicate) +
           " with experts: tally's worker does not build HSDP with Automodel's MoE yet";
  // Automodel would run it: its parallelizer reads sequence_parallel only where TP > 1.
  if (a->sequence_parallel && t.tp == 1)
    return "automodel.sequence_parallel with topology.tp 1: tally's worker does not build it, the same run as "
           "without it (Automodel applies no TP plan at TP 1, nemo_automodel/components/distributed/"
           "parallelizer.py:317)";
  return tp_refuses(m, t.tp);
}

casefile::Case within_automodel(casefile::Case c, const FaultPlants& plants, std::uint64_t draw,
                                const std::map<std::string, std::string>& cannot_run) {
  ModelSpec& m = c.model;
  ParallelConfig& t = c.topology;
  vocab::PathOptions& o = c.path;
  if (m.kind != topologies::ModelKind::gpt) return c;
  casefile::keep_only_section(c, kAutomodelSection.key);
  c.path.gradients.before_reduction = false;  // Automodel's stage is its section's gradients_enter
  const bool moe = m.num_experts > 0 && (m.multi_latent_attention || !cannot_run.contains("model.num_experts"));
  if (moe) {
    as_automodel_moe_family(m);
    t.cp = 1;
    t.tp = 1;
    if (m.num_experts % t.ep != 0 || t.world % t.ep != 0) t.ep = 1;
    // What FSDP2 shards along dim 1 over ep_shard (moe_refuses): the next sizes it divides,
    // the hidden size a multiple of the heads too where they give the channels.
    const int ep_shard = t.world / t.ep;
    const int hidden_step = m.kv_channels ? ep_shard : std::lcm(ep_shard, m.num_attention_heads);
    if (m.hidden_size % hidden_step != 0) m.hidden_size = (m.hidden_size / hidden_step + 1) * hidden_step;
    if (const int ffn = topologies::resolved_moe_ffn_hidden(m); ffn % ep_shard != 0)
      m.moe_ffn_hidden_size = (ffn / ep_shard + 1) * ep_shard;
    if (moe_family(m) == MoeFamily::deepseek_v3) shared_expert_in_whole_experts(m);
  } else {
    as_hf_architecture(m);
  }
  m.first_stage_layers.reset();
  m.last_stage_layers.reset();
  t.gtp = t.egtp = 1;
  t.vpp = 1;
  t.pp = 1;
  if (!moe) t.ep = 1;
  t.order = std::string(topologies::kDefaultOrder);
  t.dist_opt_instances = 1;
  o.optimizer = vocab::OptimizerModel::plain;
  o.p_values.clear();
  o.gradients.generator.dtype = kernels::Dtype::fp32;
  if (!unplantable(o.faults, plants).empty()) o.faults = {};
  // TP must divide what its plan shards; halved until it does, the rest of the world going to DP.
  while (t.tp > 1 && tp_refuses(m, t.tp)) t.tp /= 2;
  t.etp = t.tp;
  casefile::drop_stated_gradients_without_a_param(c, {});
  const int dp = topologies::dp(t);
  std::optional<AutomodelConfig> stated = kAutomodelSection.of(c);
  if (!stated) {
    stated = AutomodelConfig{};
    // HSDP in half the cases where DP allows it, over one of the divisors Automodel accepts.
    std::vector<int> replications;
    for (int r = 2; r < dp; ++r)
      if (dp % r == 0) replications.push_back(r);
    if (!replications.empty() && draw % 2 == 1) stated->dp_replicate = replications[(draw / 2) % replications.size()];
    stated->sequence_parallel = t.tp > 1 && (draw / 64) % 2 == 1;
    // Half the cases give FSDP2 each rank's contribution, for its own reduction to average; a
    // reduction fault changes nothing otherwise.
    stated->before_reduction = (draw / 128) % 2 == 1 || vocab::any_reduction_fault(o.faults);
  }
  AutomodelConfig& a = *stated;
  if (dp % a.dp_replicate != 0 || (a.dp_replicate > 1 && a.dp_replicate >= dp)) a.dp_replicate = 1;
  if (moe) a.dp_replicate = 1;  // FSDP2 without HSDP: what the worker builds of Automodel's MoE
  // The replicas' fault shows only where HSDP has replicas.
  if (replicas_fault(o.faults) && a.dp_replicate == 1 && !moe) a.dp_replicate = smallest_replication(dp);
  if (t.tp == 1) a.sequence_parallel = false;
  kAutomodelSection.set(c, a);
  return c;
}

std::optional<ReductionGroups> automodel_reduction_groups(const casefile::Case& c) {
  const std::optional<AutomodelConfig> a = kAutomodelSection.of(c);
  if (!a || !a->before_reduction) return std::nullopt;
  const topologies::ParallelConfig& t = c.topology;
  const int fsdp_ranks = t.world / (std::max(1, t.tp) * std::max(1, t.pp));
  ReductionGroups groups{{fsdp_ranks}, fsdp_ranks};
  // With sequence parallelism a param TP replicates has a Partial gradient, which FSDP2 sums over
  // TP before it averages over its own group: shares over both.
  if (t.tp > 1 && a->sequence_parallel) groups.add(fsdp_ranks * t.tp);
  // Experts: FSDP2 averages them over ep_shard only, and the recipe's scale_grads_and_clip_grad_norm
  // then divides them by DP / ep_shard (training/utils.py:722-727): over ep_shard, divided by DP.
  if (c.model.num_experts > 0 && t.ep > 1) groups.add(fsdp_ranks / t.ep);
  return groups;
}

std::string automodel_norm_code(const casefile::Case& c) {
  const AutomodelConfig a = kAutomodelSection.of(c).value_or(AutomodelConfig{});
  // Before the reduction, the recipe's own call, which scales the experts first (train_ft.py:1501).
  return std::string(a.before_reduction ? "automodel scale_grads_and_clip_grad_norm" : "automodel clip_grad_norm") +
         (c.model.num_experts > 0 ? " with experts over EP" : "") +
         (a.dp_replicate > 1 ? " over HSDP" : "") +
         (a.sequence_parallel ? " with sequence parallelism" : "");
}

std::vector<std::pair<std::string, casefile::Case>> automodel_sweep_variants(const casefile::Case& base) {
  std::vector<std::pair<std::string, casefile::Case>> out;
  // The sweep's model of each feature as Automodel's architecture of its size; a MoE feature as its
  // Qwen3-MoE and as its GPT-OSS, and one with multi-latent attention as its DeepSeek-V3, with FSDP,
  // after its reduction and before it (the worker refuses the first two without a GPU, with its
  // reason).
  const bool dense = base.model.kind == topologies::ModelKind::gpt && base.model.num_experts == 0;
  if (base.model.kind == topologies::ModelKind::gpt && !dense) {
    for (MoeFamily family : {MoeFamily::qwen3_moe, MoeFamily::gpt_oss, MoeFamily::deepseek_v3}) {
      if (family == MoeFamily::deepseek_v3 && !base.model.multi_latent_attention) continue;
      casefile::Case c = base;
      if (family == MoeFamily::qwen3_moe) as_qwen3_moe(c.model);
      if (family == MoeFamily::gpt_oss) as_gpt_oss(c.model);
      if (family == MoeFamily::deepseek_v3) as_deepseek_v3(c.model);
      c.path.optimizer = vocab::OptimizerModel::plain;
      c.path.gradients.generator.dtype = kernels::Dtype::fp32;
      const std::string name = family == MoeFamily::qwen3_moe ? "qwen3-moe" : family == MoeFamily::gpt_oss ? "gpt-oss"
                                                                                                          : "deepseek-v3";
      for (bool before_reduction : {false, true}) {
        kAutomodelSection.set(c, {.dp_replicate = 1, .sequence_parallel = false, .before_reduction = before_reduction});
        out.emplace_back(name + "-fsdp" + (before_reduction ? "-unreduced" : ""), c);
      }
    }
    return out;
  }
  for (bool qwen3 : {false, true}) {
    if (qwen3 && !dense) continue;  // one refusal of the experts is enough
    casefile::Case projected = base;
    if (dense) {
      projected.model.qk_layernorm = qwen3;
      as_hf_architecture(projected.model);
    }
    for (int dp_replicate : {1, 2})
      for (bool sp : {false, true}) {
        if (sp && base.topology.tp == 1) continue;  // sequence parallelism shards over TP
        casefile::Case c = projected;
        c.path.optimizer = vocab::OptimizerModel::plain;
        c.path.gradients.generator.dtype = kernels::Dtype::fp32;
        for (bool before_reduction : {false, true}) {
          kAutomodelSection.set(
              c, {.dp_replicate = dp_replicate, .sequence_parallel = sp, .before_reduction = before_reduction});
          out.emplace_back(std::string(qwen3 ? "qwen3-" : "") + (dp_replicate > 1 ? "hsdp" : "fsdp") + (sp ? "-sp" : "") +
                               (before_reduction ? "-unreduced" : ""),
                           c);
        }
      }
  }
  return out;
}

std::string automodel_architecture(const ModelSpec& m) {
  if (m.num_experts > 0) {
    switch (moe_family(m)) {
      case MoeFamily::qwen3_moe: return "Qwen3MoeForCausalLM";
      case MoeFamily::gpt_oss: return "GptOssForCausalLM";
      case MoeFamily::deepseek_v3: return "DeepseekV3ForCausalLM";
    }
  }
  return m.qk_layernorm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
}

nlohmann::ordered_json automodel_recipe(const casefile::Case& c) {
  const AutomodelConfig a = kAutomodelSection.of(c).value_or(AutomodelConfig{});
  const ParallelConfig& t = c.topology;
  return {{"distributed",
           {{"strategy", "fsdp2"},
            {"dp_replicate_size", a.dp_replicate},
            {"tp_size", t.tp},
            {"cp_size", t.cp},
            {"pp_size", t.pp},
            {"ep_size", t.ep},
            {"sequence_parallel", a.sequence_parallel}}},
          {"clip_grad", {{"max_norm", c.path.max_norm}}},
          {"architecture", automodel_architecture(c.model)}};
}

std::string automodel_model_description(const casefile::Case& c) {
  const AutomodelConfig a = kAutomodelSection.of(c).value_or(AutomodelConfig{});
  const int dp = topologies::dp(c.topology);
  const std::string experts =
      c.model.num_experts > 0 ? ", its experts on the MoE mesh over EP " + std::to_string(c.topology.ep) : "";
  const std::string family = c.model.num_experts == 0 ? (c.model.qk_layernorm ? "Qwen3" : "Llama")
                                                      : moe_family_name(moe_family(c.model));
  return "tally's GPT as Automodel's " + family +
         " on its FSDP2 mesh (dp_replicate " + std::to_string(a.dp_replicate) + ", dp_shard " +
         std::to_string(dp / std::max(1, a.dp_replicate)) + ", cp " + std::to_string(c.topology.cp) + ", tp " +
         std::to_string(c.topology.tp) + (a.sequence_parallel ? ", sequence parallel" : "") + experts +
         "), parallelized by parallelize_model, the norm by " + automodel_norm_code(c);
}

}  // namespace tally::run
