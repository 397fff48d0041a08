// The optimizer plans: which children a model's params go to, the expert label, each child's
// stats group family, and when the children reduce together.
#include "gradnorm/optimizer_model.h"

#include <gtest/gtest.h>

#include "tests/support/fault_cases.h"

namespace tally::gradnorm {
namespace {

using topologies::Family;
using topologies::LogicalModel;

OptimizerPlan plan_for(vocab::OptimizerModel model, const topologies::ParallelConfig& config,
                       const topologies::ModelSpec& spec, const vocab::FaultSet& faults = {}) {
  return plan_optimizer(model, LogicalModel(spec, config), faults);
}

std::vector<ChildRole> roles(const OptimizerPlan& plan) {
  std::vector<ChildRole> out;
  for (const Child& c : plan.children) out.push_back(c.role);
  return out;
}

TEST(OptimizerModel, NamesRoundTrip) {
  for (const vocab::OptimizerModelInfo& info : vocab::optimizer_models()) {
    EXPECT_EQ(vocab::optimizer_model_from_name(info.name), info.model);
    EXPECT_EQ(vocab::optimizer_model_name(info.model), info.name);
    EXPECT_FALSE(info.description.empty());
  }
  EXPECT_EQ(vocab::optimizer_model_from_name("adam"), std::nullopt);
}

TEST(OptimizerModel, PlainChainsADenseAndAnExpertChildOverTheirModelParallelGroups) {
  const OptimizerPlan plan = plan_for(vocab::OptimizerModel::plain, testing::config_of(4, 2, 1, 2, 1), testing::small_moe(2));
  EXPECT_EQ(roles(plan), (std::vector<ChildRole>{ChildRole::dense, ChildRole::expert}));
  EXPECT_EQ(plan.children[0].stats_family, Family::tp_pp);
  EXPECT_EQ(plan.children[1].stats_family, Family::expt_tp_ep_pp);
  EXPECT_TRUE(plan.children[1].expert);
  EXPECT_FALSE(plan.shared_stats);  // the plain chain's groups are distinct objects
  EXPECT_EQ(child_name(plan, 1), "plain.chained_optimizers[1] (expert)");
}

TEST(OptimizerModel, ExpertsAreLabelledExpertTopologyOnlyWhenEpOrEtpDiffers) {
  topologies::ModelSpec spec = testing::small_moe(2);
  spec.add_bias_linear = false;  // expert biases need ETP 1
  const LogicalModel dense_like(spec, testing::config_of(2, 2, 1, 1, 2));  // EP 1, ETP = TP
  const OptimizerPlan same = plan_optimizer(vocab::OptimizerModel::plain, dense_like, {});
  for (const topologies::LogicalParam& p : dense_like.params()) EXPECT_FALSE(same.expert_label[p.id]) << p.name;
  EXPECT_EQ(same.children.size(), 1u);  // experts are dense: one child

  const LogicalModel expert(spec, testing::config_of(2, 2, 1, 2, 1));
  const OptimizerPlan labelled = plan_optimizer(vocab::OptimizerModel::plain, expert, {});
  for (const topologies::LogicalParam& p : expert.params())
    EXPECT_EQ(labelled.expert_label[p.id], topologies::is_expert_class(p.param_class)) << p.name;
  for (const topologies::LogicalParam& p : expert.params())
    EXPECT_EQ(labelled.child_of_param[p.id], labelled.expert_label[p.id] ? 1 : 0) << p.name;

  // #5916's uncommon case: the label derived from EP alone misses ETP != TP at EP 1.
  const LogicalModel etp_only(spec, testing::config_of(2, 2, 1, 1, 1));
  const OptimizerPlan right = plan_optimizer(vocab::OptimizerModel::plain, etp_only, {});
  const OptimizerPlan wrong =
      plan_optimizer(vocab::OptimizerModel::plain, etp_only, vocab::FaultSet::of({vocab::Fault::expert_label_from_ep_only}));
  EXPECT_EQ(right.children.size(), 2u);
  EXPECT_EQ(wrong.children.size(), 1u);
}

TEST(OptimizerModel, DistributedReducesOverTheInstanceAndLayerWiseOverTheWorld) {
  const auto config = testing::config_of(4, 2, 1, 2, 1);
  const OptimizerPlan distributed = plan_for(vocab::OptimizerModel::distributed, config, testing::small_moe(2));
  for (const Child& c : distributed.children) EXPECT_EQ(c.stats_family, Family::dist_opt);
  EXPECT_TRUE(distributed.shared_stats);
  const OptimizerPlan layerwise = plan_for(vocab::OptimizerModel::layerwise, config, testing::small_moe(2));
  EXPECT_EQ(roles(layerwise), (std::vector<ChildRole>{ChildRole::layer_wise}));
  EXPECT_EQ(layerwise.children[0].stats_family, Family::world);
}

TEST(OptimizerModel, MuonSplitsLinearWeightsFromTheRest) {
  const OptimizerPlan plan = plan_for(vocab::OptimizerModel::muon, testing::config_of(4, 2, 1, 2, 1), testing::small_moe(2));
  EXPECT_EQ(roles(plan), (std::vector<ChildRole>{ChildRole::dense, ChildRole::dense_muon,
                                                 ChildRole::expert, ChildRole::expert_muon}));
  EXPECT_EQ(plan.children[3].stats_family, Family::expt_tp_ep_pp);
  // #3024: the expert linear weights in the dense Muon child, reduced over its group.
  const OptimizerPlan wrong = plan_for(vocab::OptimizerModel::muon, testing::config_of(4, 2, 1, 2, 1),
                                       testing::small_moe(2), vocab::FaultSet::of({vocab::Fault::expert_stats_over_dense_mp}));
  EXPECT_EQ(roles(wrong), (std::vector<ChildRole>{ChildRole::dense, ChildRole::dense_muon, ChildRole::expert}));
}

TEST(OptimizerModel, FaultsMoveTheStatsGroups) {
  const auto config = testing::config_of(8, 2, 2, 2, 1);
  topologies::ModelSpec spec = testing::small_moe(2);
  spec.num_layers = 2;
  EXPECT_EQ(plan_for(vocab::OptimizerModel::plain, config, spec, vocab::FaultSet::of({vocab::Fault::missing_pp_reduction})).children[0].stats_family,
            Family::tp);
  EXPECT_EQ(plan_for(vocab::OptimizerModel::plain, config, spec, vocab::FaultSet::of({vocab::Fault::missing_ep_reduction})).children[1].stats_family,
            Family::expt_tp_pp);
  EXPECT_EQ(plan_for(vocab::OptimizerModel::plain, config, spec, vocab::FaultSet::of({vocab::Fault::stats_over_replicas})).children[0].stats_family,
            Family::world);
  // #785: the expert child over TP x PP, clipping alone.
  const OptimizerPlan per_child = plan_for(vocab::OptimizerModel::distributed, config, spec, vocab::FaultSet::of({vocab::Fault::clip_per_child_norm}));
  EXPECT_FALSE(per_child.shared_stats);
}

// The clip faults compose: each stage without its EP axis, within the instance.
TEST(OptimizerModel, BothClipFaultsClipOverOneStageWithoutEp) {
  const auto config = testing::config_of(8, 1, 2, 2, 1);
  topologies::ModelSpec spec = testing::small_moe(2);
  spec.num_layers = 2;
  const vocab::FaultSet both = vocab::FaultSet::of({vocab::Fault::clip_per_stage_norm, vocab::Fault::clip_per_ep_group_norm});
  EXPECT_EQ(plan_for(vocab::OptimizerModel::distributed, config, spec, both).children[0].clip_family,
            Family::dist_opt_stage_without_ep);
  EXPECT_EQ(plan_for(vocab::OptimizerModel::plain, config, spec, both).children[1].clip_family, Family::expt_tp);
  // With EGTP, leaving out EP keeps the EGTP axis the stats group spans.
  const auto egtp = testing::with_gtp(testing::config_of(8, 1, 1, 2, 1), 1, 2);
  EXPECT_EQ(plan_for(vocab::OptimizerModel::plain, egtp, testing::small_moe(2),
                     vocab::FaultSet::of({vocab::Fault::clip_per_ep_group_norm}))
                .children[1]
                .clip_family,
            Family::expt_tp_gtp_pp);
}

TEST(OptimizerModel, AModelWithMtpParamsHasAnMtpNorm) {
  topologies::ModelSpec spec = testing::dense_model(1);
  EXPECT_FALSE(plan_for(vocab::OptimizerModel::plain, testing::config_of(1, 1, 1, 1, 1), spec).has_mtp);
  spec.mtp_num_layers = 1;
  spec.mtp_detach_heads = true;
  EXPECT_TRUE(plan_for(vocab::OptimizerModel::plain, testing::config_of(1, 1, 1, 1, 1), spec).has_mtp);
}

}  // namespace
}  // namespace tally::gradnorm
