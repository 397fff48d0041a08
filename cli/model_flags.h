// The model flags commands share, in Megatron-LM's spelling, or --model FILE.json (a JSON model
// spec, custom layouts included). Defaults give a small GPT.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "topologies/model_spec.h"

namespace tally::cli {

struct ModelFlags {
  topologies::ModelSpec spec;  // filled by the flags
  std::string file;            // --model
  std::string normalization = "LayerNorm";
  std::string position_embedding = "learned_absolute";
  std::string softmax_type = "vanilla";
  std::string moe_layer_freq = "1";  // an integer or Megatron-LM's list expression
  bool disable_bias_linear = false;
  std::vector<CLI::Option*> options;  // the model flags, to reject mixing them with --model
};

void add_model_flags(CLI::App& command, ModelFlags& flags);

// The spec the flags or the file describe, not yet checked against a configuration. Throws
// UsageError for an unreadable or malformed file, or flags mixed with --model.
topologies::ModelSpec to_model_spec(const ModelFlags& flags);

}  // namespace tally::cli
