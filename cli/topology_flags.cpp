#include "cli/topology_flags.h"

#include "cli/number_flags.h"
#include "cli/usage_error.h"

namespace tally::cli {

void add_topology_flags(CLI::App& command, TopologyFlags& flags, bool world_required) {
  auto* world = command.add_option("--world", flags.world, "Number of ranks")->check(whole_number(1, kIntMax));
  if (world_required) world->required();
  command.add_option("--tp,--tensor-model-parallel-size", flags.tp, "Tensor-parallel size")
      ->check(any_int())
      ->capture_default_str();
  command.add_option("--cp,--context-parallel-size", flags.cp, "Context-parallel size")
      ->check(any_int())
      ->capture_default_str();
  command.add_option("--pp,--pipeline-model-parallel-size", flags.pp, "Pipeline-parallel size")
      ->check(any_int())
      ->capture_default_str();
  command.add_option("--ep,--expert-model-parallel-size", flags.ep, "Expert-parallel size")
      ->check(any_int())
      ->capture_default_str();
  command.add_option("--etp,--expert-tensor-parallel-size", flags.etp,
                     "Expert tensor-parallel size (default: tp)")
      ->check(any_int());
  command.add_option("--gtp,--gtp-weight-remat-size", flags.gtp,
                     "Generalized-TP (megatron-core 0.19) weight shards per TP shard (default 1: "
                     "plain TP)")
      ->check(any_int());
  command.add_option("--egtp,--expert-gtp-weight-remat-size", flags.egtp,
                     "Expert generalized-TP weight shards per ETP shard (default 1; independent "
                     "of --gtp)")
      ->check(any_int());
  command.add_option("--tensor-parallel-num-weight-shards", flags.weight_shards,
                     "Megatron-LM's spelling of GTP: tp * gtp shards per weight (sets --gtp)")
      ->check(any_int());
  command.add_option("--expert-tensor-parallel-num-weight-shards", flags.expert_weight_shards,
                     "Megatron-LM's spelling of expert GTP: etp * egtp shards (sets --egtp)")
      ->check(any_int());
  command.add_option("--vpp,--num-virtual-stages-per-pipeline-rank", flags.vpp,
                     "Virtual pipeline chunks per stage")
      ->check(any_int())
      ->capture_default_str();
  command.add_option("--order", flags.order,
                     "Rank order, fastest axis first: tokens tp, cp, ep, dp, pp joined by '-'")
      ->capture_default_str();
  command.add_option("--dist-opt-instances,--num-distributed-optimizer-instances",
                     flags.dist_opt_instances, "Distributed-optimizer instances")
      ->check(any_int())
      ->capture_default_str();
}

namespace {

// Megatron-LM's resolve_tensor_parallel_weight_shards: the shard count is the source of truth.
int resolve_gtp(const std::optional<int>& shards, const std::optional<int>& gtp, int tp,
                const char* shards_flag, const char* gtp_flag, const char* tp_flag) {
  // A size below 1 is check_config's to report, by its own name.
  if (!shards || tp < 1) return gtp.value_or(1);
  const std::string given = std::string(shards_flag) + " " + std::to_string(*shards);
  if (*shards < tp || *shards % tp != 0)
    throw UsageError(given + " must be a multiple of " + tp_flag + " " + std::to_string(tp) +
                     " (it counts tp x gtp shards per weight)");
  if (gtp && *gtp != *shards / tp)
    throw UsageError(given + " means " + gtp_flag + " " + std::to_string(*shards / tp) +
                     ", but " + gtp_flag + " " + std::to_string(*gtp) + " was given too");
  return *shards / tp;
}

}  // namespace

topologies::ParallelConfig to_valid_config(const TopologyFlags& flags) {
  topologies::ParallelConfig config;
  config.world = flags.world;
  config.tp = flags.tp;
  config.cp = flags.cp;
  config.pp = flags.pp;
  config.ep = flags.ep;
  config.etp = flags.etp.value_or(flags.tp);
  config.gtp = resolve_gtp(flags.weight_shards, flags.gtp, config.tp,
                           "--tensor-parallel-num-weight-shards", "--gtp", "--tp");
  config.egtp = resolve_gtp(flags.expert_weight_shards, flags.egtp, config.etp,
                            "--expert-tensor-parallel-num-weight-shards", "--egtp",
                            flags.etp ? "--etp" : "etp (= --tp, its default)");
  config.vpp = flags.vpp;
  config.order = flags.order;
  config.dist_opt_instances = flags.dist_opt_instances;
  if (std::optional<std::string> error = topologies::check_config(config)) throw UsageError(*error);
  return config;
}

}  // namespace tally::cli
