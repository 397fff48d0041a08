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
      const std::vector<int> k_choices = divisors_of(std::gcd(dp * c.cp, c.world / (c.etp * c.ep * c.pp)));
      c.dist_opt_instances = *rc::gen::elementOf(k_choices);
      if (!topologies::check_config(c)) return c;
    }
  });
}

}  // namespace tally::testing
