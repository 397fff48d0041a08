#include "gradnorm/path.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "comm/sim_communicator.h"
#include "kernels/clip_scale.h"
#include "oracle/ledger.h"
#include "tests/support/fault_cases.h"
#include "tests/support/model_gen.h"
#include "tests/support/show.h"

namespace tally::gradnorm {
namespace {

using testing::config_of;
using topologies::LogicalModel;
using topologies::ParallelConfig;
using topologies::ParamClass;
using topologies::RankLayout;

PathResult run(const ParallelConfig& config, const topologies::ModelSpec& spec,
               const vocab::PathOptions& options) {
  const RankLayout layout(config);
  const LogicalModel model(spec, config);
  comm::SimCommunicator communicator(layout);
  const std::vector<int> ranks = all_ranks(layout);
  return run_path(model, layout, options, communicator, ranks);
}

int param_named(const LogicalModel& model, const std::string& name) {
  for (const topologies::LogicalParam& p : model.params())
    if (p.name == name) return p.id;
  ADD_FAILURE() << "no param " << name;
  return -1;
}

// The piece of logical param `id` that `rank` owns (the first), or null.
const record::Piece* piece_of(const PathResult& result, int rank, int id) {
  const record::LocalRecord& local = *result.record.ranks[static_cast<std::size_t>(rank)].local;
  for (const record::Piece& piece : local.pieces)
    if (local.params[static_cast<std::size_t>(piece.param)].tensor == id) return &piece;
  return nullptr;
}

// Megatron-LM #6099's regression test: only the expert FC2 bias gradients are 1, so the norm
// is sqrt(num_experts * hidden) = 4; de-duplicating on the dense TP rank drops EP rank 1's bias.
void check_founding_case(int world) {
  const ParallelConfig config = config_of(world, 2, 1, 2, 1);
  const topologies::ModelSpec spec = testing::founding_model();
  vocab::PathOptions options = testing::ones(vocab::OptimizerModel::layerwise);
  options.gradients.class_mask = vocab::class_bit(ParamClass::expert_row_bias);

  const PathResult right = run(config, spec, options);
  for (const record::RankRecord& rank : right.record.ranks)
    EXPECT_EQ(rank.reported.norm, 4.0) << "rank " << rank.rank;
  EXPECT_TRUE(oracle::count_ledgers(right.record).wrong.empty());

  options.faults = vocab::FaultSet::of({vocab::Fault::expert_dedup_on_dense_tp});
  const PathResult wrong = run(config, spec, options);
  for (const record::RankRecord& rank : wrong.record.ranks) EXPECT_EQ(rank.reported.norm, std::sqrt(8.0));

  const RankLayout layout(config);
  const LogicalModel model(spec, config);
  const int bias = param_named(model, "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.bias");
  const oracle::LedgerResult ledger = oracle::count_ledgers(wrong.record);
  ASSERT_EQ(ledger.wrong.size(), 1u);
  EXPECT_EQ(ledger.wrong[0].tensor, bias);
  EXPECT_EQ(ledger.wrong[0].counted, 0);
  // EP rank 1 is dense-TP rank 1 and ETP rank 0: the fault's rule drops its bias there, and the
  // record says the filter de-duplicated it on the TP group for want of an expert TP group.
  for (int rank = 0; rank < world; ++rank) {
    if (layout.coordinates(rank).ep != 1) continue;
    const record::Piece* piece = piece_of(wrong, rank, bias);
    if (!piece) continue;  // layer-wise: another data-parallel rank owns it
    EXPECT_EQ(piece->rule.basis, record::Basis::replicated);
    EXPECT_EQ(piece->rule.dedup, record::DedupGroup::tp);
    EXPECT_EQ(wrong.record.ranks[static_cast<std::size_t>(rank)].children[piece->child].expert_tp_group, -1);
    const bool dropped = layout.index_in(topologies::Family::tp, rank) == 1;
    EXPECT_EQ(piece->counted_in, dropped ? -1 : 0);
    EXPECT_EQ(piece->in_zero_count, !dropped);
    const record::Piece* without = piece_of(right, rank, bias);
    ASSERT_NE(without, nullptr);
    EXPECT_EQ(without->rule.dedup, record::DedupGroup::expert_tp);
    EXPECT_EQ(without->counted_in, 0);
  }
}

TEST(FoundingRegression, LayerWiseExpertBiasNormAtWorld2) { check_founding_case(2); }
TEST(FoundingRegression, LayerWiseExpertBiasNormAtWorld8) { check_founding_case(8); }

// The logical-count invariant of docs/megatron-reference.md for every optimizer model: all-ones
// gradients give sqrt(N) on every rank, all-zero gradients give N zeros, and the decisions the
// path records count every logical element exactly once.
RC_GTEST_PROP(PathProperty, AllOnesGivesSqrtNAndEveryElementOnce, ()) {
  const auto [config, spec] = *testing::valid_case(3);
  RC_PRE(testing::megatron_assumptions_hold(config));
  const LogicalModel model(spec, config);
  vocab::PathOptions options = testing::ones(*rc::gen::element(
      vocab::OptimizerModel::plain, vocab::OptimizerModel::distributed, vocab::OptimizerModel::layerwise,
      vocab::OptimizerModel::muon));
  options.bucket_elements = *rc::gen::element<std::int64_t>(0, 7, 64);
  const PathResult ones = run(config, spec, options);
  const double main_n = static_cast<double>(model.total_elements(topologies::GradNormGroup::main));
  const double mtp_n = static_cast<double>(model.total_elements(topologies::GradNormGroup::mtp));
  for (const oracle::WrongCount& wrong : oracle::count_ledgers(ones.record).wrong)
    RC_FAIL("rank " + std::to_string(wrong.ranks.front()) + " counted " + std::to_string(wrong.counted) +
            " elements of " + model.param(wrong.tensor).name + " in ledger " + std::to_string(wrong.ledger));
  for (const record::RankRecord& rank : ones.record.ranks) {
    const record::Reported& r = rank.reported;
    RC_ASSERT(*r.norm == std::sqrt(main_n));
    RC_ASSERT((r.group_norms.empty() ? 0.0 : r.group_norms[0].norm) == std::sqrt(mtp_n));
    RC_ASSERT(*r.zeros == 0);
    RC_ASSERT(*r.inf_norm == (main_n > 0 ? 1.0 : 0.0));
  }
  options.gradients.generator.mode = kernels::GradientMode::zeros;
  const PathResult zeros = run(config, spec, options);
  for (const record::RankRecord& rank : zeros.record.ranks) {
    RC_ASSERT(*rank.reported.zeros == model.total_elements());
    RC_ASSERT(*rank.reported.norm == 0.0);
  }
}

// Clipping with max = sqrt(N)/2: every rank and child applies the same coefficient, and the
// clipped gradients it records are the clip kernel's products with it.
TEST(Path, ClipCoefficientIsMaxOverNormPlusEpsilon) {
  const ParallelConfig config = config_of(8, 2, 2, 2, 1);
  topologies::ModelSpec spec = testing::small_moe(2);
  spec.num_layers = 2;
  const LogicalModel model(spec, config);
  const double n = std::sqrt(static_cast<double>(model.total_elements()));
  for (vocab::OptimizerModel optimizer : {vocab::OptimizerModel::plain, vocab::OptimizerModel::distributed,
                                   vocab::OptimizerModel::layerwise, vocab::OptimizerModel::muon}) {
    vocab::PathOptions options = testing::ones(optimizer);
    options.max_norm = n / 2;
    const double coefficient = (n / 2) / (n + 1e-6);
    for (const record::RankRecord& rank : run(config, spec, options).record.ranks) {
      EXPECT_EQ(rank.reported.norm, n);
      EXPECT_EQ(rank.reported.clip_coefficient, coefficient);
      for (const record::ChildRecord& child : rank.children) EXPECT_EQ(child.clip->coefficient, coefficient);
      ASSERT_NE(rank.clipped, nullptr);
      ASSERT_EQ(rank.clipped->size(), rank.local->params.size());
      for (const record::ClippedParam& clipped : *rank.clipped) {
        EXPECT_EQ(clipped.coefficient, coefficient);
        for (float v : clipped.values()) ASSERT_EQ(v, kernels::apply_clip(1.0f, static_cast<float>(coefficient)));
      }
    }
  }
}

// With PP 1 each stage is the whole instance and with EP 1 no EP axis is left out, so the clip
// faults change nothing, even with two distributed-optimizer instances (whose groups would sum
// both instances if the stage's group spanned them).
TEST(Path, ClipFaultsWithoutTheirAxisChangeNothingUnderSeveralInstances) {
  ParallelConfig config = config_of(4, 1, 1, 1, 1);
  config.dist_opt_instances = 2;
  vocab::PathOptions options = testing::ones(vocab::OptimizerModel::distributed);
  options.max_norm = 1.0;
  const PathResult right = run(config, testing::small_moe(2), options);
  for (vocab::Fault fault : {vocab::Fault::clip_per_stage_norm, vocab::Fault::clip_per_ep_group_norm}) {
    options.faults = vocab::FaultSet::of({fault});
    const PathResult faulty = run(config, testing::small_moe(2), options);
    for (std::size_t r = 0; r < faulty.record.ranks.size(); ++r)
      EXPECT_EQ(faulty.record.ranks[r].reported.clip_coefficient,
                right.record.ranks[r].reported.clip_coefficient)
          << vocab::fault_info(fault).name << ", rank " << r;
  }
}

TEST(Path, WithoutClippingNoClippedGradientsAreRecorded) {
  vocab::PathOptions options = testing::ones(vocab::OptimizerModel::plain);
  options.max_norm = 0.0;
  for (const record::RankRecord& rank : run(config_of(2, 2, 1, 2, 1), testing::founding_model(), options).record.ranks)
    EXPECT_EQ(rank.clipped, nullptr);
}

TEST(Path, DataParallelReplicasShareOneLocalRecord) {
  const ParallelConfig config = config_of(8, 2, 1, 2, 1);  // DP 4, EDP 4
  const PathResult result = run(config, testing::founding_model(), testing::ones(vocab::OptimizerModel::plain));
  const RankLayout layout(config);
  // A rank holds and decides by its TP index and its EP coordinate only.
  std::map<std::pair<int, int>, const record::LocalRecord*> by_position;
  for (const record::RankRecord& rank : result.record.ranks) {
    const std::pair<int, int> position{layout.index_in(topologies::Family::tp, rank.rank),
                                       layout.coordinates(rank.rank).ep};
    auto [it, fresh] = by_position.try_emplace(position, rank.local.get());
    EXPECT_EQ(it->second, rank.local.get()) << "rank " << rank.rank;
  }
  EXPECT_EQ(by_position.size(), 2u);  // here the EP coordinate is the TP index: 8 ranks, 2 records
}

// A distributed optimizer gives each data-parallel replica its own pieces of the same params:
// records differ, but the params list and the clipped gradients are held once (a world of 10^6
// ranks would otherwise hold 10^6 copies of them).
TEST(Path, DistributedOptimizerReplicasShareParamsAndClippedValues) {
  const ParallelConfig config = config_of(8, 2, 1, 1, 1);  // TP 2, DP 4
  vocab::PathOptions options = testing::ones(vocab::OptimizerModel::distributed);
  options.max_norm = 1e-3;  // clips, so clipped values are recorded
  const PathResult result = run(config, testing::founding_model(), options);
  const RankLayout layout(config);
  std::map<int, const record::RankRecord*> first_of_tp_index;
  std::set<const record::LocalRecord*> records;
  for (const record::RankRecord& rank : result.record.ranks) {
    records.insert(rank.local.get());
    auto [it, fresh] = first_of_tp_index.try_emplace(layout.index_in(topologies::Family::tp, rank.rank), &rank);
    if (fresh) continue;
    EXPECT_EQ(it->second->local->params.identity(), rank.local->params.identity()) << "rank " << rank.rank;
    ASSERT_NE(rank.clipped, nullptr);
    EXPECT_EQ(it->second->clipped.get(), rank.clipped.get()) << "rank " << rank.rank;
  }
  EXPECT_EQ(first_of_tp_index.size(), 2u);
  EXPECT_EQ(records.size(), 8u);  // every replica owns different pieces
}

// Whether two runs reported and decided the same.
bool same_outcome(const PathResult& a, const PathResult& b) {
  for (std::size_t r = 0; r < a.record.ranks.size(); ++r) {
    const record::RankRecord &x = a.record.ranks[r], &y = b.record.ranks[r];
    if (!(x.reported == y.reported) || !(*x.local == *y.local) || !(x.children == y.children))
      return false;
    if (a.record.groups[static_cast<std::size_t>(x.children[0].stats_group)] !=
        b.record.groups[static_cast<std::size_t>(y.children[0].stats_group)])
      return false;
  }
  return true;
}

// Every fault with a trigger changes the outcome of its named case (or hangs it).
TEST(Faults, EachChangesTheOutcomeOfItsCase) {
  for (const testing::FaultCase& c : testing::fault_cases()) {
    SCOPED_TRACE(std::string(vocab::fault_info(c.fault).name) + ": " + c.description);
    const PathResult right = run(c.config, c.model, c.options);
    vocab::PathOptions faulty = c.options;
    faulty.faults = vocab::FaultSet::of({c.fault});
    if (c.fault == vocab::Fault::empty_rank_skips_collective) {
      EXPECT_THROW(run(c.config, c.model, faulty), comm::InfraError);
      continue;
    }
    EXPECT_FALSE(same_outcome(right, run(c.config, c.model, faulty)));
  }
}

TEST(Faults, CatalogNamesRoundTrip) {
  for (const vocab::FaultInfo& info : vocab::fault_catalog()) {
    EXPECT_EQ(vocab::fault_from_name(info.name), info.fault);
    EXPECT_FALSE(info.provenance.empty());
    EXPECT_FALSE(info.wrong_rule.empty());
  }
  EXPECT_EQ(vocab::fault_from_name("no-such-fault"), std::nullopt);
  EXPECT_EQ(vocab::fault_list(vocab::FaultSet{}), "none");
  EXPECT_EQ(vocab::fault_list(vocab::FaultSet::of({vocab::Fault::no_dedup_filter, vocab::Fault::expert_dedup_on_dense_tp})),
            "expert-dedup-on-dense-tp,no-dedup-filter");
}

}  // namespace
}  // namespace tally::gradnorm
