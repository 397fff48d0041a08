// Architecture presets: the models people train, named as they name them, at tiny sizes but with
// their families' kinds of parameters, flags and sharing, laid out on a parallel configuration
// (every size a multiple of what splits it, as a sweep's models are).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "topologies/model_spec.h"
#include "topologies/parallel_config.h"

namespace tally::topologies {

enum class Preset : std::uint8_t { llama3, mixtral, qwen3_moe, gpt_oss, deepseek_v3 };
inline constexpr Preset kAllPresets[] = {Preset::llama3, Preset::mixtral, Preset::qwen3_moe, Preset::gpt_oss,
                                         Preset::deepseek_v3};

std::string_view preset_name(Preset preset);  // "llama3", "mixtral", "qwen3-moe", "gpt-oss", "deepseek-v3"
std::optional<Preset> preset_from_name(std::string_view name);
std::string preset_names();  // "llama3, mixtral, qwen3-moe, gpt-oss, deepseek-v3", for messages
// What the family has that its preset keeps, one line (for --help and `tally layout`).
std::string_view preset_summary(Preset preset);

// The preset's model on `config` (its `preset` field set), or why tally cannot lay it out there:
// a rule of check_model or Megatron-LM's expert-bias rule the sizes cannot meet, or a kind of
// parameter tally's model does not have yet.
struct PresetModel {
  std::optional<ModelSpec> model;
  std::string why_none;
};
PresetModel preset_model(Preset preset, const ParallelConfig& config);

}  // namespace tally::topologies
