#include "cli/model_flags.h"

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "cli/number_flags.h"
#include "cli/usage_error.h"
#include "casefile/model_json.h"
#include "topologies/moe_layer_pattern.h"
#include "topologies/presets.h"

namespace tally::cli {

void add_model_flags(CLI::App& command, ModelFlags& f) {
  topologies::ModelSpec& s = f.spec;
  auto add = [&](CLI::Option* option) { f.options.push_back(option); };
  // Model sizes: any int here; check_model states their bounds.
  auto size = [&](CLI::Option* option) {
    f.options.push_back(option->check(any_int()));
    return option;
  };
  command.add_option("--model", f.file,
                     "A JSON model spec (kind gpt with these fields in snake_case, or kind "
                     "custom with params by class); excludes the model flags");
  std::string presets;
  for (topologies::Preset p : topologies::kAllPresets)
    presets += "\n  " + std::string(topologies::preset_name(p)) + ": " + std::string(topologies::preset_summary(p));
  command.add_option("--preset", f.preset,
                     "The architecture of a family people train, at tiny sizes laid out on the topology "
                     "(excludes --model and the model flags):" + presets)
      ->check(CLI::IsMember([] {
        std::vector<std::string> names;
        for (topologies::Preset p : topologies::kAllPresets) names.emplace_back(topologies::preset_name(p));
        return names;
      }()));
  size(command.add_option("--num-layers", s.num_layers, "Decoder layers")->capture_default_str());
  size(command.add_option("--hidden-size", s.hidden_size, "Hidden size")->capture_default_str());
  size(command.add_option("--num-attention-heads", s.num_attention_heads, "Attention heads")
          ->capture_default_str());
  size(command.add_option("--num-query-groups", s.num_query_groups,
                         "Query groups (GQA; default: the number of heads)"));
  size(command.add_option("--kv-channels", s.kv_channels,
                         "Channels per head (default: hidden size / heads)"));
  size(command.add_option("--ffn-hidden-size", s.ffn_hidden_size,
                         "Dense MLP hidden size (default: 4 * hidden size)"));
  size(command.add_option("--vocab-size", s.vocab_size, "Vocabulary size")->capture_default_str());
  size(command.add_option("--max-position-embeddings", s.max_position_embeddings,
                         "Rows of the learned position embedding")
          ->capture_default_str());
  add(command.add_flag("--disable-bias-linear", f.disable_bias_linear,
                       "No biases on linear layers (QKV, proj, FC1, FC2, router, experts)"));
  add(command.add_option("--normalization", f.normalization, "LayerNorm (weight and bias) or RMSNorm")
          ->check(CLI::IsMember({"LayerNorm", "RMSNorm"}))
          ->capture_default_str());
  add(command.add_flag("--qk-layernorm", s.qk_layernorm, "Norms on queries and keys"));
  add(command.add_flag("--multi-latent-attention", s.multi_latent_attention,
                       "Multi-latent attention (DeepSeek-V2/V3): low-rank query and key-value projections, laid out "
                       "as megatron-core's Transformer Engine spec builds them"));
  f.mla_sizes = {
      size(command.add_option("--q-lora-rank", s.q_lora_rank,
                              "MLA: rank of the query's low-rank projection (default: none, one linear_q_proj)")),
      size(command.add_option("--kv-lora-rank", s.kv_lora_rank, "MLA: rank of the key-value low-rank projection")
               ->capture_default_str()),
      size(command.add_option("--qk-head-dim", s.qk_head_dim, "MLA: query and key head width without rope")
               ->capture_default_str()),
      size(command.add_option("--qk-pos-emb-head-dim", s.qk_pos_emb_head_dim,
                              "MLA: the rope part of each query and key head")
               ->capture_default_str()),
      size(command.add_option("--v-head-dim", s.v_head_dim, "MLA: value head width")->capture_default_str())};
  add(command.add_option("--position-embedding-type", f.position_embedding,
                         "learned_absolute (a replicated table) or rope (no parameter)")
          ->check(CLI::IsMember({"learned_absolute", "rope"}))
          ->capture_default_str());
  add(command.add_option("--softmax-type", f.softmax_type,
                         "vanilla, or learnable (an attention sink per head)")
          ->check(CLI::IsMember({"vanilla", "learnable"}))
          ->capture_default_str());
  add(command.add_flag("--untie-embeddings-and-output-weights",
                       s.untie_embeddings_and_output_weights, "Separate output layer"));
  add(command.add_flag("--swiglu", s.swiglu, "Gated FC1 (twice the rows)"));
  size(command.add_option("--num-experts", s.num_experts, "Routed experts per MoE layer (0: dense)")
          ->capture_default_str());
  size(command.add_option("--moe-ffn-hidden-size", s.moe_ffn_hidden_size,
                         "Expert hidden size (default: ffn hidden size)"));
  size(command.add_option("--moe-shared-expert-intermediate-size",
                         s.moe_shared_expert_intermediate_size, "Shared expert size (0: none)"));
  add(command.add_flag("--moe-shared-expert-gate", s.moe_shared_expert_gate,
                       "A gate weight on the shared expert"));
  add(command.add_option("--moe-layer-freq", f.moe_layer_freq,
                         "Which layers are MoE, as Megatron-LM takes it: N (layers 0, N, 2N, ...), or a list "
                         "of 0 (dense) and 1 (MoE) per layer, such as \"([0]*1+[1]*3)\"")
          ->capture_default_str());
  size(command.add_option("--mtp-num-layers", s.mtp_num_layers, "Multi-token prediction layers"));
  add(command.add_flag("--mtp-detach-heads", s.mtp_detach_heads,
                       "MTP params in their own grad-norm group ('mtp')"));
  size(command.add_option("--decoder-first-pipeline-num-layers", s.first_stage_layers,
                         "Layers on the first pipeline stage (uneven stages)"));
  size(command.add_option("--decoder-last-pipeline-num-layers", s.last_stage_layers,
                         "Layers on the last pipeline stage (uneven stages)"));
}

topologies::ModelSpec to_model_spec(const ModelFlags& f, const topologies::ParallelConfig& config) {
  if (!f.preset.empty()) {
    if (!f.file.empty()) throw UsageError("--preset " + f.preset + " cannot be combined with --model " + f.file);
    for (const CLI::Option* option : f.options)
      if (option->count() > 0)
        throw UsageError("--preset " + f.preset + " cannot be combined with the model flag " + option->get_name() +
                         " (a preset is the whole model; write it out with `tally layout --preset " + f.preset +
                         " --json`, whose \"model\" is a --model file to change)");
    const topologies::PresetModel preset = topologies::preset_model(*topologies::preset_from_name(f.preset), config);
    if (!preset.model) throw UsageError("--preset " + preset.why_none);
    return *preset.model;
  }
  if (!f.file.empty()) {
    for (const CLI::Option* option : f.options)
      if (option->count() > 0)
        throw UsageError("--model " + f.file + " cannot be combined with the model flag " +
                         option->get_name() + " (put the field in the file)");
    try {
      return casefile::load_model_spec(f.file);
    } catch (const casefile::ModelJsonError& error) {
      throw UsageError(error.what());
    }
  }
  topologies::ModelSpec spec = f.spec;
  if (!spec.multi_latent_attention)
    for (const CLI::Option* option : f.mla_sizes)
      if (option->count() > 0)
        throw UsageError(option->get_name() + " is a size of multi-latent attention: add --multi-latent-attention");
  spec.add_bias_linear = !f.disable_bias_linear;
  spec.normalization = f.normalization == "RMSNorm" ? topologies::Normalization::rms_norm
                                                    : topologies::Normalization::layer_norm;
  spec.position_embedding = f.position_embedding == "rope"
                                ? topologies::PositionEmbedding::rope
                                : topologies::PositionEmbedding::learned_absolute;
  spec.softmax_type = f.softmax_type == "learnable" ? topologies::SoftmaxType::learnable
                                                    : topologies::SoftmaxType::vanilla;
  // An integer, read as every number flag is, or Megatron-LM's list expression (it has brackets).
  const std::string& freq = f.moe_layer_freq;
  if (freq.find_first_of("[(") == std::string::npos) {
    if (const std::optional<std::string> why = whole_number_error(freq, INT_MIN, INT_MAX))
      throw UsageError("--moe-layer-freq: " + *why);
    spec.moe_layer_freq = std::stoi(freq);
    return spec;
  }
  try {
    spec.moe_layer_pattern = topologies::parse_moe_layer_pattern(freq);
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--moe-layer-freq: ") + error.what());
  }
  return spec;
}

std::vector<topologies::Preset> parse_presets(const std::vector<std::string>& names, const std::string& flag) {
  std::vector<topologies::Preset> presets;
  for (const std::string& name : names) {
    const std::optional<topologies::Preset> preset = topologies::preset_from_name(name);
    if (!preset) throw UsageError(flag + " '" + name + "' is not a preset (" + topologies::preset_names() + ")");
    if (std::find(presets.begin(), presets.end(), *preset) == presets.end()) presets.push_back(*preset);
  }
  return presets;
}

std::string presets_text(const std::vector<topologies::Preset>& presets) {
  std::string out;
  for (topologies::Preset p : presets) out += (out.empty() ? "" : ",") + std::string(topologies::preset_name(p));
  return out;
}

}  // namespace tally::cli
