// Hand-built manifests read into a run record and judged, as `tally check` does: the founding
// #6099 topology with and without the fallback, every validation rule with its message, pieces
// cut by a distributed optimizer, and the statistics a ledger cannot see (averaged reductions,
// disagreeing ranks, clipping).
#include "manifest/to_record.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "manifest/manifest_json.h"
#include "tests/manifest/hand_built_runs.h"

namespace tally::manifest {
namespace {

using namespace hand_built;

TEST(ManifestRunJudged, CorrectFilterPassesWithEveryElementOnce) {
  const CheckReport report = check_run(founding_run(false));
  EXPECT_EQ(report.verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_EQ(report.logical_params, 4);
  EXPECT_EQ(report.logical_elements, 8 + 8 + 8 + 32);
  EXPECT_DOUBLE_EQ(report.truth_norm, std::sqrt(56.0));
  EXPECT_EQ(report.verdict.miscounted_total, 0);
}

TEST(ManifestRunJudged, ExpertBiasDedupOnTpGroupIsDiagnosedOnTheRankThatDropsIt) {
  const CheckReport report = check_run(founding_run(true));
  ASSERT_EQ(report.verdict.kind, oracle::Verdict::Kind::fail);
  ASSERT_EQ(report.verdict.miscounted.size(), 1u);
  const oracle::Miscount& m = report.verdict.miscounted.front();
  EXPECT_EQ(m.name, "experts.1.fc2.bias");
  EXPECT_EQ(m.counted, 0);
  EXPECT_EQ(m.expected, 8);
  EXPECT_EQ(m.wrong_ranks, (std::vector<int>{0, 1}));
  ASSERT_EQ(m.contributions.size(), 1u);
  EXPECT_EQ(m.contributions[0].rank, 1);
  EXPECT_EQ(m.contributions[0].counted, 0);
  EXPECT_NE(m.contributions[0].rule.find("no expert-TP group: fell back to the TP group [0,1]"),
            std::string::npos)
      << m.contributions[0].rule;
  // The reported norm is what the framework's own ledger implies: the reduction is right, the
  // filter is not.
  EXPECT_TRUE(stat(report, "l2-ledger")->ok);
  EXPECT_FALSE(stat(report, "l2")->ok);
}

TEST(ManifestRunJudged, ExpertGroupEqualToTpGroupIsNamedAsSuch) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) {
    m.optimizers[0].expert_tp_group = group(run, {0, 1});
    m.optimizers[0].main_params[1].kept = m.rank == 0;
  }
  const CheckReport report = check_run(run);
  ASSERT_EQ(report.verdict.miscounted.size(), 1u);
  EXPECT_NE(report.verdict.miscounted[0].contributions[0].rule.find(
                "expert-topology param de-duplicated on a TP group [0,1] (rank 1 there)"),
            std::string::npos);
}

TEST(ManifestRunJudged, AShardWithoutAPartitionDimIsNamedAsSuch) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) m.params.edit()[2].attributes.partition_dim = -1;  // as DeepSpeed's AutoTP marks
  const record::RunRecord record = to_record(run);
  const auto fc1 = std::find_if(record.tensors.begin(), record.tensors.end(),
                                [](const record::Tensor& t) { return t.name == "fc1.weight"; });
  ASSERT_NE(fc1, record.tensors.end());
  EXPECT_EQ(fc1->kind, "tensor-parallel shard (no partition_dim)");
  for (RankManifest& m : run.ranks) m.params.edit()[2].attributes.partition_dim = 0;
  const record::RunRecord marked = to_record(run);
  EXPECT_EQ(std::find_if(marked.tensors.begin(), marked.tensors.end(),
                         [](const record::Tensor& t) { return t.name == "fc1.weight"; })->kind,
            "tensor-parallel shard (dim 0)");
}

TEST(ManifestRunJudged, AShardThatLostItsMarkIsNamedAsSuch) {
  RunManifests run = founding_run(false);
  const auto kind = [](const record::RunRecord& r, const std::string& name) {
    const auto t = std::find_if(r.tensors.begin(), r.tensors.end(), [&](const record::Tensor& x) { return x.name == name; });
    return t == r.tensors.end() ? "no param " + name : t->kind;
  };
  for (RankManifest& m : run.ranks) m.params.edit()[2].attributes.tensor_model_parallel = false;  // as DeepSpeed's copies
  EXPECT_EQ(kind(to_record(run), "fc1.weight"), "shard not marked tensor_model_parallel")
      << "held in halves, yet unmarked";
  EXPECT_EQ(kind(to_record(run), "norm.weight"), "replicated over TP") << "held whole on each rank";
  // AutoEP holds each expert's FC1 as two pieces (its gate rows in w1, its up rows in w3) on one
  // rank: stored in pieces, not split over ranks.
  const record::RunRecord autoep = to_record(load_run(
      TALLY_SOURCE_DIR "/seeds/real/deepspeed-0.19.8-8613-autoep-unfused-drops-expert-norm-bf16.fail.manifests"));
  EXPECT_EQ(kind(autoep, "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"),
            "expert-topology param replicated over ETP");
}

TEST(ManifestRunJudged, AveragedReductionFailsAgainstTheRanksOwnLedger) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) m.reported.norm = *m.reported.norm / std::sqrt(2.0);
  const CheckReport report = check_run(run);
  EXPECT_EQ(report.verdict.kind, oracle::Verdict::Kind::fail);
  EXPECT_EQ(report.verdict.miscounted_total, 0);
  EXPECT_FALSE(stat(report, "l2-ledger")->ok);
  EXPECT_NE(stat(report, "l2-ledger")->diagnosis.find("its reduction is not the sum of their squares"),
            std::string::npos);
}

TEST(ManifestRunJudged, RanksThatReportDifferentNormsDisagree) {
  RunManifests run = founding_run(false);
  run.ranks[1].reported.norm = *run.ranks[1].reported.norm + 1.0;
  const CheckReport report = check_run(run);
  EXPECT_FALSE(report.verdict.ranks_agree);
  EXPECT_NE(report.verdict.disagreement.find("rank 1"), std::string::npos);
}

TEST(ManifestRunJudged, ZeroCountIsExact) {
  RunManifests run = founding_run(false);
  run.ranks[0].reported.zeros = 1;
  run.ranks[1].reported.zeros = 1;
  const CheckReport report = check_run(run);
  EXPECT_FALSE(stat(report, "zeros")->ok);
}

// Issue 18: the zero count each rank's ledger implies was printed, never judged.
TEST(ManifestRunJudged, ZeroCountIsJudgedAgainstTheRanksOwnLedger) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) {
    m.params.edit()[0].stats = {6.0, 1.0, 2};  // norm.weight: 2 zeros of 8
    m.optimizers[0].main_params[0].stats = m.params[0].stats;
    m.reported.norm = std::sqrt(54.0);
    m.reported.zeros = 2;
  }
  const CheckReport right = check_run(run);
  EXPECT_EQ(right.verdict.kind, oracle::Verdict::Kind::pass);
  ASSERT_NE(stat(right, "zeros-ledger"), nullptr);
  EXPECT_TRUE(stat(right, "zeros-ledger")->ok);
  EXPECT_EQ(stat(right, "zeros-ledger")->diagnosis, "");

  // A count that is not the sum of the kept pieces' zeros: wrong against the truth and the ledger.
  run.ranks[1].reported.zeros = 3;
  const CheckReport reduced_wrong = check_run(run);
  const oracle::StatisticCheck* ledger = stat(reduced_wrong, "zeros-ledger");
  ASSERT_NE(ledger, nullptr);
  EXPECT_FALSE(ledger->ok);
  EXPECT_EQ(ledger->rank, 1);
  EXPECT_EQ(ledger->got, 3.0);
  EXPECT_EQ(ledger->expected, 2.0);
  EXPECT_EQ(ledger->diagnosis,
            "rank 1 reports 3 zeros, but the pieces its stats groups kept for the zero count hold 2: its count "
            "is not the sum of theirs (counted in float32, or padding counted as zeros)");

  // The TP replica of norm.weight kept for the zero count too: the ledger implies 4, the truth is
  // 2, and a rank reporting 2 did not count what its manifest says it kept.
  run.ranks[1].reported.zeros = 2;
  run.ranks[1].optimizers[0].main_params[0].kept_zeros = true;
  const CheckReport kept_twice = check_run(run);
  EXPECT_TRUE(stat(kept_twice, "zeros")->ok);
  EXPECT_FALSE(stat(kept_twice, "zeros-ledger")->ok);
  EXPECT_EQ(stat(kept_twice, "zeros-ledger")->expected, 4.0);
  EXPECT_EQ(kept_twice.verdict.kind, oracle::Verdict::Kind::fail);
}

TEST(ManifestRunJudged, ClipCoefficientIsJudgedAgainstTheTruth) {
  RunManifests run = founding_run(false);
  const double max_norm = 1.0;
  for (RankManifest& m : run.ranks) m.optimizers[0].clip = Clip{max_norm, max_norm / (std::sqrt(56.0) + 1e-6)};
  EXPECT_TRUE(stat(check_run(run), "clip")->ok);
  for (RankManifest& m : run.ranks) m.optimizers[0].clip->coefficient = max_norm / (std::sqrt(48.0) + 1e-6);
  EXPECT_FALSE(stat(check_run(run), "clip")->ok);
}

// Issue 18, item 3: max_norm 0 never clips (gradnorm/path.cpp), so the coefficient is 1.
TEST(ManifestRunJudged, ClipWithMaxNormZeroExpectsCoefficientOne) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) m.optimizers[0].clip = Clip{0.0, 1.0};
  const CheckReport report = check_run(run);
  ASSERT_NE(stat(report, "clip"), nullptr);
  EXPECT_EQ(stat(report, "clip")->expected, 1.0);
  EXPECT_TRUE(stat(report, "clip")->ok);
  EXPECT_EQ(report.verdict.kind, oracle::Verdict::Kind::pass);
  for (RankManifest& m : run.ranks) m.optimizers[0].clip->coefficient = 0.0;  // the raw quotient 0 / norm
  EXPECT_FALSE(stat(check_run(run), "clip")->ok);
}

// norm.weight in the separate grad-norm group "mtp": out of the main norm (sqrt(48)), in a norm of
// its own (sqrt(8)). `kept` means kept for the norm of the param's own group.
RunManifests with_mtp_norm_weight(bool report_group_norm) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) {
    m.params.edit()[0].attributes.grad_norm_group = "mtp";
    m.optimizers[0].main_params[0].attributes.grad_norm_group = "mtp";
    m.reported.norm = std::sqrt(48.0);
    if (report_group_norm) m.reported.group_norms["mtp"] = std::sqrt(8.0);
  }
  return run;
}

TEST(ManifestRunJudged, ASeparateGroupsNormIsJudgedOnceReported) {
  const CheckReport right = check_run(with_mtp_norm_weight(true));
  EXPECT_EQ(right.verdict.kind, oracle::Verdict::Kind::pass);
  ASSERT_NE(stat(right, "mtp-l2"), nullptr);
  EXPECT_EQ(stat(right, "mtp-l2")->expected, std::sqrt(8.0));

  RunManifests twice = with_mtp_norm_weight(true);
  twice.ranks[1].optimizers[0].main_params[0].kept = true;  // the TP replica kept too
  for (RankManifest& m : twice.ranks) m.reported.group_norms["mtp"] = 4.0;
  const CheckReport wrong = check_run(twice);
  ASSERT_EQ(wrong.verdict.miscounted.size(), 1u);
  EXPECT_EQ(wrong.verdict.miscounted[0].name, "norm.weight");
  EXPECT_EQ(wrong.verdict.miscounted[0].counted, 16);
  EXPECT_FALSE(stat(wrong, "mtp-l2")->ok);
}

TEST(ManifestRunJudged, ASeparateGroupNobodyReportsIsNotJudged) {
  RunManifests run = with_mtp_norm_weight(false);
  run.ranks[1].optimizers[0].main_params[0].kept = true;
  const CheckReport report = check_run(run);
  EXPECT_EQ(report.verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_EQ(stat(report, "mtp-l2"), nullptr);
}

// Two separate groups leave the main norm; only reporting both norms is beyond tally's truth.
TEST(ManifestRunJudged, TwoSeparateGroupsAreAnErrorOnlyWhenBothNormsAreReported) {
  RunManifests run = with_mtp_norm_weight(true);
  for (RankManifest& m : run.ranks) {
    m.params.edit()[2].attributes.grad_norm_group = "other";
    m.optimizers[0].main_params[2].attributes.grad_norm_group = "other";
    m.reported.norm = std::sqrt(16.0);  // the expert biases alone
  }
  const CheckReport report = check_run(run);
  EXPECT_EQ(report.verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_EQ(stat(report, "mtp-l2")->expected, std::sqrt(8.0));
  for (RankManifest& m : run.ranks) m.reported.group_norms["other"] = std::sqrt(32.0);
  EXPECT_EQ(check_error(run),
            "reported.group_norms names grad_norm_group 'mtp' and 'other': tally judges one separate "
            "grad-norm group besides the main norm");
}

TEST(ManifestRunJudged, AGroupNormNoParamCarriesIsAnError) {
  RunManifests run = founding_run(false);
  run.ranks[1].reported.group_norms["mtp"] = 1.0;
  EXPECT_EQ(check_error(run),
            "rank-1.json: reported.group_norms names 'mtp', a grad_norm_group no param of the run carries");
}

TEST(ManifestRunJudged, ZeroCountLedgerIsJudgedToo) {
  RunManifests run = founding_run(false);
  run.ranks[1].optimizers[0].main_params[0].kept_zeros = true;  // norm.weight's TP replica
  const CheckReport report = check_run(run);
  ASSERT_EQ(report.verdict.miscounted.size(), 1u);
  EXPECT_EQ(report.verdict.miscounted[0].name, "norm.weight");
  EXPECT_EQ(report.verdict.miscounted[0].counted, 16);
  EXPECT_NE(report.verdict.miscounted[0].param_class.find("in the zero count"), std::string::npos);
}

TEST(ManifestRunJudged, ElementsCountedTwiceAndNeverDoNotCancel) {
  RunManifests run = founding_run(false);
  // Rank 0 keeps the first half of norm.weight twice (two pieces), rank 1 keeps nothing.
  MainParam& piece = run.ranks[0].optimizers[0].main_params[0];
  piece.end = 4;
  piece.stats = ones(4);
  MainParam again = piece;
  run.ranks[0].optimizers[0].main_params.push_back(again);
  const CheckReport report = check_run(run);
  ASSERT_EQ(report.verdict.miscounted.size(), 1u);
  EXPECT_EQ(report.verdict.miscounted[0].counted, 8);  // the total alone looks right
  EXPECT_NE(report.verdict.miscounted[0].param_class.find("its elements counted from 0 to 2 times"),
            std::string::npos)
      << report.verdict.miscounted[0].param_class;
}

TEST(ManifestRunJudged, RanksReportingDifferentInfNormsDisagree) {
  RunManifests run = founding_run(false);
  run.ranks[0].reported.inf_norm = 1.0;
  run.ranks[1].reported.inf_norm = 5.0;
  EXPECT_FALSE(check_run(run).verdict.ranks_agree);
}

// Statistics each finite whose sum of squares overflows: no truth (once an infinite one, whose
// comparisons passed whatever the ranks reported).
TEST(ManifestRunJudged, OverflowingSquaresLeaveNoTruthNamingTheParams) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) {
    m.params.edit()[2].stats = {1e308, 1e154, 0};  // possible: 1e308 <= 16 (1e154)^2
    m.optimizers[0].main_params[2].stats = m.params[2].stats;
  }
  try {
    check_run(run);
    FAIL() << "expected TruthUnknown";
  } catch (const oracle::TruthUnknown& error) {
    EXPECT_EQ(std::string(error.what()),
              "the truth cannot be computed: the sum of squares of the main norm group's 4 params overflows a "
              "double (largest: fc1.weight (its boxes' sums alone overflow), norm.weight (sum_squares 8), "
              "experts.0.fc2.bias (sum_squares 8), experts.1.fc2.bias (sum_squares 8)), so no finite norm is right");
  }
  run = founding_run(false);
  run.ranks[0].params.edit()[0].stats = {1e308, 1e154, 0};  // the replicated norm weight, once
  run.ranks[1].params.edit()[0].stats = {1e308, 1e154, 0};
  for (RankManifest& m : run.ranks) m.optimizers[0].main_params[0].stats = m.params[0].stats;
  EXPECT_NO_THROW(check_run(run)) << "a replica counts once: 1e308 + 48 is finite";
}

TEST(ToRecordValidation, HoldersInDifferentNormGroups) {
  RunManifests run = founding_run(false);
  run.ranks[1].params.edit()[0].attributes.grad_norm_group = "mtp";
  EXPECT_NE(check_error(run).find("rank-1.json: params[0] (norm.weight): grad_norm_group differs"),
            std::string::npos)
      << check_error(run);
}

TEST(ManifestRunJudged, StridedDistributedPiecesCountEachElementOnce) {
  EXPECT_EQ(check_run(distributed_run(5, 7)).verdict.kind, oracle::Verdict::Kind::pass);
}

TEST(ManifestRunJudged, OverlappingDistributedPiecesAreCountedTwice) {
  RunManifests run = distributed_run(5, 5);
  run.ranks[0].optimizers[0].main_params[0].end = 7;  // rank 0 owns [0,7), rank 2 owns [5,12)
  run.ranks[0].optimizers[0].main_params[0].stats = ones(7);
  const CheckReport report = check_run(run);
  ASSERT_EQ(report.verdict.miscounted.size(), 1u);
  EXPECT_EQ(report.verdict.miscounted[0].name, "proj.weight");
  EXPECT_EQ(report.verdict.miscounted[0].counted, 26);  // 2 of 24 elements twice
}

TEST(ManifestRunJudged, StatsGroupThatMissesTheHoldersCountsZeroTimes) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) {
    m.optimizers[0].stats_group = group(run, {m.rank});
    m.groups["mp"] = group(run, {m.rank});
  }
  const CheckReport report = check_run(run);
  EXPECT_EQ(report.verdict.kind, oracle::Verdict::Kind::fail);
  EXPECT_GE(report.verdict.miscounted_total, 2);  // the other rank's expert bias and fc1 shard
}

// ---- validation: each rule and its message ----

TEST(ToRecordValidation, MissingRanksAreListed) {
  RunManifests run = founding_run(false);
  run.ranks.pop_back();
  EXPECT_NE(check_error(run).find("missing the manifests of 1 of 2 ranks: [1]"), std::string::npos)
      << check_error(run);
}

TEST(ToRecordValidation, RepeatedRank) {
  RunManifests run = founding_run(false);
  run.ranks[1] = run.ranks[0];
  EXPECT_NE(check_error(run).find("rank-0.json: manifest.rank: two manifests for rank 0"),
            std::string::npos);
}

TEST(ToRecordValidation, InconsistentGroupNamesBothRanks) {
  RunManifests run = founding_run(false);
  run.ranks[1].groups["tp"] = group(run, {1});
  EXPECT_NE(check_error(run).find("rank-0.json: inconsistent group \"tp\": [0,1] here, but rank 1 lists [1]"),
            std::string::npos)
      << check_error(run);
}

TEST(ToRecordValidation, InconsistentStatsGroup) {
  RunManifests run = founding_run(false);
  run.ranks[1].optimizers[0].stats_group = group(run, {1});
  EXPECT_NE(check_error(run).find("inconsistent optimizers[0].stats_group"), std::string::npos);
}

TEST(ToRecordValidation, DifferentLogicalShapes) {
  RunManifests run = founding_run(false);
  run.ranks[1].params.edit()[0].logical_shape = {9};
  EXPECT_NE(check_error(run).find("rank-1.json: params[0] (norm.weight): logical_shape [9] differs from [8]"),
            std::string::npos)
      << check_error(run);
}

TEST(ToRecordValidation, ReplicasWhoseStatisticsDisagree) {
  RunManifests run = founding_run(false);
  run.ranks[1].params.edit()[0].stats.sum_squares = 7.0;
  EXPECT_NE(check_error(run).find("rank-1.json: params[0] (norm.weight, box offsets [0] extents [8]) and "
                                  "rank-0.json params[0] (norm.weight, box offsets [0] extents [8]) cover the "
                                  "same elements but disagree"),
            std::string::npos)
      << check_error(run);
}

TEST(ToRecordValidation, BoxesOverlappingPartially) {
  RunManifests run = founding_run(false);
  run.ranks[1].params.edit()[2].offsets = {1, 0};
  EXPECT_NE(check_error(run).find("overlaps rank 0's box"), std::string::npos) << check_error(run);
}

TEST(ToRecordValidation, ElementsHeldByNoRank) {
  RunManifests run = founding_run(false);
  run.ranks[1].params.edit()[2].logical_shape = {6, 8};
  run.ranks[0].params.edit()[2].logical_shape = {6, 8};
  EXPECT_NE(check_error(run).find("logical param fc1.weight [6,8]: the ranks hold 32 of its 48 elements"),
            std::string::npos)
      << check_error(run);
}

TEST(ToRecordValidation, DifferentOptimizerCounts) {
  RunManifests run = founding_run(false);
  run.ranks[1].optimizers.push_back(run.ranks[1].optimizers[0]);
  EXPECT_NE(check_error(run).find("rank-1.json: manifest.optimizers: 2 optimizers, but rank 0 has 1"),
            std::string::npos);
}

// ---- JSON ----

TEST(ManifestJson, WritingThenReadingGivesTheSameManifestInBothVersions) {
  const RunManifests run = founding_run(true);
  for (const RankManifest& m : run.ranks) {
    RunGroups fixed(run.groups);
    EXPECT_EQ(manifest_from_text(manifest_to_text(m, run.groups), "x", fixed), m);
    EXPECT_EQ(manifest_to_text(manifest_from_text(manifest_to_text(m, run.groups), "x", fixed), run.groups),
              manifest_to_text(m, run.groups));
    // Version 1 spells each group out; read back, the same lists (interned afresh).
    RunGroups grown;
    const RankManifest back = manifest_from_text(manifest_to_text(m, run.groups, 1), "x", grown);
    const std::vector<std::vector<int>> table = grown.take();
    for (const auto& [name, id] : m.groups)
      EXPECT_EQ(table[static_cast<std::size_t>(back.groups.at(name))], run.group(id)) << name;
    EXPECT_EQ(table[static_cast<std::size_t>(back.optimizers[0].stats_group)], run.group(m.optimizers[0].stats_group));
  }
}

// A version 1 file read on its own.
std::string read_error(const std::string& text) {
  try {
    RunGroups grown;
    manifest_from_text(text, "rank-0.json", grown);
  } catch (const ManifestError& error) {
    return error.what();
  }
  return "no error";
}

// The founding rank-0 manifest with `edit` applied to its JSON.
template <class Edit>
std::string edited(Edit edit) {
  const RunManifests run = founding_run(false);
  nlohmann::json j = manifest_to_json(run.ranks[0], run.groups, 1);
  edit(j);
  return j.dump();
}

TEST(ManifestJson, EachRuleOfVersionOneNamesTheFieldAndTheRule) {
  EXPECT_EQ(read_error("{"), read_error("{"));  // one line, below
  EXPECT_NE(read_error("{}").find("not a tally manifest"), std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["tally_manifest"] = 3; }))
                .find("manifest.tally_manifest: this tally reads manifest versions 1 and 2, got 3"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["tally_manifest"] = 2; }))
                .find("version 2 refers to the run's groups in groups.json, which the folder lacks"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["colour"] = 1; })).find("colour"), std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["rank"] = 2; })).find("manifest.rank"), std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["parallel"]["dp"] = 2; }))
                .find("manifest.parallel: tp*cp*pp*dp = 4 is not the world 2"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["groups"]["tp"] = {1}; }))
                .find("manifest.groups.tp: the group does not hold this manifest's own rank 0"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["groups"]["world"] = {1, 0}; }))
                .find("expected ranks in increasing order"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["groups"].erase("expt_tp"); }))
                .find("missing the group \"expt_tp\""),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["params"][2]["extents"] = {5, 8}; }))
                .find("manifest.params[2].extents[0]: the box overflows the logical shape: offset 0 + extent 5 > 4"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["params"][0]["logical_shape"] = {1, 1, 1, 1, 8}; }))
                .find("manifest.params[0].logical_shape"),
            std::string::npos)
      << read_error(edited([](auto& j) { j["params"][0]["logical_shape"] = {1, 1, 1, 1, 8}; }));
  EXPECT_NE(read_error(edited([](auto& j) { j["params"][0]["offsets"] = {0, 0}; }))
                .find("offsets and extents need one entry per dim"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["optimizers"][0]["main_params"][0]["end"] = 9; }))
                .find("manifest.optimizers[0].main_params[0]: expected 0 <= begin < end <= 8"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["optimizers"][0]["main_params"][0]["param"] = 3; }))
                .find("manifest.optimizers[0].main_params[0].param"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["params"][0]["stats"]["zeros"] = 9; }))
                .find("counts 9 zeros in 8 elements"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["producer"] = "a\nb"; }))
                .find("manifest.producer: a name may not hold control characters"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["params"][1]["logical_name"] = "x\ty"; }))
                .find("manifest.params[1].logical_name: a name may not hold control characters"),
            std::string::npos);
  EXPECT_NE(read_error(edited([](auto& j) { j["params"][0]["stats"]["sum_squares"] = -1; }))
                .find("expected a number >= 0"),
            std::string::npos);
  for (const std::string& message :
       {read_error("{"), read_error(edited([](auto& j) { j["params"][0]["name"] = "a\nb"; j["params"][0]["logical_name"] = 3; }))}) {
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.rfind("rank-0.json", 0), 0u) << message;
  }
}

}  // namespace
}  // namespace tally::manifest
