// The main copies' attributes and the duplicate filter's rule on each rank, with the faults that
// change them.
#include "gradnorm/main_params.h"

#include <gtest/gtest.h>

#include "tests/support/fault_cases.h"
#include "topologies/sharding.h"

namespace tally::gradnorm {
namespace {

using topologies::ParamClass;

// The founding layout: world 2, TP 2, EP 2, ETP 1.
struct Founding {
  topologies::ParallelConfig config = testing::config_of(2, 2, 1, 2, 1);
  topologies::LogicalModel model{testing::founding_model(), config};
  topologies::RankLayout layout{config};

  std::vector<MainParam> main(int rank, const vocab::FaultSet& faults = {}) const {
    const OptimizerPlan plan = plan_optimizer(vocab::OptimizerModel::plain, model, faults);
    std::vector<MainParam> out;
    make_main_params(topologies::local_params(model, layout, rank), plan, faults, out);
    return out;
  }
};

const MainParam& of_class(const std::vector<MainParam>& main, ParamClass c) {
  for (const MainParam& p : main)
    if (p.attrs.param_class == c) return p;
  throw std::logic_error("no param of that class");
}

TEST(MainParams, TheModelsExpertLabelDecidesAllreduceAndTheChild) {
  const Founding f;
  for (const MainParam& p : f.main(0)) {
    const bool expert = topologies::is_expert_class(p.attrs.param_class);
    EXPECT_EQ(p.attrs.allreduce, !expert);
    EXPECT_EQ(p.expert_label, expert);
    EXPECT_EQ(p.child, expert ? 1 : 0);
    EXPECT_FALSE(p.dedup_on_dense_tp);
  }
}

TEST(MainParams, FilterKeepsShardsAndRank0OfTheReplicationGroup) {
  const Founding f;
  for (int rank : {0, 1}) {
    for (const MainParam& p : f.main(rank)) {
      const Rule rule = filter_rule(p, f.layout, rank, {});
      if (p.attrs.tensor_model_parallel) {
        EXPECT_EQ(rule, Rule::kept_tensor_parallel);
      } else if (!p.attrs.allreduce) {  // ETP 1: every expert bias is rank 0 of its ETP group
        EXPECT_EQ(rule, Rule::kept_first_of_etp);
      } else {
        EXPECT_EQ(rule, rank == 0 ? Rule::kept_first_of_tp : Rule::dropped_not_first_of_tp);
      }
      EXPECT_EQ(rule_keeps(rule), rule != Rule::dropped_not_first_of_tp);
    }
  }
}

TEST(MainParams, ExpertDedupOnDenseTpDropsTheExpertBiasOnTpRankOne) {
  const Founding f;
  const vocab::FaultSet faults = vocab::FaultSet::of({vocab::Fault::expert_dedup_on_dense_tp});
  EXPECT_FALSE(children_receive_expert_tp_group(faults));
  const MainParam& bias = of_class(f.main(1, faults), ParamClass::expert_row_bias);
  EXPECT_TRUE(bias.dedup_on_dense_tp);
  EXPECT_EQ(filter_rule(bias, f.layout, 1, faults), Rule::dropped_not_first_of_tp);
}

TEST(MainParams, AttributeFaultsChangeTheMainCopyOnly) {
  const Founding f;
  const MainParam& lost =
      of_class(f.main(0, vocab::FaultSet::of({vocab::Fault::allreduce_flag_lost_on_main_params})), ParamClass::expert_row_bias);
  EXPECT_TRUE(lost.attrs.allreduce);  // the main copy lost it...
  EXPECT_TRUE(lost.expert_label);     // ...the model's label still places it
  const MainParam& unmarked =
      of_class(f.main(0, vocab::FaultSet::of({vocab::Fault::expert_weights_not_tp_marked})), ParamClass::expert_column);
  EXPECT_FALSE(unmarked.attrs.tensor_model_parallel);
  EXPECT_TRUE(unmarked.dedup_on_dense_tp);
  EXPECT_FALSE(of_class(f.main(0, vocab::FaultSet::of({vocab::Fault::expert_weights_not_tp_marked})), ParamClass::expert_row_bias)
                   .dedup_on_dense_tp);  // TE marks nothing on biases: they keep the ETP group
  const MainParam& marked = of_class(f.main(0, vocab::FaultSet::of({vocab::Fault::replicated_marked_tp})), ParamClass::replicated);
  EXPECT_TRUE(marked.attrs.tensor_model_parallel);
  EXPECT_EQ(filter_rule(marked, f.layout, 1, vocab::FaultSet::of({vocab::Fault::replicated_marked_tp})), Rule::kept_tensor_parallel);
}

TEST(MainParams, NoFilterKeepsEveryCopyButShared) {
  const Founding f;
  const vocab::FaultSet faults = vocab::FaultSet::of({vocab::Fault::no_dedup_filter});
  for (const MainParam& p : f.main(1, faults))
    EXPECT_EQ(filter_rule(p, f.layout, 1, faults), Rule::kept_without_filter);
}

TEST(MainParams, TheTiedCopyIsSharedUnlessTheFaultDropsIt) {
  const topologies::ParallelConfig config = testing::config_of(2, 1, 2, 1, 1);
  const topologies::LogicalModel model(testing::dense_model(2), config);
  const topologies::RankLayout layout(config);
  for (bool with_fault : {false, true}) {
    const vocab::FaultSet faults = with_fault ? vocab::FaultSet::of({vocab::Fault::tied_copy_not_shared}) : vocab::FaultSet{};
    std::vector<MainParam> main;
    make_main_params(topologies::local_params(model, layout, 1),
                     plan_optimizer(vocab::OptimizerModel::plain, model, faults), faults, main);
    const MainParam& copy = main.back();
    ASSERT_NE(copy.attrs.copy, topologies::SharedCopy::none);
    EXPECT_EQ(copy.attrs.shared, !with_fault);
    EXPECT_EQ(filter_rule(copy, layout, 1, faults), with_fault ? Rule::kept_tensor_parallel : Rule::dropped_shared);
  }
}

}  // namespace
}  // namespace tally::gradnorm
