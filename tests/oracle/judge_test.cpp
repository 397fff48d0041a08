// The judge on the model target's records: every fault of the catalog fails its case and the
// twin passes, the founding regression's diagnosis, random fault-free cases pass, and what only
// the judge's independent checks see: a clipped gradient the kernel got wrong, a child's clip
// coefficient, ranks that disagree.
#include "oracle/judge.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>

#include "run/run_case.h"
#include "tests/support/fault_cases.h"
#include "tests/support/model_gen.h"
#include "tests/support/show.h"

namespace tally::oracle {
namespace {

using vocab::Fault;
using vocab::FaultSet;
using vocab::OptimizerModel;
using vocab::PathOptions;
using topologies::ParallelConfig;

casefile::Case case_of(const ParallelConfig& config, const topologies::ModelSpec& spec,
                       const PathOptions& options) {
  casefile::Case c;
  c.topology = config;
  c.model = spec;
  c.path = options;
  return c;
}

Verdict run_and_judge(const ParallelConfig& config, const topologies::ModelSpec& spec,
                      const PathOptions& options) {
  return run::run_case(case_of(config, spec, options));
}

// Judges `run`, the model target's record of `c`, again (after a test changed it).
Verdict rejudge(const casefile::Case& c, const record::RunRecord& run) {
  const topologies::RankLayout layout(c.topology);
  const topologies::LogicalModel model(c.model, c.topology);
  const gradnorm::OptimizerPlan plan = gradnorm::plan_optimizer(c.path.optimizer, model, c.path.faults);
  return run::judge_model_run(c, model, layout, plan, run);
}

// Every fault fails its named case (an expert-topology fault names its class in the
// diagnosis), and the same case passes without it.
TEST(Judge, EveryFaultFailsItsCaseAndTheTwinPasses) {
  for (const testing::FaultCase& c : testing::fault_cases()) {
    SCOPED_TRACE(std::string(vocab::fault_info(c.fault).name) + ": " + c.description);
    const Verdict right = run_and_judge(c.config, c.model, c.options);
    EXPECT_EQ(right.kind, Verdict::Kind::pass);
    PathOptions faulty = c.options;
    faulty.faults = FaultSet::of({c.fault});
    const Verdict wrong = run_and_judge(c.config, c.model, faulty);
    if (c.fault == Fault::empty_rank_skips_collective) {
      EXPECT_EQ(wrong.kind, Verdict::Kind::infra_error);
      EXPECT_NE(wrong.infra_message.find("did not join"), std::string::npos) << wrong.infra_message;
      continue;
    }
    EXPECT_EQ(wrong.kind, Verdict::Kind::fail);
    if (!c.counting) continue;
    const std::string cls(topologies::class_name(c.miscounted_class));
    EXPECT_TRUE(std::any_of(wrong.miscounted.begin(), wrong.miscounted.end(),
                            [&](const Miscount& m) { return m.param_class.rfind(cls, 0) == 0; }))
        << "no miscounted param of class " << cls;
  }
}

// The founding regression at world 2 and 8: the diagnosis names the expert FC2 bias, the rank
// whose dense-TP rank is 1, and the fallback to the TP group.
TEST(Judge, FoundingRegressionNamesTheExpertBiasAndTheRank) {
  for (int world : {2, 8}) {
    const ParallelConfig config = testing::config_of(world, 2, 1, 2, 1);
    PathOptions options = testing::ones(OptimizerModel::layerwise);
    options.gradients.class_mask = vocab::class_bit(topologies::ParamClass::expert_row_bias);
    const Verdict right = run_and_judge(config, testing::founding_model(), options);
    ASSERT_EQ(right.kind, Verdict::Kind::pass);
    EXPECT_EQ(right.stats[0].got, 4.0);
    options.faults = FaultSet::of({Fault::expert_dedup_on_dense_tp});
    const Verdict wrong = run_and_judge(config, testing::founding_model(), options);
    ASSERT_EQ(wrong.kind, Verdict::Kind::fail);
    EXPECT_EQ(wrong.stats[0].name, "l2");
    EXPECT_EQ(wrong.stats[0].got, std::sqrt(8.0));
    ASSERT_EQ(wrong.miscounted.size(), 1u);
    const Miscount& m = wrong.miscounted[0];
    EXPECT_EQ(m.name, "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.bias");
    EXPECT_EQ(m.counted, 0);
    const topologies::RankLayout layout(config);
    bool named = false;
    for (const Contribution& k : m.contributions) {
      if (layout.index_in(topologies::Family::tp, k.rank) != 1 || k.owned == 0) continue;
      EXPECT_EQ(k.counted, 0);
      EXPECT_NE(k.rule.find("no expert-TP group: fell back to the TP group"), std::string::npos) << k.rule;
      EXPECT_NE(k.rule.find("(rank 1 there)"), std::string::npos) << k.rule;
      EXPECT_EQ(k.rule.substr(k.rule.size() - 9), ": dropped");
      named = true;
    }
    EXPECT_TRUE(named);
  }
}

// Without faults every optimizer model passes every statistic on random valid cases, in exact
// modes bit for bit and in random modes within the derived bound.
RC_GTEST_PROP(JudgeProperty, RandomValidCasesPassWithoutFaults, ()) {
  const auto [config, spec] = *testing::valid_case(3);
  RC_PRE(testing::megatron_assumptions_hold(config));
  PathOptions options;
  options.optimizer = *rc::gen::element(OptimizerModel::plain, OptimizerModel::distributed,
                                        OptimizerModel::layerwise, OptimizerModel::muon);
  options.gradients.generator.mode = *rc::gen::elementOf(kernels::kAllGradientModes);
  options.gradients.generator.dtype = *rc::gen::elementOf(kernels::kAllDtypes);
  options.gradients.generator.seed = *rc::gen::arbitrary<std::uint64_t>();
  options.accumulation = *rc::gen::element(kernels::Accumulation::fp64, kernels::Accumulation::fp32);
  options.max_norm = *rc::gen::element(0.0, 0.5, 1.0, 1e6);
  options.bucket_elements = *rc::gen::element<std::int64_t>(0, 5, 100);
  if (*rc::gen::arbitrary<bool>()) options.p_values = {1.0, 3.0};
  const Verdict verdict = run_and_judge(config, spec, options);
  for (const StatisticCheck& s : verdict.stats)
    RC_ASSERT_FALSE(!s.ok && (RC_LOG() << s.name << " got " << s.got << " expected " << s.expected
                                       << " bound " << s.bound << "\n", true));
  RC_ASSERT(verdict.miscounted_total == 0);
  RC_ASSERT(verdict.ranks_agree);
  RC_ASSERT(verdict.clipped.empty());
  RC_ASSERT(verdict.kind == Verdict::Kind::pass);
}

// The founding case without its fault, clipped (norm 4, max_norm 1), as a record to tamper with.
casefile::Case clipped_case() {
  PathOptions options = testing::ones(OptimizerModel::plain);
  options.max_norm = 1.0;
  return case_of(testing::config_of(2, 2, 1, 2, 1), testing::founding_model(), options);
}

TEST(Judge, AClippedValueTheKernelGotWrongFailsOnItsRankAndElement) {
  const casefile::Case c = clipped_case();
  run::CaseRun ran = run::run_case_with_record(c);
  ASSERT_EQ(ran.verdict.kind, Verdict::Kind::pass);
  record::RunRecord run = *ran.record;
  // Rank 1's clip kernel is off by one ulp in the third element of its second param.
  auto clipped = std::make_shared<record::ClippedValues>(*run.ranks[1].clipped);
  const std::span<const float> shown = (*clipped)[1].values();
  auto values = std::make_shared<std::vector<float>>(shown.begin(), shown.end());
  (*values)[2] = std::nextafter((*values)[2], 1.0f);
  (*clipped)[1].data = std::shared_ptr<const float>(values, values->data());
  run.ranks[1].clipped = clipped;
  const Verdict verdict = rejudge(c, run);
  EXPECT_EQ(verdict.kind, Verdict::Kind::fail);
  ASSERT_EQ(verdict.clipped.size(), 1u);
  EXPECT_EQ(verdict.clipped[0].rank, 1);
  EXPECT_EQ(verdict.clipped[0].got, (*values)[2]);
  EXPECT_EQ(verdict.clipped[0].applied_coefficient, verdict.clipped[0].expected_coefficient);
  EXPECT_TRUE(std::all_of(verdict.stats.begin(), verdict.stats.end(), [](const StatisticCheck& s) { return s.ok; }));
}

TEST(Judge, EveryChildsClipCoefficientIsJudged) {
  const casefile::Case c = clipped_case();
  record::RunRecord run = *run::run_case_with_record(c).record;
  run.ranks[0].children.back().clip->coefficient *= 1.5;
  const Verdict verdict = rejudge(c, run);
  const auto clip = std::find_if(verdict.stats.begin(), verdict.stats.end(),
                                 [](const StatisticCheck& s) { return s.name == "clip"; });
  ASSERT_NE(clip, verdict.stats.end());
  EXPECT_FALSE(clip->ok);
  EXPECT_EQ(clip->rank, 0);
}

// A run where one rank is a hair off and another ten times off shows the ten times, under the
// model target's exact bounds (both errors are infinitely many bounds) and under tally check's
// relative tolerance alike.
TEST(Judge, TheHeadlineOfAStatisticIsItsWorstRank) {
  casefile::Case c = clipped_case();
  c.topology = testing::config_of(8, 2, 1, 2, 1);
  record::RunRecord run = *run::run_case_with_record(c).record;
  ASSERT_EQ(run.ranks.size(), 8u);
  const double norm = *run.ranks[0].reported.norm;
  run.ranks[1].reported.norm = norm * (1 + 5e-5);
  run.ranks[2].reported.norm = norm * 10;
  auto headline = [](const Verdict& verdict) {
    return *std::find_if(verdict.stats.begin(), verdict.stats.end(),
                         [](const StatisticCheck& s) { return s.name == "l2"; });
  };
  const StatisticCheck exact = headline(rejudge(c, run));
  EXPECT_FALSE(exact.ok);
  EXPECT_EQ(exact.rank, 2);
  EXPECT_EQ(exact.got, norm * 10);

  oracle::Bounds relative;
  relative.rtol = 1e-6;
  const topologies::LogicalModel model(c.model, c.topology);
  const StatisticCheck loose =
      headline(judge(run, run::truth_of(model, c.path), relative, nullptr, JudgeOptions{}));
  EXPECT_EQ(loose.rank, 2);
}

// DeepSpeed #8613 as its report gives it: four shared gradients of 3.0 and four expert gradients
// of 4.0 report a norm of 6.0 where 10.0 is correct, once the expert half is dropped. The stated
// values enter the path, the truth and the clipped check alike.
TEST(Judge, AReportsOwnNumbersAreJudgedAsReported) {
  topologies::StatedGradient three{topologies::StatedGradient::Kind::constant, 3.0, {}};
  topologies::StatedGradient four{topologies::StatedGradient::Kind::constant, 4.0, {}};
  std::vector<topologies::CustomParam> params = {
      testing::custom_param("shared", topologies::ParamClass::replicated, {4}),
      testing::custom_param("expert0.bias", topologies::ParamClass::expert_row_bias, {2}),
      testing::custom_param("expert1.bias", topologies::ParamClass::expert_row_bias, {2})};
  params[0].gradient = three;
  params[1].expert = 0;
  params[2].expert = 1;
  casefile::Case c = case_of(testing::config_of(2, 1, 1, 2, 1), testing::custom_model(params, 2),
                             testing::ones(OptimizerModel::plain));
  c.path.gradients.stated.push_back({"", topologies::ParamClass::expert_row_bias, four});
  c.path.max_norm = 5.0;
  const Verdict right = run::run_case(c);
  EXPECT_EQ(right.kind, Verdict::Kind::pass);
  EXPECT_EQ(right.stats[0].name, "l2");
  EXPECT_EQ(right.stats[0].got, 10.0);

  c.path.faults = FaultSet::of({Fault::expert_norm_dropped});
  const Verdict wrong = run::run_case(c);
  EXPECT_EQ(wrong.kind, Verdict::Kind::fail);
  EXPECT_EQ(wrong.stats[0].got, 6.0);
  EXPECT_EQ(wrong.stats[0].expected, 10.0);
  EXPECT_FALSE(wrong.clipped.empty());  // clipped by 5/6 where 5/10 was due
}

TEST(Judge, RanksThatReportDifferentBitsDisagree) {
  const casefile::Case c = clipped_case();
  record::RunRecord run = *run::run_case_with_record(c).record;
  const double norm = *run.ranks[1].reported.norm;
  run.ranks[1].reported.norm = std::nextafter(norm, 2 * norm);
  const Verdict verdict = rejudge(c, run);
  EXPECT_FALSE(verdict.ranks_agree);
  EXPECT_EQ(verdict.disagreement, "rank 0 reports l2 " + record::all_digits(norm) + " but rank 1 reports " +
                                      record::all_digits(*run.ranks[1].reported.norm));
}

}  // namespace
}  // namespace tally::oracle
