// Which elements each rank's optimizer owns: everything (plain, muon), contiguous ranges of the
// bucketed flat buffer (distributed), whole params dealt over data-parallel ranks (layer-wise).
// Over each data-parallel group, every element of every main copy is owned exactly once.
#include "gradnorm/ownership.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <map>

#include "tests/support/fault_cases.h"
#include "tests/support/model_gen.h"
#include "tests/support/show.h"
#include "topologies/sharding.h"

namespace tally::gradnorm {
namespace {

using topologies::Family;

struct Owned {
  std::vector<MainParam> main;
  Ownership ownership;
};

Owned own(vocab::OptimizerModel model, const topologies::LogicalModel& logical, const topologies::RankLayout& layout,
          int rank, std::int64_t bucket_elements = 0, const vocab::FaultSet& faults = {}) {
  Owned o;
  make_main_params(topologies::local_params(logical, layout, rank),
                   plan_optimizer(model, logical, faults), faults, o.main);
  own_elements(model, o.main, layout, rank, {bucket_elements}, faults, o.ownership);
  return o;
}

TEST(Ownership, NonDistributedOptimizersOwnEveryParamWhole) {
  const auto config = testing::config_of(4, 2, 1, 2, 1);
  const topologies::LogicalModel model(testing::small_moe(2), config);
  const topologies::RankLayout layout(config);
  for (vocab::OptimizerModel m : {vocab::OptimizerModel::plain, vocab::OptimizerModel::muon}) {
    const Owned o = own(m, model, layout, 1);
    ASSERT_EQ(o.ownership.pieces.size(), o.main.size());
    for (std::size_t i = 0; i < o.main.size(); ++i) {
      EXPECT_EQ(o.ownership.pieces[i].local_index, static_cast<int>(i));
      EXPECT_EQ(o.ownership.pieces[i].range, (kernels::ElementRange{0, o.main[i].attrs.slice.numel()}));
    }
    EXPECT_EQ(o.ownership.padding, 0);
  }
}

// How often each element of each (logical param, box) is owned by the members of `rank`'s
// data-parallel group, for one kind of buffer.
std::map<std::pair<int, std::int64_t>, int> owners_over_dp(vocab::OptimizerModel m, const topologies::LogicalModel& model,
                                                           const topologies::RankLayout& layout, int rank,
                                                           bool expert, std::int64_t bucket) {
  std::map<std::pair<int, std::int64_t>, int> times;
  const Family family = expert ? Family::expt_dp : Family::dp_cp;
  for (int member : layout.group_ranks(family, rank)) {
    const Owned o = own(m, model, layout, member, bucket);
    for (const OwnedPiece& piece : o.ownership.pieces) {
      const MainParam& p = o.main[static_cast<std::size_t>(piece.local_index)];
      if (p.expert_label != expert) continue;
      for (std::int64_t e = piece.range.begin; e < piece.range.end; ++e) ++times[{p.attrs.logical_id, e}];
    }
  }
  return times;
}

RC_GTEST_PROP(OwnershipProperty, DataParallelRanksOwnEveryElementExactlyOnce, ()) {
  const auto [config, spec] = *testing::valid_case(3);
  RC_PRE(config.dist_opt_instances == 1);
  // In Megatron's own corner (experts treated as dense while their ETP or EGTP groups are not the
  // TP or GTP groups) the dense data-parallel ranks hold different expert shards.
  RC_PRE(testing::megatron_assumptions_hold(config));
  const topologies::LogicalModel model(spec, config);
  const topologies::RankLayout layout(config);
  const vocab::OptimizerModel m = *rc::gen::element(vocab::OptimizerModel::distributed, vocab::OptimizerModel::layerwise);
  const std::int64_t bucket = *rc::gen::element<std::int64_t>(0, 7, 64);
  const int rank = *rc::gen::inRange(0, config.world);
  for (bool expert : {false, true}) {
    std::int64_t elements = 0;
    for (const MainParam& p : own(m, model, layout, rank, bucket).main)
      if (p.expert_label == expert) elements += p.attrs.slice.numel();
    const auto times = owners_over_dp(m, model, layout, rank, expert, bucket);
    RC_ASSERT(static_cast<std::int64_t>(times.size()) == elements);
    for (const auto& [element, count] : times) RC_ASSERT(count == 1);
  }
}

// megatron-core 0.16.1 and 0.19.2 (param_and_grad_buffer.py; optimizer/param_layout.py): a bucket
// ends at a multiple of lcm(D, 128) and is split into D equal ranges.
TEST(Ownership, DistributedBucketsArePaddedToLcmOfTheDataParallelSizeAnd128) {
  const auto config = testing::config_of(4, 1, 1, 1, 1);  // DP 4
  const topologies::LogicalModel model(testing::custom_model({testing::custom_param("w", topologies::ParamClass::replicated, {5})}), config);
  const topologies::RankLayout layout(config);
  // 5 elements in a bucket of 128: ranges of 32, rank 0 owns all 5 and 27 of padding.
  std::int64_t padding = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const Owned o = own(vocab::OptimizerModel::distributed, model, layout, rank);
    padding += o.ownership.padding;
    const std::int64_t owned = o.ownership.pieces.empty() ? 0 : o.ownership.pieces[0].range.end - o.ownership.pieces[0].range.begin;
    EXPECT_EQ(owned, rank == 0 ? 5 : 0) << "rank " << rank;
  }
  EXPECT_EQ(padding, 123);
}

// Each param starts at a multiple of 64 elements, the buffer holding the last param first.
TEST(Ownership, DistributedParamsStartAtMultiplesOf64) {
  const auto config = testing::config_of(2, 1, 1, 1, 1);  // DP 2
  const topologies::LogicalModel model(
      testing::custom_model({testing::custom_param("a", topologies::ParamClass::replicated, {100}),
                             testing::custom_param("b", topologies::ParamClass::replicated, {30})}),
      config);
  const topologies::RankLayout layout(config);
  // b at [0, 30), a at [64, 164), the bucket padded to 256: rank 0 owns [0, 128), rank 1 [128, 256).
  const Owned first = own(vocab::OptimizerModel::distributed, model, layout, 0);
  ASSERT_EQ(first.ownership.pieces.size(), 2u);
  EXPECT_EQ(first.ownership.pieces[0].range, (kernels::ElementRange{0, 64})) << "a's first 64";
  EXPECT_EQ(first.ownership.pieces[1].range, (kernels::ElementRange{0, 30})) << "all of b";
  EXPECT_EQ(first.ownership.padding, 128 - 94);
  const Owned second = own(vocab::OptimizerModel::distributed, model, layout, 1);
  ASSERT_EQ(second.ownership.pieces.size(), 1u);
  EXPECT_EQ(second.ownership.pieces[0].range, (kernels::ElementRange{64, 100}));
  // The overlapping-shards fault: rank 0's range also takes rank 1's first element, a's 65th.
  const Owned overlapping = own(vocab::OptimizerModel::distributed, model, layout, 0, 0,
                                vocab::FaultSet::of({vocab::Fault::distopt_overlapping_shards}));
  EXPECT_EQ(overlapping.ownership.pieces[0].range, (kernels::ElementRange{0, 65}));
}

// With PP > 1 the first stage's word embedding (and the last stage's copy) is a bucket of its
// own (_does_param_require_new_bucket), so the params after it in the buffer start a new one.
TEST(Ownership, TheSharedEmbeddingIsABucketOfItsOwn) {
  const auto config = testing::config_of(4, 1, 2, 1, 1);  // DP 2, PP 2
  const topologies::LogicalModel model(testing::dense_model(2), config);
  const topologies::RankLayout layout(config);
  ASSERT_NE(model.last_stage_copy(), topologies::SharedCopy::none) << "a tied embedding with PP 2";
  for (int rank = 0; rank < 4; ++rank) {
    const Owned o = own(vocab::OptimizerModel::distributed, model, layout, rank);
    // The bucket starts with the embedding (or its copy), padded to lcm(2, 128) and split in two:
    // DP rank i's piece of it starts at i times half the padded bucket.
    for (const OwnedPiece& piece : o.ownership.pieces) {
      const MainParam& p = o.main[static_cast<std::size_t>(piece.local_index)];
      if (!p.attrs.shared_embedding) continue;
      const std::int64_t numel = p.attrs.slice.numel();
      const std::int64_t half = (numel + 127) / 128 * 128 / 2;
      const int index = layout.index_in(topologies::Family::dp_cp, rank);
      EXPECT_EQ(piece.range.begin, std::min(numel, half * index)) << "rank " << rank << ": the bucket starts with it";
    }
  }
}

// As megatron-core's LayerWiseDistributedOptimizer deals them (_shard_params_ping_pong): its
// children's groups in order (Muon's 2-D weights, Adam's embeddings, Adam's 1-D params), sorted by
// size smallest first, along 0..n-1, n-1..0. Measured on 0.19.2: the same owner for every param of
// the sweep's layer-wise cases whose owners a miscount shows (bench/RESULTS.md).
TEST(Ownership, LayerWiseDealsWholeParamsSmallestFirstPingPongFromTheReleasesGroups) {
  const auto config = testing::config_of(2, 1, 1, 1, 1);  // DP 2
  using topologies::ParamClass;
  const auto owned_names = [&](const topologies::LogicalModel& model, int rank) {
    const topologies::RankLayout layout(config);
    std::vector<std::string> names;
    const Owned o = own(vocab::OptimizerModel::layerwise, model, layout, rank);
    for (const OwnedPiece& piece : o.ownership.pieces) {
      const MainParam& p = o.main[static_cast<std::size_t>(piece.local_index)];
      EXPECT_EQ(piece.range, (kernels::ElementRange{0, p.attrs.slice.numel()}));
      names.push_back(model.param(p.attrs.logical_id).name);
    }
    return names;
  };
  // Smallest first: a (1) -> rank 0, c (2) -> rank 1, b (3) -> rank 1 (largest first would give
  // b -> 0, c -> 1, a -> 1).
  const topologies::LogicalModel sizes(
      testing::custom_model({testing::custom_param("a", ParamClass::replicated, {1}),
                             testing::custom_param("b", ParamClass::replicated, {3}),
                             testing::custom_param("c", ParamClass::replicated, {2})}),
      config);
  EXPECT_EQ(owned_names(sizes, 0), (std::vector<std::string>{"a"}));
  EXPECT_EQ(owned_names(sizes, 1), (std::vector<std::string>{"b", "c"}));
  // Of equal sizes, the groups in order: Muon's 2-D weight w, Adam's embedding, Adam's 1-D norm:
  // w -> rank 0, emb -> rank 1, norm -> rank 1 (model order would give norm -> 0; the embedding
  // among Muon's, emb -> 0).
  const topologies::LogicalModel groups(
      testing::custom_model({testing::custom_param("norm", ParamClass::replicated, {2}),
                             testing::custom_param("emb", ParamClass::vocab, {2, 1}),
                             testing::custom_param("w", ParamClass::column, {1, 2})}),
      config);
  EXPECT_EQ(owned_names(groups, 0), (std::vector<std::string>{"w"}));
  EXPECT_EQ(owned_names(groups, 1), (std::vector<std::string>{"norm", "emb"}));
}

}  // namespace
}  // namespace tally::gradnorm
