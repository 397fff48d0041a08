#include "topologies/enumerate.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include "tests/support/configs.h"

namespace tally::topologies {
namespace {

TEST(FullOrders, AreTheHundredTwentyPermutationsDefaultFirst) {
  const std::vector<AxisOrder> orders = full_orders();
  EXPECT_EQ(orders.size(), 120u);
  EXPECT_EQ(order_string(orders.front()), kDefaultOrder);
  EXPECT_EQ(std::set<AxisOrder>(orders.begin(), orders.end()).size(), 120u);
}

// Brute force: every size from 1 to world on every axis, every full order, judged by
// check_config alone; enumerate must visit exactly the accepted ones, each once.
TEST(Enumerate, CountsMatchBruteForceForSmallWorlds) {
  const std::vector<AxisOrder> orders = full_orders();
  for (int world = 1; world <= 8; ++world) {
    std::set<std::tuple<int, int, int, int, int, std::string>> brute;
    for (int tp = 1; tp <= world; ++tp)
      for (int cp = 1; cp <= world; ++cp)
        for (int pp = 1; pp <= world; ++pp)
          for (int ep = 1; ep <= world; ++ep)
            for (int etp = 1; etp <= world; ++etp)
              for (const AxisOrder& order : orders) {
                const ParallelConfig c = testing::config(world, tp, cp, pp, ep, etp, 1, order_string(order));
                if (!check_config(c)) brute.emplace(tp, cp, pp, ep, etp, c.order);
              }
    std::set<std::tuple<int, int, int, int, int, std::string>> visited;
    const std::int64_t count = for_each_config(world, {}, [&](const ParallelConfig& c) {
      EXPECT_TRUE(visited.emplace(c.tp, c.cp, c.pp, c.ep, c.etp, c.order).second);
    });
    EXPECT_EQ(count, static_cast<std::int64_t>(brute.size())) << "world " << world;
    EXPECT_EQ(visited, brute) << "world " << world;
  }
}

TEST(Enumerate, WorldOneHasOneConfigurationPerOrder) {
  EXPECT_EQ(for_each_config(1, {}, [](const ParallelConfig&) {}), 120);
}

TEST(Enumerate, FiltersBoundEachAxisAndFixTheOrder) {
  EnumerateFilter filter;
  filter.max_tp = 2;
  filter.max_ep = 1;
  std::string error;
  filter.order = parse_order("tp-cp-ep-dp-pp", &error);
  std::int64_t count = for_each_config(8, filter, [](const ParallelConfig& c) {
    EXPECT_LE(c.tp, 2);
    EXPECT_EQ(c.ep, 1);
    EXPECT_EQ(c.order, "tp-cp-ep-dp-pp");
  });
  EXPECT_GT(count, 0);
  // Unfiltered, world 2 in the default order: tp, cp, pp each 1 or 2 with tp*cp*pp | 2, and
  // etp*ep*pp | 2: (tp,cp,pp) in {111, 211, 121, 112}; for pp 1: (ep,etp) in {11, 21, 12};
  // for pp 2: only (1,1). So 3 * 3 + 1 = 10.
  EnumerateFilter default_order;
  default_order.order = parse_order("tp-cp-ep-dp-pp", &error);
  EXPECT_EQ(for_each_config(2, default_order, [](const ParallelConfig&) {}), 10);
}

}  // namespace
}  // namespace tally::topologies
