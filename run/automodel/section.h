// NeMo-Automodel's case section, `automodel`: how Automodel lays a case out, read only by the
// automodel target (adapters/tally_adapters/automodel): the HSDP replicate degree of its FSDP2 mesh
// (DP = dp_replicate x dp_shard; Automodel's `distributed.dp_replicate_size`), whether its TP plan
// shards the sequence (`distributed.sequence_parallel`), and where tally's gradients enter.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "run/case_section.h"

namespace tally::run {

struct AutomodelConfig {
  int dp_replicate = 1;
  bool sequence_parallel = false;
  // Where tally's gradients enter: after FSDP2's reduction, or before it (each rank's contribution,
  // averaged by FSDP2's own reduce-scatter over dp_shard_cp and all-reduce over dp_replicate).
  bool before_reduction = false;
  friend bool operator==(const AutomodelConfig&, const AutomodelConfig&) = default;
};

// Strict: throws io::JsonReadError naming the field.
AutomodelConfig read_automodel_config(const nlohmann::json& value, const std::string& path);
// The canonical JSON ("gradients_enter" written only when before the reduction).
nlohmann::ordered_json automodel_config_json(const AutomodelConfig& d);

// The section, `automodel` in a case.
inline constexpr CaseSection<AutomodelConfig> kAutomodelSection{
    .key = "automodel", .read = read_automodel_config, .write = automodel_config_json, .own_models = false};

}  // namespace tally::run
