// torchtitan's case section, `torchtitan`: how a PyTorch-native trainer counts, read only by the
// torchtitan target (adapters/tally_adapters/torchtitan): whose clip runs over the DTensor params,
// the SPMD backend torchtitan lays them out with, the HSDP replicate degree (DP = dp_replicate x
// dp_shard), and where tally's gradients enter.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "run/case_section.h"

namespace tally::run {

enum class DTensorClip : std::uint8_t {
  torchtitan,  // torchtitan.distributed.utils.clip_grad_norm_: the EP and non-EP halves, then PP
  torch,       // torch.nn.utils.clip_grad_norm_ over every param, as most FSDP2 users call it
};
enum class SpmdBackend : std::uint8_t {
  full_dtensor,     // every param a DTensor of the dense (or sparse) mesh, FSDP over its DP dims
  partial_dtensor,  // DTensor for the model-parallel dims; fully_shard over (dp_replicate, fsdp)
};
std::string_view dtensor_clip_name(DTensorClip clip);      // "torchtitan" | "torch"
std::string_view spmd_backend_name(SpmdBackend backend);  // "full_dtensor" | "partial_dtensor"

struct TorchTitanConfig {
  DTensorClip clip = DTensorClip::torchtitan;
  SpmdBackend spmd_backend = SpmdBackend::full_dtensor;
  int dp_replicate = 1;  // HSDP's replicate degree; divides DP, the rest is dp_shard
  // Where tally's gradients enter: after FSDP2's reduce-scatter (each rank's reduced shard written
  // in), or before it (each rank's own contribution, as backward leaves it, reduced by FSDP2).
  bool before_reduction = false;
  friend bool operator==(const TorchTitanConfig&, const TorchTitanConfig&) = default;
};

// Strict: throws io::JsonReadError naming the field.
TorchTitanConfig read_torchtitan_config(const nlohmann::json& value, const std::string& path);
// The canonical JSON ("gradients_enter" written only when before the reduction, so earlier case
// files keep their digests).
nlohmann::ordered_json torchtitan_config_json(const TorchTitanConfig& d);

// The section, `torchtitan` in a case.
inline constexpr CaseSection<TorchTitanConfig> kTorchTitanSection{
    .key = "torchtitan", .read = read_torchtitan_config, .write = torchtitan_config_json, .own_models = false};

}  // namespace tally::run
