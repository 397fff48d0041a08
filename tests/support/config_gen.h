// RapidCheck generator for ParallelConfig values that Megatron-LM accepts, by construction. The
// generator itself lives in fuzz/generators.h (tally fuzz uses it too); these are the bounds the
// tests use.
#pragma once

#include <rapidcheck.h>

#include "fuzz/generators.h"
#include "topologies/parallel_config.h"

namespace tally::testing {

// tp, cp, pp and dp each at most max_factor (worlds up to max_factor^4 ranks), every order
// Megatron-LM accepts for the sizes (the corners of megatron_assumptions_hold included), vpp 1.
inline fuzz::TopologyGenOptions test_topology(int max_factor, int max_vpp) {
  fuzz::TopologyGenOptions o;
  o.max_world = max_factor * max_factor * max_factor * max_factor;
  o.max_axis = max_factor;
  o.grow_with_size = false;
  o.max_vpp = max_vpp;
  o.avoid_megatron_corners = false;
  return o;
}

inline rc::Gen<topologies::ParallelConfig> valid_config(int max_factor = 4) {
  return fuzz::gen_config(test_topology(max_factor, 1));
}

// Whether Megatron-LM's layout assumptions hold, so a fault-free path must pass (see
// fuzz::megatron_layout_assumptions_hold).
inline bool megatron_assumptions_hold(const topologies::ParallelConfig& c) {
  return fuzz::megatron_layout_assumptions_hold(c);
}

}  // namespace tally::testing
