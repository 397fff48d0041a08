#include "run/megatron_core/section.h"

#include "io/json_read.h"

namespace tally::run {

using nlohmann::json;

std::string_view fsdp_sharding_name(FsdpSharding sharding) {
  switch (sharding) {
    case FsdpSharding::no_shard: return "no_shard";
    case FsdpSharding::optim: return "optim";
    case FsdpSharding::optim_grads: return "optim_grads";
    case FsdpSharding::optim_grads_params: return "optim_grads_params";
  }
  return "?";
}

std::string_view fsdp_outer_sharding_name(FsdpOuterSharding sharding) {
  return sharding == FsdpOuterSharding::optim ? "optim" : "no_shard";
}

MegatronFsdpConfig read_megatron_fsdp_config(const json& value, const std::string& path) {
  MegatronFsdpConfig d;
  io::read_object(
      value, path,
      {{"data_parallel_sharding_strategy",
        [&](const json& v, const std::string& p) {
          d.sharding = kFsdpShardings[io::read_choice(v, p, {"no_shard", "optim", "optim_grads", "optim_grads_params"})];
        }},
       {"outer_dp_sharding_strategy",
        [&](const json& v, const std::string& p) {
          d.outer_sharding = io::read_choice(v, p, {"no_shard", "optim"}) == 0 ? FsdpOuterSharding::no_shard
                                                                               : FsdpOuterSharding::optim;
        }}},
      "the Megatron-FSDP configuration");
  return d;
}

nlohmann::ordered_json megatron_fsdp_config_json(const MegatronFsdpConfig& d) {
  return {{"data_parallel_sharding_strategy", fsdp_sharding_name(d.sharding)},
          {"outer_dp_sharding_strategy", fsdp_outer_sharding_name(d.outer_sharding)}};
}

}  // namespace tally::run
