// Every valid parallel configuration of a world, in a fixed order, with filters.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "topologies/parallel_config.h"

namespace tally::topologies {

struct EnumerateFilter {
  int max_tp = 0;  // 0: no limit
  int max_cp = 0;
  int max_pp = 0;
  int max_ep = 0;
  int max_etp = 0;
  std::optional<AxisOrder> order;  // only this order; otherwise every full order
};

// The 120 orders that name all five axes, the default order first, then lexicographic.
// Orders that omit axes are equivalent to one of these (omitted axes have size 1).
std::vector<AxisOrder> full_orders();

// Calls `visit` for each valid configuration of `world` ranks (vpp 1, one distributed-optimizer
// instance), iterating tp, cp, pp, ep, etp over the divisors of world, then the orders.
// Returns the number visited.
std::int64_t for_each_config(int world, const EnumerateFilter& filter,
                             const std::function<void(const ParallelConfig&)>& visit);

}  // namespace tally::topologies
