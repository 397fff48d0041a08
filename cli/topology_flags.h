// The topology flags every command that takes a configuration shares, with Megatron-LM's long
// names as aliases.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "topologies/parallel_config.h"

namespace tally::cli {

struct TopologyFlags {
  int world = 0;
  int tp = 1;
  int cp = 1;
  int pp = 1;
  int ep = 1;
  std::optional<int> etp;  // Megatron-LM's default: etp = tp
  std::optional<int> gtp;   // default 1
  std::optional<int> egtp;
  std::optional<int> weight_shards;         // Megatron-LM's tp * gtp
  std::optional<int> expert_weight_shards;  // etp * egtp
  int vpp = 1;
  std::string order = std::string(topologies::kDefaultOrder);
  int dist_opt_instances = 1;
};

void add_topology_flags(CLI::App& command, TopologyFlags& flags, bool world_required);

// Throws UsageError naming the rule when the configuration is not one Megatron-LM accepts.
topologies::ParallelConfig to_valid_config(const TopologyFlags& flags);

}  // namespace tally::cli
