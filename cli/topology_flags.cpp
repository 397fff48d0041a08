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

topologies::ParallelConfig to_valid_config(const TopologyFlags& flags) {
  topologies::ParallelConfig config;
  config.world = flags.world;
  config.tp = flags.tp;
  config.cp = flags.cp;
  config.pp = flags.pp;
  config.ep = flags.ep;
  config.etp = flags.etp.value_or(flags.tp);
  config.vpp = flags.vpp;
  config.order = flags.order;
  config.dist_opt_instances = flags.dist_opt_instances;
  if (std::optional<std::string> error = topologies::check_config(config)) throw UsageError(*error);
  return config;
}

}  // namespace tally::cli
