#include "topologies/rank_layout.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "tests/support/config_gen.h"
#include "tests/support/configs.h"

namespace tally::topologies {
namespace {

using Groups = std::vector<std::vector<int>>;

Groups groups_of(const RankLayout& layout, Family family) {
  Groups out;
  for (int g = 0; g < layout.group_count(family); ++g) {
    std::span<const int> ranks = layout.ranks({family, g});
    out.emplace_back(ranks.begin(), ranks.end());
  }
  return out;
}

Groups singletons(int world) {
  Groups out;
  for (int r = 0; r < world; ++r) out.push_back({r});
  return out;
}

// Worked example A of docs/megatron-reference.md §4: world 8, TP 2, EP 4, ETP 1.
TEST(RankLayout, WorkedExampleA) {
  const RankLayout layout(testing::config(8, 2, 1, 1, 4, 1));
  EXPECT_EQ(layout.dp(), 4);
  EXPECT_EQ(layout.edp(), 2);
  EXPECT_EQ(groups_of(layout, Family::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(groups_of(layout, Family::dp_cp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(groups_of(layout, Family::dp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(groups_of(layout, Family::cp), singletons(8));
  EXPECT_EQ(groups_of(layout, Family::pp), singletons(8));
  EXPECT_EQ(groups_of(layout, Family::tp_pp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(groups_of(layout, Family::tp_dp_cp), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(groups_of(layout, Family::expt_tp), singletons(8));
  EXPECT_EQ(groups_of(layout, Family::expt_ep), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(groups_of(layout, Family::expt_dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(groups_of(layout, Family::expt_tp_ep), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(groups_of(layout, Family::expt_tp_ep_pp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(groups_of(layout, Family::dist_opt), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  // Ranks 1 and 3 are dense-TP rank 1 but ETP rank 0, on EP ranks 1 and 3.
  for (int rank : {1, 3}) {
    EXPECT_EQ(layout.index_in(Family::tp, rank), 1);
    EXPECT_EQ(layout.index_in(Family::expt_tp, rank), 0);
    EXPECT_EQ(layout.coordinates(rank).ep, rank);
  }
}

// Worked example B (the #6099 regression topology): world 8, TP 2, EP 2, ETP 1.
TEST(RankLayout, WorkedExampleB) {
  const RankLayout layout(testing::config(8, 2, 1, 1, 2, 1));
  EXPECT_EQ(layout.dp(), 4);
  EXPECT_EQ(layout.edp(), 4);
  const Groups pairs = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  EXPECT_EQ(groups_of(layout, Family::tp), pairs);
  EXPECT_EQ(groups_of(layout, Family::expt_ep), pairs);
  EXPECT_EQ(groups_of(layout, Family::expt_dp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(groups_of(layout, Family::expt_tp), singletons(8));
  EXPECT_EQ(groups_of(layout, Family::expt_tp_ep_pp), groups_of(layout, Family::tp_pp));
  for (int rank = 0; rank < 8; ++rank) EXPECT_EQ(layout.index_in(Family::expt_tp, rank), 0);
}

// Worked example C (PP > 1): world 8, TP 2, PP 2, EP 2, ETP 1.
TEST(RankLayout, WorkedExampleC) {
  const RankLayout layout(testing::config(8, 2, 1, 2, 2, 1));
  EXPECT_EQ(layout.dp(), 2);
  EXPECT_EQ(layout.edp(), 2);
  const Groups stages = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  EXPECT_EQ(groups_of(layout, Family::pp), stages);
  EXPECT_EQ(groups_of(layout, Family::embedding), stages);
  EXPECT_EQ(groups_of(layout, Family::tp_pp), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(groups_of(layout, Family::dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(groups_of(layout, Family::expt_ep), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(groups_of(layout, Family::expt_dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(groups_of(layout, Family::expt_tp_ep_pp), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
}

TEST(RankLayout, OrderPpBeforeDpMatchesExampleB) {
  ParallelConfig c = testing::config(8, 2, 1, 1, 2, 1);
  const RankLayout reference(c);
  c.order = "tp-cp-ep-pp-dp";
  const RankLayout other(c);
  for (Family family : kAllFamilies)
    EXPECT_EQ(groups_of(other, family), groups_of(reference, family)) << family_name(family);
}

TEST(RankLayout, EmbeddingGroupsSkipMiddleStages) {
  const RankLayout layout(testing::config(4, 1, 1, 4, 1, 1));
  EXPECT_EQ(groups_of(layout, Family::embedding), (Groups{{0, 3}}));
  EXPECT_EQ(layout.group_of(Family::embedding, 1), std::nullopt);
  EXPECT_EQ(layout.index_in(Family::embedding, 1), -1);
  EXPECT_TRUE(layout.group_ranks(Family::embedding, 2).empty());
  EXPECT_EQ(layout.index_in(Family::embedding, 3), 1);
}

TEST(RankLayout, DistOptInstancesSplitTheWorld) {
  ParallelConfig c = testing::config(8, 2, 1, 1, 2, 1);
  c.dist_opt_instances = 2;
  const RankLayout layout(c);
  // Expert tp-ep-pp groups [0,1] [2,3] [4,5] [6,7], edp / k = 2 of them per instance.
  EXPECT_EQ(groups_of(layout, Family::dist_opt), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(RankLayout, InvalidConfigThrowsWithTheRule) {
  try {
    RankLayout layout(testing::config(12, 2, 1, 4, 1, 2));
    FAIL() << "expected InvalidConfig";
  } catch (const InvalidConfig& error) {
    EXPECT_STREQ(error.what(), "world 12 is not divisible by tp*cp*pp = 8");
  }
}

TEST(RankLayout, FamilyNamesRoundTrip) {
  for (Family family : kAllFamilies) EXPECT_EQ(family_from_name(family_name(family)), family);
  EXPECT_EQ(family_from_name("nope"), std::nullopt);
}

int expected_size(const ParallelConfig& c, Family family) {
  const int dp = topologies::dp(c), edp = topologies::edp(c);
  switch (family) {
    case Family::tp: return c.tp;
    case Family::cp: return c.cp;
    case Family::dp: return dp;
    case Family::dp_cp: return dp * c.cp;
    case Family::pp: return c.pp;
    case Family::tp_pp: return c.tp * c.gtp * c.pp;
    case Family::tp_cp: return c.tp * c.cp;
    case Family::tp_dp_cp: return c.tp * c.gtp * dp * c.cp;
    case Family::tp_dp: return c.tp * c.gtp * dp;
    case Family::expt_tp: return c.etp;
    case Family::expt_ep: return c.ep;
    case Family::expt_dp: return edp;
    case Family::expt_tp_ep: return c.etp * c.ep;
    case Family::expt_tp_ep_pp: return c.etp * c.ep * c.pp;
    case Family::embedding: return std::min(c.pp, 2);
    case Family::world: return c.world;
    case Family::dist_opt: return uses_gtp(c) ? c.world : c.world / c.dist_opt_instances;
    case Family::gtp: return c.gtp;
    case Family::gtp_dp: return c.gtp * dp;
    case Family::gtp_dp_cp: return c.gtp * dp * c.cp;
    case Family::expt_gtp: return c.egtp;
    case Family::expt_gtp_dp: return c.egtp * edp;
    case Family::expt_tp_ep_gtp_pp: return c.etp * c.ep * c.egtp * c.pp;
    case Family::expt_tp_pp: return c.etp * c.pp;
    case Family::expt_tp_gtp_pp: return c.etp * c.egtp * c.pp;
    case Family::expt_tp_dp_pp: return c.etp * c.egtp * edp * c.pp;
    case Family::expt_tp_dp: return c.etp * c.egtp * edp;
    case Family::tp_gtp: return c.tp * c.gtp;
    case Family::expt_tp_ep_gtp: return c.etp * c.ep * c.egtp;
    case Family::expt_tp_gtp: return c.etp * c.egtp;
    case Family::dist_opt_stage: return expected_size(c, Family::dist_opt) / c.pp;
    case Family::dist_opt_without_ep: return expected_size(c, Family::dist_opt) / c.ep;
    case Family::dist_opt_stage_without_ep: return expected_size(c, Family::dist_opt) / (c.pp * c.ep);
  }
  return -1;
}

RC_GTEST_PROP(RankLayoutProperty, EveryFamilyPartitionsTheWorldWithTheExpectedSizes, ()) {
  const ParallelConfig c = *testing::valid_config();
  const RankLayout layout(c);
  for (Family family : kAllFamilies) {
    if (family == Family::embedding) continue;
    std::vector<int> seen(c.world, 0);
    for (int g = 0; g < layout.group_count(family); ++g) {
      std::span<const int> ranks = layout.ranks({family, g});
      RC_ASSERT(static_cast<int>(ranks.size()) == expected_size(c, family));
      RC_ASSERT(std::is_sorted(ranks.begin(), ranks.end()));
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        ++seen[ranks[i]];
        RC_ASSERT(layout.group_of(family, ranks[i]) == std::optional(GroupId{family, g}));
        RC_ASSERT(layout.index_in(family, ranks[i]) == static_cast<int>(i));
      }
    }
    RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
}

RC_GTEST_PROP(RankLayoutProperty, EmbeddingGroupsAreTheEndsOfEachPipeline, ()) {
  const ParallelConfig c = *testing::valid_config();
  const RankLayout layout(c);
  RC_ASSERT(layout.group_count(Family::embedding) == layout.group_count(Family::pp));
  for (int g = 0; g < layout.group_count(Family::pp); ++g) {
    std::span<const int> stages = layout.ranks({Family::pp, g});
    std::vector<int> ends = {stages.front()};
    if (stages.size() > 1) ends.push_back(stages.back());
    std::span<const int> embedding = layout.ranks({Family::embedding, g});
    RC_ASSERT(std::vector<int>(embedding.begin(), embedding.end()) == ends);
  }
}

// Global rank = sum of coordinate * stride, strides the prefix products of the sizes in order.
RC_GTEST_PROP(RankLayoutProperty, CoordinatesReconstructTheGlobalRank, ()) {
  const ParallelConfig c = *testing::valid_config();
  const RankLayout layout(c);
  for (int rank = 0; rank < c.world; ++rank) {
    const Coordinates x = layout.coordinates(rank);
    const std::map<Axis, std::pair<int, int>> dense = {{Axis::tp, {x.tp, c.tp}},
                                                       {Axis::cp, {x.cp, c.cp}},
                                                       {Axis::ep, {0, 1}},
                                                       {Axis::dp, {x.dp, layout.dp()}},
                                                       {Axis::pp, {x.pp, c.pp}},
                                                       {Axis::gtp, {x.gtp, c.gtp}}};
    const std::map<Axis, std::pair<int, int>> expert = {{Axis::tp, {x.etp, c.etp}},
                                                        {Axis::cp, {0, 1}},
                                                        {Axis::ep, {x.ep, c.ep}},
                                                        {Axis::dp, {x.edp, layout.edp()}},
                                                        {Axis::pp, {x.pp, c.pp}},
                                                        {Axis::gtp, {x.egtp, c.egtp}}};
    for (const bool is_expert : {false, true}) {
      const auto& grid = is_expert ? expert : dense;
      int value = 0, stride = 1;
      for (Axis axis : grid_order(c, is_expert)) {
        const auto [coord, size] = grid.at(axis);
        RC_ASSERT(coord >= 0 && coord < size);
        value += coord * stride;
        stride *= size;
      }
      RC_ASSERT(value == rank);
    }
    RC_ASSERT(x.tp == layout.index_in(Family::tp, rank));
    RC_ASSERT(x.cp == layout.index_in(Family::cp, rank));
    RC_ASSERT(x.dp == layout.index_in(Family::dp, rank));
    RC_ASSERT(x.pp == layout.index_in(Family::pp, rank));
    RC_ASSERT(x.gtp == layout.index_in(Family::gtp, rank));
    RC_ASSERT(x.etp == layout.index_in(Family::expt_tp, rank));
    RC_ASSERT(x.ep == layout.index_in(Family::expt_ep, rank));
    RC_ASSERT(x.edp == layout.index_in(Family::expt_dp, rank));
    RC_ASSERT(x.egtp == layout.index_in(Family::expt_gtp, rank));
  }
}

// gtp_remat goes after tp in the dense grid and after ep in the expert grid; where the anchor
// is missing, after tp, and first where tp is missing too (_inject_gtp_remat_axis).
TEST(RankLayout, GtpIsInjectedAfterTpInTheDenseGridAndAfterEpInTheExpertGrid) {
  ParallelConfig c = testing::config(8, 2, 1, 1, 2, 1, 1, "tp-cp-ep-dp-pp");
  c.gtp = 2;
  EXPECT_EQ(grid_order(c, false),
            (GridOrder{Axis::tp, Axis::gtp, Axis::cp, Axis::ep, Axis::dp, Axis::pp}));
  EXPECT_EQ(grid_order(c, true),
            (GridOrder{Axis::tp, Axis::cp, Axis::ep, Axis::gtp, Axis::dp, Axis::pp}));
  c.order = "tp-dp";
  EXPECT_EQ(grid_order(c, true),
            (GridOrder{Axis::tp, Axis::gtp, Axis::dp, Axis::pp, Axis::ep, Axis::cp}));
  c.order = "dp-pp";
  EXPECT_EQ(grid_order(c, false),
            (GridOrder{Axis::gtp, Axis::dp, Axis::pp, Axis::tp, Axis::ep, Axis::cp}));
}

// World 8, tp 2, gtp 2: the GTP groups pair ranks two apart, DP is the replicate degree 2, and
// the model-parallel group spans GTP; with GTP the distributed-optimizer group is every rank.
TEST(RankLayout, GtpGroupsOfAWorkedExample) {
  ParallelConfig c = testing::config(8, 2, 1, 1, 1, 2);
  c.gtp = 2;
  const RankLayout layout(c);
  EXPECT_EQ(layout.dp(), 2);
  const std::span<const int> gtp = layout.ranks({Family::gtp, 0});
  EXPECT_EQ(std::vector<int>(gtp.begin(), gtp.end()), (std::vector<int>{0, 2}));
  const std::span<const int> mp = layout.ranks({Family::tp_pp, 0});
  EXPECT_EQ(std::vector<int>(mp.begin(), mp.end()), (std::vector<int>{0, 1, 2, 3}));
  const std::span<const int> dp = layout.ranks({Family::dp, 0});
  EXPECT_EQ(std::vector<int>(dp.begin(), dp.end()), (std::vector<int>{0, 4}));
  EXPECT_EQ(layout.group_count(Family::dist_opt), 1);
  EXPECT_EQ(layout.ranks({Family::dist_opt, 0}).size(), 8u);
}

std::set<int> intersect(const RankLayout& layout, int rank, std::initializer_list<Family> families) {
  std::set<int> common;
  bool first = true;
  for (Family family : families) {
    std::span<const int> ranks = layout.group_ranks(family, rank);
    std::set<int> these(ranks.begin(), ranks.end());
    if (first) {
      common = these;
      first = false;
      continue;
    }
    std::set<int> kept;
    std::set_intersection(common.begin(), common.end(), these.begin(), these.end(),
                          std::inserter(kept, kept.begin()));
    common = kept;
  }
  return common;
}

RC_GTEST_PROP(RankLayoutProperty, AxisGroupsIntersectInTheRankAlone, ()) {
  const ParallelConfig c = *testing::valid_config();
  const RankLayout layout(c);
  for (int rank = 0; rank < c.world; ++rank) {
    RC_ASSERT(intersect(layout, rank, {Family::tp, Family::cp, Family::dp, Family::pp,
                                       Family::gtp}) == std::set<int>{rank});
    RC_ASSERT(intersect(layout, rank, {Family::expt_tp, Family::expt_ep, Family::expt_dp,
                                       Family::pp, Family::expt_gtp}) == std::set<int>{rank});
  }
}

// Composite groups are unions of their axes: a rank's dp-cp group holds exactly the ranks that
// share its tp and pp coordinates, and so on.
RC_GTEST_PROP(RankLayoutProperty, CompositeGroupsShareTheComplementCoordinates, ()) {
  const ParallelConfig c = *testing::valid_config();
  const RankLayout layout(c);
  const int rank = *rc::gen::inRange(0, c.world);
  const Coordinates x = layout.coordinates(rank);
  auto members = [&](auto same) {
    std::vector<int> out;
    for (int r = 0; r < c.world; ++r)
      if (same(layout.coordinates(r))) out.push_back(r);
    return out;
  };
  auto ranks_of = [&](Family f) {
    std::span<const int> s = layout.group_ranks(f, rank);
    return std::vector<int>(s.begin(), s.end());
  };
  using C = const Coordinates&;
  RC_ASSERT(ranks_of(Family::dp_cp) ==
            members([&](C y) { return y.tp == x.tp && y.gtp == x.gtp && y.pp == x.pp; }));
  RC_ASSERT(ranks_of(Family::tp_pp) == members([&](C y) { return y.cp == x.cp && y.dp == x.dp; }));
  RC_ASSERT(ranks_of(Family::tp_cp) ==
            members([&](C y) { return y.dp == x.dp && y.gtp == x.gtp && y.pp == x.pp; }));
  RC_ASSERT(ranks_of(Family::tp_dp_cp) == members([&](C y) { return y.pp == x.pp; }));
  RC_ASSERT(ranks_of(Family::tp_dp) == members([&](C y) { return y.cp == x.cp && y.pp == x.pp; }));
  RC_ASSERT(ranks_of(Family::gtp_dp_cp) ==
            members([&](C y) { return y.tp == x.tp && y.pp == x.pp; }));
  RC_ASSERT(ranks_of(Family::tp_gtp) ==
            members([&](C y) { return y.cp == x.cp && y.dp == x.dp && y.pp == x.pp; }));
  RC_ASSERT(ranks_of(Family::expt_tp_ep) ==
            members([&](C y) { return y.edp == x.edp && y.egtp == x.egtp && y.pp == x.pp; }));
  RC_ASSERT(ranks_of(Family::expt_tp_ep_pp) ==
            members([&](C y) { return y.edp == x.edp && y.egtp == x.egtp; }));
  RC_ASSERT(ranks_of(Family::expt_tp_ep_gtp_pp) == members([&](C y) { return y.edp == x.edp; }));
  RC_ASSERT(ranks_of(Family::expt_tp_pp) ==
            members([&](C y) { return y.edp == x.edp && y.ep == x.ep && y.egtp == x.egtp; }));
  RC_ASSERT(ranks_of(Family::expt_tp_gtp_pp) ==
            members([&](C y) { return y.edp == x.edp && y.ep == x.ep; }));
  RC_ASSERT(ranks_of(Family::expt_tp_dp_pp) == members([&](C y) { return y.ep == x.ep; }));
  RC_ASSERT(ranks_of(Family::expt_tp_dp) ==
            members([&](C y) { return y.ep == x.ep && y.pp == x.pp; }));
  const std::span<const int> instance = layout.group_ranks(Family::dist_opt, rank);
  auto in_instance = [&](int r) { return std::find(instance.begin(), instance.end(), r) != instance.end(); };
  std::vector<int> stage, ep_rank, both;
  for (int r = 0; r < c.world; ++r) {
    if (!in_instance(r)) continue;
    const Coordinates y = layout.coordinates(r);
    if (y.pp == x.pp) stage.push_back(r);
    if (y.ep == x.ep) ep_rank.push_back(r);
    if (y.pp == x.pp && y.ep == x.ep) both.push_back(r);
  }
  RC_ASSERT(ranks_of(Family::dist_opt_stage) == stage);
  RC_ASSERT(ranks_of(Family::dist_opt_without_ep) == ep_rank);
  RC_ASSERT(ranks_of(Family::dist_opt_stage_without_ep) == both);
  RC_ASSERT(ranks_of(Family::expt_gtp_dp) ==
            members([&](C y) { return y.etp == x.etp && y.ep == x.ep && y.pp == x.pp; }));
}

}  // namespace
}  // namespace tally::topologies
