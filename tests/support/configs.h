// Parallel configurations for tests, by their sizes; everything not named keeps its default.
#pragma once

#include <string>

#include "topologies/parallel_config.h"

namespace tally::testing {

// Every axis of the rank generator, in Megatron-LM's argument order.
inline topologies::ParallelConfig config(int world, int tp, int cp, int pp, int ep, int etp,
                                         int vpp = 1,
                                         std::string order = std::string(topologies::kDefaultOrder)) {
  topologies::ParallelConfig c;
  c.world = world;
  c.tp = tp;
  c.cp = cp;
  c.pp = pp;
  c.ep = ep;
  c.etp = etp;
  c.vpp = vpp;
  c.order = std::move(order);
  return c;
}

// Without context parallelism (cp 1): the shape most model and path tests need.
inline topologies::ParallelConfig config_of(int world, int tp, int pp, int ep, int etp, int vpp = 1) {
  return config(world, tp, 1, pp, ep, etp, vpp);
}

// `c` with generalized TP (megatron-core 0.19): gtp and egtp weight shards per TP (ETP) shard.
inline topologies::ParallelConfig with_gtp(topologies::ParallelConfig c, int gtp, int egtp) {
  c.gtp = gtp;
  c.egtp = egtp;
  return c;
}

}  // namespace tally::testing
