// The Hugging Face case section, `hf`: how a transformers + accelerate user lays a case out, read
// only by the hf target (adapters/tally_adapters/hf): which code computes the norm (accelerate's
// `Accelerator.clip_grad_norm_` or the Trainer's `_clip_grad_norm`), the HSDP replicate degree of
// accelerate's ParallelismConfig (DP = dp_replicate x dp_shard), and where tally's gradients enter.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "run/case_section.h"

namespace tally::run {

// The grad-norm code a user of the stack calls.
enum class HfNorm {
  accelerate,  // Accelerator.clip_grad_norm_ (accelerate/accelerator.py)
  trainer,     // Trainer._clip_grad_norm, then _get_grad_norm (transformers/trainer.py)
};

std::string_view hf_norm_name(HfNorm norm);

struct HfConfig {
  HfNorm norm = HfNorm::accelerate;
  int dp_replicate = 1;
  // Where tally's gradients enter: after FSDP2's reduction, or before it (each rank's contribution,
  // averaged by FSDP2's own reduce-scatter over dp_shard and all-reduce over dp_replicate).
  bool before_reduction = false;
  friend bool operator==(const HfConfig&, const HfConfig&) = default;
};

// Strict: throws io::JsonReadError naming the field.
HfConfig read_hf_config(const nlohmann::json& value, const std::string& path);
// The canonical JSON ("gradients_enter" written only when before the reduction).
nlohmann::ordered_json hf_config_json(const HfConfig& h);

// The section, `hf` in a case.
inline constexpr CaseSection<HfConfig> kHfSection{
    .key = "hf", .read = read_hf_config, .write = hf_config_json, .own_models = false};

}  // namespace tally::run
