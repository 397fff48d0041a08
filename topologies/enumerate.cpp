#include "topologies/enumerate.h"

#include <algorithm>

namespace tally::topologies {

std::vector<AxisOrder> full_orders() {
  AxisOrder order = kAllAxes;  // tp cp ep dp pp: the default order, lexicographically first
  std::vector<AxisOrder> orders;
  do {
    orders.push_back(order);
  } while (std::next_permutation(order.begin(), order.end()));
  return orders;
}

std::int64_t for_each_config(int world, const EnumerateFilter& filter,
                             const std::function<void(const ParallelConfig&)>& visit) {
  std::vector<int> divisors;
  for (int d = 1; d <= world; ++d)
    if (world % d == 0) divisors.push_back(d);
  std::vector<std::string> orders;
  if (filter.order)
    orders.push_back(order_string(*filter.order));
  else
    for (const AxisOrder& order : full_orders()) orders.push_back(order_string(order));

  auto within = [](int value, int limit) { return limit == 0 || value <= limit; };
  std::int64_t count = 0;
  ParallelConfig config;
  config.world = world;
  for (int tp : divisors) {
    if (!within(tp, filter.max_tp)) continue;
    for (int cp : divisors) {
      if (!within(cp, filter.max_cp) || world % (std::int64_t{tp} * cp) != 0) continue;
      for (int pp : divisors) {
        if (!within(pp, filter.max_pp) || world % (std::int64_t{tp} * cp * pp) != 0) continue;
        for (int ep : divisors) {
          if (!within(ep, filter.max_ep) || world % (std::int64_t{ep} * pp) != 0) continue;
          for (int etp : divisors) {
            if (!within(etp, filter.max_etp) || world % (std::int64_t{etp} * ep * pp) != 0)
              continue;
            config.tp = tp;
            config.cp = cp;
            config.pp = pp;
            config.ep = ep;
            config.etp = etp;
            for (const std::string& order : orders) {
              config.order = order;
              if (check_config(config)) continue;
              ++count;
              visit(config);
            }
          }
        }
      }
    }
  }
  return count;
}

}  // namespace tally::topologies
