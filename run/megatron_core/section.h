// megatron-core's case section, `megatron_fsdp`: Megatron-FSDP (DistributedDataParallelConfig.
// use_megatron_fsdp), read only by the megatron-core target (adapters/tally_adapters/megatron): how
// its buffers shard over DP (data_parallel_sharding_strategy), and, with several optimizer
// instances (topology.dist_opt_instances, hybrid FSDP), across them (outer_dp_sharding_strategy).
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

enum class FsdpSharding : std::uint8_t { no_shard, optim, optim_grads, optim_grads_params };
inline constexpr FsdpSharding kFsdpShardings[] = {FsdpSharding::no_shard, FsdpSharding::optim,
                                                  FsdpSharding::optim_grads, FsdpSharding::optim_grads_params};
enum class FsdpOuterSharding : std::uint8_t { no_shard, optim };
std::string_view fsdp_sharding_name(FsdpSharding sharding);              // "no_shard", ..., "optim_grads_params"
std::string_view fsdp_outer_sharding_name(FsdpOuterSharding sharding);  // "no_shard" | "optim"

struct MegatronFsdpConfig {
  FsdpSharding sharding = FsdpSharding::optim_grads_params;  // Megatron-LM's default
  FsdpOuterSharding outer_sharding = FsdpOuterSharding::no_shard;
  friend bool operator==(const MegatronFsdpConfig&, const MegatronFsdpConfig&) = default;
};

// Strict: throws io::JsonReadError naming the field.
MegatronFsdpConfig read_megatron_fsdp_config(const nlohmann::json& value, const std::string& path);
nlohmann::ordered_json megatron_fsdp_config_json(const MegatronFsdpConfig& d);

// The section, `megatron_fsdp` in a case.
inline constexpr CaseSection<MegatronFsdpConfig> kMegatronFsdpSection{
    .key = "megatron_fsdp", .read = read_megatron_fsdp_config, .write = megatron_fsdp_config_json, .own_models = false};

}  // namespace tally::run
