#include "topologies/presets.h"

namespace tally::topologies {

namespace {

struct PresetInfo {
  Preset preset;
  std::string_view name;
  std::string_view summary;
};

constexpr PresetInfo kPresets[] = {
    {Preset::llama3, "llama3",
     "Llama 3: dense, GQA, SwiGLU, RMSNorm, rope, no linear biases, an untied output layer"},
    {Preset::mixtral, "mixtral",
     "Mixtral: Llama 3's attention and norms, every layer MoE with SwiGLU experts, no biases, untied"},
    {Preset::qwen3_moe, "qwen3-moe",
     "Qwen3-MoE: q/k layernorms, GQA, every layer MoE, SwiGLU, RMSNorm, rope, no biases, untied"},
    {Preset::gpt_oss, "gpt-oss",
     "gpt-oss: attention sinks, linear and expert biases, GQA, every layer MoE, SwiGLU, RMSNorm, rope, untied"},
    {Preset::deepseek_v3, "deepseek-v3",
     "DeepSeek-V3: multi-latent attention, first layers dense, a shared expert, MTP, RMSNorm, rope, untied"},
};

const PresetInfo& info(Preset preset) { return kPresets[static_cast<int>(preset)]; }

// Llama 3's shape, which the others build on: query groups a multiple of TP with two heads each,
// two channels per head, the FFNs and vocabulary multiples of TP, one decoder layer per stage.
ModelSpec llama_shape(const ParallelConfig& config) {
  ModelSpec m;
  m.kind = ModelKind::gpt;
  m.num_layers = config.pp * config.vpp;
  m.num_query_groups = config.tp;
  m.num_attention_heads = 2 * config.tp;
  m.hidden_size = 2 * m.num_attention_heads;
  m.ffn_hidden_size = 4 * config.tp;
  m.vocab_size = 4 * config.tp;
  m.max_position_embeddings = 4;
  m.add_bias_linear = false;
  m.normalization = Normalization::rms_norm;
  m.position_embedding = PositionEmbedding::rope;
  m.swiglu = true;
  m.untie_embeddings_and_output_weights = true;
  return m;
}

void with_experts(ModelSpec& m, const ParallelConfig& config) {
  m.num_experts = 2 * config.ep;
  m.moe_ffn_hidden_size = 2 * config.etp;
}

}  // namespace

std::string_view preset_name(Preset preset) { return info(preset).name; }

std::optional<Preset> preset_from_name(std::string_view name) {
  for (const PresetInfo& p : kPresets)
    if (p.name == name) return p.preset;
  return std::nullopt;
}

std::string preset_names() {
  std::string out;
  for (const PresetInfo& p : kPresets) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

std::string_view preset_summary(Preset preset) { return info(preset).summary; }

PresetModel preset_model(Preset preset, const ParallelConfig& config) {
  ModelSpec m = llama_shape(config);
  switch (preset) {
    case Preset::llama3: break;
    case Preset::mixtral: with_experts(m, config); break;
    case Preset::qwen3_moe:
      with_experts(m, config);
      m.qk_layernorm = true;
      break;
    case Preset::gpt_oss:
      with_experts(m, config);
      m.add_bias_linear = true;
      m.softmax_type = SoftmaxType::learnable;
      break;
    case Preset::deepseek_v3:
      // Multi-latent attention with both low-rank projections and their norms (no GQA), two layers
      // per stage with the first layer dense and the others MoE with a shared expert, one MTP layer.
      with_experts(m, config);
      m.num_query_groups.reset();
      m.multi_latent_attention = true;
      m.qk_layernorm = true;
      m.q_lora_rank = 4;
      m.kv_lora_rank = 2;
      m.qk_head_dim = 2;
      m.qk_pos_emb_head_dim = 2;
      m.v_head_dim = 2;
      m.num_layers = 2 * config.pp * config.vpp;
      m.moe_layer_pattern.assign(static_cast<std::size_t>(m.num_layers), true);
      m.moe_layer_pattern[0] = false;
      m.moe_shared_expert_intermediate_size = 2 * config.tp;
      m.mtp_num_layers = 1;
      break;
  }
  m.preset = std::string(preset_name(preset));
  if (std::optional<std::string> why = check_model(m, config))
    return {std::nullopt, std::string(preset_name(preset)) + ": " + *why};
  if (std::optional<std::string> why = check_megatron_expert_bias(m, config))
    return {std::nullopt, std::string(preset_name(preset)) + ": " + *why};
  return {m, ""};
}

}  // namespace tally::topologies
