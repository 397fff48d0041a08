#include "gradnorm/reduction.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "comm/sim_communicator.h"
#include "gradnorm/path.h"
#include "tests/support/configs.h"
#include "tests/support/fault_cases.h"
#include "vocab/gradients.h"

namespace tally::gradnorm {
namespace {

using testing::config_of;
using topologies::Family;
using topologies::LogicalModel;
using topologies::ParallelConfig;
using topologies::RankLayout;
using vocab::Fault;

struct Reduced {
  ReducedGradients gradients;
  std::vector<kernels::GeneratorSpec> generators;
};

Reduced reduce(const ParallelConfig& config, const topologies::ModelSpec& spec, const vocab::PathOptions& options) {
  const RankLayout layout(config);
  const LogicalModel model(spec, config);
  comm::SimCommunicator communicator(layout);
  Reduced out;
  out.generators = vocab::param_generators(options.gradients, model);
  out.gradients = reduce_gradients(model, layout, options, out.generators, communicator, all_ranks(layout));
  return out;
}

vocab::PathOptions unreduced(kernels::GradientMode mode = kernels::GradientMode::dyadic) {
  vocab::PathOptions o;
  o.gradients.generator.mode = mode;
  o.gradients.before_reduction = true;
  return o;
}

const topologies::LogicalParam& param_named(const LogicalModel& model, const std::string& part) {
  for (const topologies::LogicalParam& p : model.params())
    if (p.name.find(part) != std::string::npos) return p;
  throw std::logic_error("no param " + part);
}

TEST(Reduction, StepsAreMegatronsGroups) {
  topologies::ModelSpec spec = testing::small_moe(2);
  spec.qk_layernorm = true;
  spec.add_bias_linear = false;
  spec.num_layers = 2;
  const ParallelConfig config = config_of(8, 2, 2, 2, 1);
  const LogicalModel model(spec, config);
  EXPECT_EQ(reduction_steps(param_named(model, "linear_qkv.weight"), config), std::vector<Family>{Family::dp_cp});
  EXPECT_EQ(reduction_steps(param_named(model, "local_experts.0.linear_fc1"), config),
            std::vector<Family>{Family::expt_dp});
  EXPECT_EQ(reduction_steps(param_named(model, "word_embeddings"), config),
            (std::vector<Family>{Family::dp_cp, Family::embedding}));
  EXPECT_EQ(reduction_steps(param_named(model, "q_layernorm"), config), (std::vector<Family>{Family::dp_cp, Family::tp}));
  // The faults skip or repeat the step after DP.
  EXPECT_EQ(reduction_steps(param_named(model, "word_embeddings"), config, vocab::FaultSet::of({Fault::tied_embedding_not_synced})),
            std::vector<Family>{Family::dp_cp});
  EXPECT_EQ(reduction_steps(param_named(model, "k_layernorm"), config,
                            vocab::FaultSet::of({Fault::tp_replicated_grads_summed_twice})),
            (std::vector<Family>{Family::dp_cp, Family::tp, Family::tp}));
  // Experts of the dense grid (EP 1, ETP = TP) live in the dense buffers: DP x CP.
  const ParallelConfig dense_grid = config_of(4, 2, 1, 1, 2);
  EXPECT_EQ(reduction_steps(param_named(LogicalModel(spec, dense_grid), "local_experts.0.linear_fc1"), dense_grid),
            std::vector<Family>{Family::dp_cp});
}

TEST(Reduction, RefusesWhatItCannotDealExactly) {
  EXPECT_FALSE(reduction_refusal(config_of(8, 2, 2, 2, 1)));
  const std::optional<std::string> three = reduction_refusal(config_of(6, 2, 1, 1, 2));
  ASSERT_TRUE(three);
  EXPECT_NE(three->find("DP x CP 3"), std::string::npos) << *three;
  EXPECT_TRUE(reduction_refusal(testing::with_gtp(config_of(4, 1, 1, 1, 1), 2, 2)));
}

// Without a fault, every rank holds exactly the case's gradient, in every gradient mode and dtype.
TEST(Reduction, RightReductionGivesTheCaseBack) {
  topologies::ModelSpec spec = testing::small_moe(4);
  spec.qk_layernorm = true;
  spec.num_layers = 2;
  for (const ParallelConfig& config : {config_of(8, 2, 2, 2, 1), config_of(8, 1, 1, 4, 1), config_of(16, 2, 2, 2, 2),
                                       testing::config(8, 1, 2, 2, 1, 1, 1)}) {
    for (kernels::GradientMode mode : {kernels::GradientMode::dyadic, kernels::GradientMode::normal,
                                       kernels::GradientMode::zeros, kernels::GradientMode::sparse}) {
      for (kernels::Dtype dtype : {kernels::Dtype::fp32, kernels::Dtype::bf16, kernels::Dtype::fp16}) {
        vocab::PathOptions o = unreduced(mode);
        o.gradients.generator.dtype = dtype;
        const Reduced r = reduce(config, spec, o);
        EXPECT_TRUE(r.gradients.lists.empty()) << "world " << config.world << ", tp " << config.tp << ", pp " << config.pp;
        for (const std::vector<int>& held : r.gradients.held)
          for (int list : held) EXPECT_EQ(list, -1);
      }
    }
  }
}

// tied-embedding-not-synced: the first and the last stage each hold a part of the word embedding's
// gradient, nonzero on both, and the two parts add up to it exactly.
TEST(Reduction, UnsyncedTiedCopiesHoldPartsThatSumToTheGradient) {
  const ParallelConfig config = config_of(4, 1, 2, 1, 1);
  const topologies::ModelSpec spec = testing::dense_model(2);
  vocab::PathOptions o = unreduced();
  o.faults = vocab::FaultSet::of({Fault::tied_embedding_not_synced});
  const Reduced r = reduce(config, spec, o);
  const RankLayout layout(config);
  const LogicalModel model(spec, config);
  const topologies::LogicalParam& embedding = param_named(model, "word_embeddings");
  const int first = layout.group_ranks(Family::embedding, 0)[0], last = layout.group_ranks(Family::embedding, 0)[1];
  const int first_list = r.gradients.held[static_cast<std::size_t>(first)][static_cast<std::size_t>(embedding.id)];
  const int last_list = r.gradients.held[static_cast<std::size_t>(last)][static_cast<std::size_t>(embedding.id)];
  ASSERT_GE(first_list, 0);
  ASSERT_GE(last_list, 0);
  const auto& a = r.gradients.lists[static_cast<std::size_t>(first_list)];
  const auto& b = r.gradients.lists[static_cast<std::size_t>(last_list)];
  for (std::int64_t e = 0; e < embedding.numel; ++e) {
    const float g = kernels::gradient_value(r.generators[static_cast<std::size_t>(embedding.id)],
                                            static_cast<std::uint64_t>(embedding.id), static_cast<std::uint64_t>(e));
    EXPECT_EQ(a[static_cast<std::size_t>(e)] + b[static_cast<std::size_t>(e)], g) << e;
    if (g != 0.0f) EXPECT_NE(a[static_cast<std::size_t>(e)], 0.0) << e;
  }
  // Every other param is held right.
  for (const std::vector<int>& held : r.gradients.held)
    for (std::size_t id = 0; id < held.size(); ++id)
      if (static_cast<int>(id) != embedding.id) EXPECT_EQ(held[id], -1) << model.param(static_cast<int>(id)).name;
}

// The factor each scaling fault leaves on what the ranks hold.
TEST(Reduction, ScalingFaultsScaleByTheirFactor) {
  const ParallelConfig config = config_of(8, 1, 1, 2, 1);  // DP x CP 8, EDP 4
  topologies::ModelSpec spec = testing::small_moe(2);
  spec.add_bias_linear = false;
  const LogicalModel model(spec, config);
  const struct {
    Fault fault;
    double dense, expert;
  } expected[] = {{Fault::grads_averaged_twice, 1.0 / 8, 1.0 / 8},
                  {Fault::grads_not_averaged, 8.0, 8.0},
                  {Fault::expert_grads_averaged_over_edp, 1.0, 2.0}};
  for (const auto& want : expected) {
    vocab::PathOptions o = unreduced();
    o.faults = vocab::FaultSet::of({want.fault});
    const Reduced r = reduce(config, spec, o);
    for (const topologies::LogicalParam& p : model.params()) {
      const double factor = topologies::is_expert_class(p.param_class) ? want.expert : want.dense;
      const int list = r.gradients.held[0][static_cast<std::size_t>(p.id)];
      if (p.expert >= 1) continue;  // rank 0 holds EP rank 0's expert only
      if (factor == 1.0) {
        EXPECT_EQ(list, -1) << p.name;
        continue;
      }
      ASSERT_GE(list, 0) << p.name;
      for (std::int64_t e = 0; e < p.numel; ++e) {
        const double g = kernels::gradient_value(r.generators[static_cast<std::size_t>(p.id)],
                                                 static_cast<std::uint64_t>(p.id), static_cast<std::uint64_t>(e));
        EXPECT_EQ(r.gradients.lists[static_cast<std::size_t>(list)][static_cast<std::size_t>(e)], g * factor) << p.name;
      }
    }
  }
}

// The path on gradients before the reduction reports what it reports on the reduced ones, bit for
// bit, for every generated configuration it runs (no fault).
RC_GTEST_PROP(Reduction, PathBeforeEqualsPathAfter, ()) {
  const int world = *rc::gen::element(2, 4, 8, 16);
  const int tp = *rc::gen::element(1, 2);
  const int pp = *rc::gen::element(1, 2);
  RC_PRE(world % (tp * pp) == 0);
  const int ep = *rc::gen::element(1, 2);
  RC_PRE((world / pp) % ep == 0);
  const ParallelConfig config = config_of(world, tp, pp, ep, 1);
  RC_PRE(!topologies::check_config(config));
  topologies::ModelSpec spec = testing::small_moe(2);
  spec.num_layers = 2;
  spec.qk_layernorm = *rc::gen::arbitrary<bool>();
  spec.add_bias_linear = false;
  vocab::PathOptions after;
  after.gradients.generator.mode = *rc::gen::element(kernels::GradientMode::dyadic, kernels::GradientMode::normal);
  after.gradients.generator.seed = *rc::gen::inRange<std::uint64_t>(0, 1000);
  after.optimizer = *rc::gen::element(vocab::OptimizerModel::plain, vocab::OptimizerModel::distributed);
  after.max_norm = 0.5;
  vocab::PathOptions before = after;
  before.gradients.before_reduction = true;
  const RankLayout layout(config);
  const LogicalModel model(spec, config);
  const auto norms = [&](const vocab::PathOptions& o) {
    comm::SimCommunicator communicator(layout);
    const PathResult r = run_path(model, layout, o, communicator, all_ranks(layout));
    std::vector<std::optional<double>> out;
    for (const record::RankRecord& rank : r.record.ranks) out.push_back(rank.reported.norm);
    return out;
  };
  RC_ASSERT(norms(before) == norms(after));
}

}  // namespace
}  // namespace tally::gradnorm
