#include "gradnorm/path.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "comm/sim_communicator.h"
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
               const PathOptions& options) {
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

// Megatron-LM #6099's regression test: only the expert FC2 bias gradients are 1, so the norm
// is sqrt(num_experts * hidden) = 4; de-duplicating on the dense TP rank drops EP rank 1's bias.
void check_founding_case(int world) {
  const ParallelConfig config = config_of(world, 2, 1, 2, 1);
  const topologies::ModelSpec spec = testing::founding_model();
  PathOptions options = testing::ones(OptimizerModel::layerwise);
  options.gradients.class_mask = class_bit(ParamClass::expert_row_bias);

  const PathResult right = run(config, spec, options);
  for (const RankResult& rank : right.ranks) EXPECT_EQ(rank.norm, 4.0) << "rank " << rank.rank;

  options.faults = FaultSet::of({Fault::expert_dedup_on_dense_tp});
  const PathResult wrong = run(config, spec, options);
  for (const RankResult& rank : wrong.ranks) EXPECT_EQ(rank.norm, std::sqrt(8.0));

  const RankLayout layout(config);
  const LogicalModel model(spec, config);
  const int bias = param_named(model, "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.bias");
  EXPECT_EQ((*wrong.ranks[0].ledger)[bias], 0);
  EXPECT_EQ((*right.ranks[0].ledger)[bias], 8);
  // EP rank 1 is dense-TP rank 1 and ETP rank 0: the fault's rule drops its bias there.
  for (int rank = 0; rank < world; ++rank) {
    if (layout.coordinates(rank).ep != 1) continue;
    const std::vector<ParamOnRank> why =
        explain_param(model, layout, options, wrong.plan, rank, bias);
    ASSERT_EQ(why.size(), 1u);
    if (layout.index_in(topologies::Family::tp, rank) == 1) {
      EXPECT_EQ(why[0].rule, Rule::dropped_not_first_of_tp);
      EXPECT_EQ(why[0].counted, 0);
    }
  }
}

TEST(FoundingRegression, LayerWiseExpertBiasNormAtWorld2) { check_founding_case(2); }
TEST(FoundingRegression, LayerWiseExpertBiasNormAtWorld8) { check_founding_case(8); }

// The logical-count invariant of reference section 5 for every optimizer model: all-ones
// gradients give sqrt(N) on every rank, all-zero gradients give N zeros, and every logical
// element is counted exactly once in the ledger.
RC_GTEST_PROP(PathProperty, AllOnesGivesSqrtNAndEveryElementOnce, ()) {
  const auto [config, spec] = *testing::valid_case(3);
  RC_PRE(testing::megatron_assumptions_hold(config));
  const LogicalModel model(spec, config);
  PathOptions options = testing::ones(*rc::gen::element(
      OptimizerModel::plain, OptimizerModel::distributed, OptimizerModel::layerwise,
      OptimizerModel::muon));
  options.bucket_elements = *rc::gen::element<std::int64_t>(0, 7, 64);
  const PathResult ones = run(config, spec, options);
  const double main_n = static_cast<double>(model.total_elements(topologies::GradNormGroup::main));
  const double mtp_n = static_cast<double>(model.total_elements(topologies::GradNormGroup::mtp));
  for (const RankResult& rank : ones.ranks) {
    for (const topologies::LogicalParam& p : model.params())
      if ((*rank.ledger)[p.id] != p.numel)
        RC_FAIL("rank " + std::to_string(rank.rank) + " counted " +
                std::to_string((*rank.ledger)[p.id]) + " of " + std::to_string(p.numel) +
                " elements of " + p.name);
    RC_ASSERT(rank.norm == std::sqrt(main_n));
    RC_ASSERT(rank.mtp_norm == std::sqrt(mtp_n));
    RC_ASSERT(rank.zeros == 0);
    RC_ASSERT(rank.inf_norm == (main_n > 0 ? 1.0 : 0.0));
  }
  options.gradients.generator.mode = kernels::GradientMode::zeros;
  const PathResult zeros = run(config, spec, options);
  for (const RankResult& rank : zeros.ranks) {
    RC_ASSERT(rank.zeros == model.total_elements());
    RC_ASSERT(rank.norm == 0.0);
  }
}

// Clipping with max = sqrt(N)/2: every rank applies the same coefficient.
TEST(Path, ClipCoefficientIsMaxOverNormPlusEpsilon) {
  const ParallelConfig config = config_of(8, 2, 2, 2, 1);
  topologies::ModelSpec spec = testing::small_moe(2);
  spec.num_layers = 2;
  const LogicalModel model(spec, config);
  const double n = std::sqrt(static_cast<double>(model.total_elements()));
  for (OptimizerModel optimizer : {OptimizerModel::plain, OptimizerModel::distributed,
                                   OptimizerModel::layerwise, OptimizerModel::muon}) {
    PathOptions options = testing::ones(optimizer);
    options.max_norm = n / 2;
    for (const RankResult& rank : run(config, spec, options).ranks) {
      EXPECT_EQ(rank.norm, n);
      EXPECT_EQ(rank.clip_coefficient, (n / 2) / (n + 1e-6));
      for (const ChildOutcome& child : rank.children) EXPECT_EQ(child.clip_coefficient, rank.clip_coefficient);
    }
  }
}

bool same_outcome(const PathResult& a, const PathResult& b) {
  for (std::size_t r = 0; r < a.ranks.size(); ++r) {
    const RankResult &x = a.ranks[r], &y = b.ranks[r];
    if (x.norm != y.norm || x.inf_norm != y.inf_norm || x.zeros != y.zeros ||
        x.mtp_norm != y.mtp_norm || *x.ledger != *y.ledger)
      return false;
    for (std::size_t c = 0; c < x.children.size(); ++c)
      if (x.children[c].clip_coefficient != y.children[c].clip_coefficient) return false;
  }
  return true;
}

// Every fault with a trigger changes the outcome of its named case (or hangs it).
TEST(Faults, EachChangesTheOutcomeOfItsCase) {
  for (const testing::FaultCase& c : testing::fault_cases()) {
    SCOPED_TRACE(std::string(fault_info(c.fault).name) + ": " + c.description);
    const PathResult right = run(c.config, c.model, c.options);
    PathOptions faulty = c.options;
    faulty.faults = FaultSet::of({c.fault});
    if (c.fault == Fault::empty_rank_skips_collective) {
      EXPECT_THROW(run(c.config, c.model, faulty), comm::InfraError);
      continue;
    }
    EXPECT_FALSE(same_outcome(right, run(c.config, c.model, faulty)));
  }
}

TEST(Faults, CatalogNamesRoundTrip) {
  for (const FaultInfo& info : fault_catalog()) {
    EXPECT_EQ(fault_from_name(info.name), info.fault);
    EXPECT_FALSE(info.provenance.empty());
    EXPECT_FALSE(info.wrong_rule.empty());
  }
  EXPECT_EQ(fault_from_name("no-such-fault"), std::nullopt);
  EXPECT_EQ(fault_list(FaultSet{}), "none");
  EXPECT_EQ(fault_list(FaultSet::of({Fault::no_dedup_filter, Fault::expert_dedup_on_dense_tp})),
            "expert-dedup-on-dense-tp,no-dedup-filter");
}

}  // namespace
}  // namespace tally::gradnorm
