// A real target's manifests judged as a run of the case tally sent (run/target_run.h): the case's
// own truth, each recorded gradient statistic against tally's gradients, and manifests of another
// case refused as an infrastructure error naming the difference. The manifests here are the model
// target's (run/model_manifests.h), as a faithful framework would write them.
#include <gtest/gtest.h>

#include "casefile/case_file.h"
#include "run/model_manifests.h"
#include "run/run_case.h"
#include "run/target.h"
#include "run/target_run.h"

namespace tally::run {
namespace {

casefile::Case founding_case() {
  casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.pass.json", run::case_frameworks());
  c.expect.reset();
  c.path.gradients.generator.mode = kernels::GradientMode::normal;
  c.path.gradients.class_mask = ~std::uint32_t{0};
  c.path.max_norm = 1e-3;
  return c;
}

manifest::RunManifests manifests_of(const casefile::Case& c) {
  const CaseRun run = run_case_with_record(c);
  return model_manifests(c, *run.record);
}

TEST(TargetRun, ManifestsOfTheCaseItselfPassWithTheCasesTruth) {
  const casefile::Case c = founding_case();
  const oracle::Verdict v = judge_target_manifests(c, manifests_of(c), 1e-5);
  EXPECT_EQ(v.kind, oracle::Verdict::Kind::pass) << v.infra_message;
  EXPECT_EQ(v.gradient_mismatches, 0);
}

TEST(TargetRun, ManifestsOfAnotherWorldAreAnInfraErrorNamingBothWorlds) {
  casefile::Case world4 = founding_case();
  world4.topology.world = 4;
  const oracle::Verdict v = judge_target_manifests(founding_case(), manifests_of(world4), 1e-5);
  ASSERT_EQ(v.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(v.infra_message.find("world 4, the case's world is 2"), std::string::npos) << v.infra_message;
}

TEST(TargetRun, ManifestsOfOtherParallelSizesAreAnInfraError) {
  casefile::Case tp1 = founding_case();
  tp1.topology.tp = 1;
  tp1.topology.etp = 1;
  ASSERT_FALSE(casefile::check_case(tp1));
  const oracle::Verdict v = judge_target_manifests(founding_case(), manifests_of(tp1), 1e-5);
  ASSERT_EQ(v.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(v.infra_message.find("tp 1"), std::string::npos) << v.infra_message;
}

TEST(TargetRun, ManifestsOfAnotherRankOrderAreAnInfraErrorNamingTheGroup) {
  casefile::Case c = founding_case();
  c.topology.world = 4;
  casefile::Case reordered = c;
  reordered.topology.order = "dp-tp-cp-ep-pp";  // TP groups {0, 2} and {1, 3}, not {0, 1} and {2, 3}
  ASSERT_EQ(casefile::check_case(c), std::nullopt);
  ASSERT_EQ(casefile::check_case(reordered), std::nullopt);
  // The same sizes, other groups: which ranks form a TP group is part of the topology.
  const oracle::Verdict v = judge_target_manifests(c, manifests_of(reordered), 1e-5);
  ASSERT_EQ(v.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(v.infra_message.find("group is"), std::string::npos) << v.infra_message;
}

TEST(TargetRun, ManifestsOfAnotherModelAreAnInfraErrorNamingTheParam) {
  casefile::Case wider = founding_case();
  wider.model.moe_ffn_hidden_size = 2 * wider.model.moe_ffn_hidden_size.value_or(16);
  const oracle::Verdict v = judge_target_manifests(founding_case(), manifests_of(wider), 1e-5);
  ASSERT_EQ(v.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(v.infra_message.find("of shape"), std::string::npos) << v.infra_message;
}

TEST(TargetRun, ManifestsOfAllZeroGradientsFailOnEveryParamTheyHide) {
  casefile::Case zeros = founding_case();
  zeros.path.gradients.generator.mode = kernels::GradientMode::zeros;
  const oracle::Verdict v = judge_target_manifests(founding_case(), manifests_of(zeros), 1e-5);
  ASSERT_EQ(v.kind, oracle::Verdict::Kind::fail);
  ASSERT_FALSE(v.gradients.empty());
  EXPECT_EQ(v.gradients.front().statistic, "sum_squares");
  EXPECT_EQ(v.gradients.front().got, 0.0);
}

TEST(TargetRun, ADeepSpeedCaseJudgedWithAMegatronRunsManifestsIsAnInfraError) {
  const casefile::Case c =
      casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/real/deepspeed-0.19.8-bf16-optimizer-pipeline-tied.pass.json", run::case_frameworks());
  const oracle::Verdict v = judge_target_run(
      c, TALLY_SOURCE_DIR "/seeds/real/megatron-core-0.19.2-layerwise-expert-weights-etp1-tp2.manifests", 1e-5);
  ASSERT_EQ(v.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(v.infra_message.find("not a run of this case"), std::string::npos) << v.infra_message;
}

TEST(TargetRun, AFolderWithoutManifestsIsAnInfraErrorNamingIt) {
  const oracle::Verdict v = judge_target_run(founding_case(), TALLY_SOURCE_DIR "/seeds/no-such-folder", 1e-5);
  ASSERT_EQ(v.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(v.infra_call.find("no-such-folder"), std::string::npos) << v.infra_call;
}

// Every main param's clipped statistics in `m`, changed by `change`.
template <class Change>
manifest::RunManifests with_clipped(manifest::RunManifests m, Change change) {
  for (manifest::RankManifest& rank : m.ranks)
    for (manifest::OptimizerRecord& o : rank.optimizers)
      for (manifest::MainParam& p : o.main_params)
        if (p.clipped_stats) change(p);
  return m;
}

TEST(TargetRun, AClippedSumOfSquaresOffByTenPercentFails) {
  const casefile::Case c = founding_case();
  const oracle::Verdict v = judge_target_manifests(
      c, with_clipped(manifests_of(c), [](manifest::MainParam& p) { p.clipped_stats->sum_squares *= 1.1; }), 1e-5);
  ASSERT_EQ(v.kind, oracle::Verdict::Kind::fail);
  ASSERT_FALSE(v.gradients.empty());
  EXPECT_TRUE(v.gradients.front().after_clip);
  EXPECT_EQ(v.gradients.front().statistic, "sum_squares");
}

TEST(TargetRun, ClippedProductsBelowTheSmallestNormalMayRoundToZero) {
  // max_norm 1e-40: every product of a normal(0, 1) gradient with the coefficient (about 3e-42)
  // is subnormal in fp32, which a device that flushes them stores as 0.
  casefile::Case c = founding_case();
  c.path.max_norm = 1e-40;
  const manifest::RunManifests flushed = with_clipped(manifests_of(c), [](manifest::MainParam& p) {
    p.clipped_stats = record::GradStats{0.0, 0.0, p.end - p.begin};
  });
  const oracle::Verdict v = judge_target_manifests(c, flushed, 1e-5);
  EXPECT_EQ(v.gradient_mismatches, 0) << v.gradients.front().name << " " << v.gradients.front().statistic;
  // Left unscaled, they are far above what any coefficient within the tolerance makes of them.
  const manifest::RunManifests unscaled =
      with_clipped(manifests_of(c), [](manifest::MainParam& p) { p.clipped_stats = p.stats; });
  EXPECT_GT(judge_target_manifests(c, unscaled, 1e-5).gradient_mismatches, 0);
}

TEST(TargetRun, APieceThatDisagreesWithItsBoxIsAFailNamingItNotAnUnreadableRun) {
  // A framework whose optimizer holds twice the gradient of its model param (a reduction that
  // doubled it): the piece's statistics are possible, and not those of the box.
  const casefile::Case c = founding_case();
  manifest::RunManifests m = manifests_of(c);
  manifest::MainParam& piece = m.ranks[0].optimizers[0].main_params[0];
  piece.stats.sum_squares *= 4;
  piece.stats.abs_max *= 2;
  const oracle::Verdict v = judge_target_manifests(c, m, 1e-5);
  ASSERT_EQ(v.kind, oracle::Verdict::Kind::fail) << v.infra_message;
  ASSERT_FALSE(v.gradients.empty());
  EXPECT_FALSE(v.gradients.front().after_clip);
  EXPECT_NE(v.gradients.front().where.find("owns"), std::string::npos) << v.gradients.front().where;
  EXPECT_EQ(v.gradients.front().ranks, (std::vector<int>{0}));
}

TEST(TargetRun, ClippedStatisticsFollowTheMaxNormTheFrameworkRecorded) {
  // DeepSpeed clips at its gradient_clipping (1.0 where a case has max_norm 0): a framework's
  // clipped gradients are judged with the max_norm its child recorded, not the case's.
  const casefile::Case clipping = founding_case();  // max_norm 1e-3
  casefile::Case c = clipping;
  c.path.max_norm = 0.0;
  const oracle::Verdict v = judge_target_manifests(c, manifests_of(clipping), 1e-5);
  EXPECT_EQ(v.kind, oracle::Verdict::Kind::pass) << v.infra_message;
  EXPECT_EQ(v.gradient_mismatches, 0);
}

TEST(TargetRun, TheRecordIsRenumberedAsTheCasesParams) {
  const casefile::Case c = founding_case();
  const topologies::LogicalModel model(c.model, c.topology);
  const record::RunRecord run = record_in_model_order(manifests_of(c), model);
  ASSERT_EQ(run.tensors.size(), static_cast<std::size_t>(model.size()));
  for (const topologies::LogicalParam& p : model.params())
    EXPECT_EQ(run.tensors[static_cast<std::size_t>(p.id)].name, p.name);
}

}  // namespace
}  // namespace tally::run
