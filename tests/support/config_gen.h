// RapidCheck generator for ParallelConfig values that Megatron-LM accepts, by construction:
// sizes are picked so both grids divide the world, then an order that check_config accepts.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "topologies/enumerate.h"
#include "topologies/parallel_config.h"

namespace tally::testing {

inline std::vector<int> divisors_of(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// Worlds up to max_factor^4 ranks; every axis independently from {1, 2, ..., max_factor}.
inline rc::Gen<topologies::ParallelConfig> valid_config(int max_factor = 4) {
  return rc::gen::exec([max_factor] {
    const std::vector<topologies::AxisOrder> orders = topologies::full_orders();
    while (true) {
      topologies::ParallelConfig c;
      c.tp = *rc::gen::inRange(1, max_factor + 1);
      c.cp = *rc::gen::inRange(1, max_factor + 1);
      c.pp = *rc::gen::inRange(1, max_factor + 1);
      const int dp = *rc::gen::inRange(1, max_factor + 1);
      c.world = c.tp * c.cp * c.pp * dp;
      const int expert_ranks = c.tp * c.cp * dp;  // etp * ep * edp
      const std::vector<int> divisors = divisors_of(expert_ranks);
      c.etp = *rc::gen::elementOf(divisors);
      std::vector<int> ep_choices;
      for (int d : divisors_of(expert_ranks / c.etp)) ep_choices.push_back(d);
      c.ep = *rc::gen::elementOf(ep_choices);
      const bool default_order = *rc::gen::inRange(0, 4) == 0;
      c.order = default_order ? std::string(topologies::kDefaultOrder)
                              : topologies::order_string(*rc::gen::elementOf(orders));
      // Several distributed-optimizer instances only in the default order: in other orders
      // Megatron-LM's instance groups (expert tp-ep-pp groups concatenated) need not hold whole
      // partial data-parallel groups (slices of dp-cp), and the distributed optimizer then
      // miscounts (tally reports it; see tests/gradnorm/path_test.cpp).
      const std::vector<int> k_choices = divisors_of(std::gcd(dp * c.cp, c.world / (c.etp * c.ep * c.pp)));
      c.dist_opt_instances = default_order ? *rc::gen::elementOf(k_choices) : 1;
      if (!topologies::check_config(c)) return c;
    }
  });
}

}  // namespace tally::testing

#include "topologies/rank_layout.h"

namespace tally::testing {

// Whether Megatron-LM's layout assumptions hold, so a fault-free path must pass: experts outside
// the expert topology (EP 1, ETP = TP) are treated as dense, which is right only when the ETP
// groups are the TP groups (not so when an axis of size > 1 that only one grid has, cp or ep,
// comes before tp in the order); and several distributed-optimizer instances must each hold whole
// partial data-parallel groups (so in tests: only in the default order).
inline bool megatron_assumptions_hold(const topologies::ParallelConfig& c) {
  if (c.dist_opt_instances > 1 && c.order != topologies::kDefaultOrder) return false;
  if (c.ep > 1 || c.etp != c.tp) return true;
  const topologies::RankLayout layout(c);
  for (int rank = 0; rank < c.world; ++rank)
    if (layout.index_in(topologies::Family::tp, rank) !=
        layout.index_in(topologies::Family::expt_tp, rank))
      return false;
  return true;
}

}  // namespace tally::testing
