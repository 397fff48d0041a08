// The model flags commands share, in Megatron-LM's spelling, or --model FILE.json (a JSON model
// spec, custom layouts included). Defaults give a small GPT.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "topologies/model_spec.h"
#include "topologies/presets.h"

namespace tally::cli {

struct ModelFlags {
  topologies::ModelSpec spec;  // filled by the flags
  std::string file;            // --model
  std::string preset;          // --preset
  std::string normalization = "LayerNorm";
  std::string position_embedding = "learned_absolute";
  std::string softmax_type = "vanilla";
  std::string moe_layer_freq = "1";  // an integer or Megatron-LM's list expression
  bool disable_bias_linear = false;
  std::vector<CLI::Option*> options;  // the model flags, to reject mixing them with --model
  std::vector<CLI::Option*> mla_sizes;  // multi-latent attention's, read only with --multi-latent-attention
};

void add_model_flags(CLI::App& command, ModelFlags& flags);

// The spec the flags, the file or the preset (laid out on `config`) describe, not yet checked
// against `config`. Throws UsageError for an unreadable or malformed file, flags mixed with
// --model or --preset, or a preset with no model on `config`.
topologies::ModelSpec to_model_spec(const ModelFlags& flags, const topologies::ParallelConfig& config);

// The presets `flag` names (a sweep's or a campaign's --preset list), each once. Throws UsageError
// for a name that is no preset.
std::vector<topologies::Preset> parse_presets(const std::vector<std::string>& names, const std::string& flag);
// "gpt-oss,llama3": the presets as --preset takes them.
std::string presets_text(const std::vector<topologies::Preset>& presets);

}  // namespace tally::cli
