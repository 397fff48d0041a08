// Sweeps (fuzz/sweep.h) and known findings (fuzz/known.h).
#include "fuzz/sweep.h"

#include <gtest/gtest.h>

#include <map>

#include <set>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "fuzz/known.h"
#include "run/backend.h"
#include "run/run_case.h"
#include "run/target.h"
#include "run/target_run.h"
#include "topologies/rank_layout.h"

namespace tally::fuzz {
namespace {

TEST(Sweep, ConfigurationsWithTheSameGroupsAreOneLayout) {
  const SweepLayouts world4 = sweep_layouts(4);
  EXPECT_EQ(world4.configurations, 5016);
  EXPECT_EQ(world4.layouts.size(), 94u);
  std::int64_t covered = 0;
  for (const SweepLayout& l : world4.layouts) covered += l.configurations;
  EXPECT_EQ(covered, world4.configurations) << "every configuration belongs to one layout";
  // Pure data parallelism: all 120 orders give the same groups.
  EXPECT_GE(world4.layouts.front().configurations, 120);
  EXPECT_EQ(world4.layouts.front().config.tp * world4.layouts.front().config.ep * world4.layouts.front().config.pp, 1);
  // Layouts differ in some group of some family.
  const topologies::RankLayout a(world4.layouts[0].config), b(world4.layouts[1].config);
  bool differ = false;
  for (topologies::Family f : topologies::kAllFamilies)
    for (int r = 0; r < 4 && !differ; ++r)
      differ = std::vector<int>(a.group_ranks(f, r).begin(), a.group_ranks(f, r).end()) !=
               std::vector<int>(b.group_ranks(f, r).begin(), b.group_ranks(f, r).end());
  EXPECT_TRUE(differ);
}

TEST(Sweep, AFeatureWithoutAModelOnALayoutSaysWhy) {
  topologies::ParallelConfig c;
  c.world = 4;
  c.tp = 2;
  c.etp = 2;
  const SweepModel biases = sweep_model(c, SweepFeature::moe_expert_biases);
  EXPECT_FALSE(biases.model);
  EXPECT_NE(biases.why_none.find("bias"), std::string::npos) << biases.why_none;
  for (SweepFeature f : {SweepFeature::dense, SweepFeature::moe, SweepFeature::moe_shared_untied}) {
    const SweepModel m = sweep_model(c, f);
    ASSERT_TRUE(m.model) << sweep_feature_name(f) << ": " << m.why_none;
  }
}

TEST(Sweep, ShardsPartitionTheLayoutsAndTheirReportsMergeIntoTheWholeSweep) {
  run::SimBackend backend;
  const std::unique_ptr<run::Target> model = run::model_target(backend);
  SweepOptions whole;
  whole.world = 2;
  const SweepPlan all = plan_sweep(whole, *model);
  ASSERT_EQ(static_cast<std::int64_t>(all.cases.size()), all.total_cases);
  std::vector<SweepReport> reports;
  std::set<std::int64_t> seen;
  for (int shard = 0; shard < 3; ++shard) {
    SweepOptions part = whole;
    part.shard = shard;
    part.shards = 3;
    const SweepPlan plan = plan_sweep(part, *model);
    EXPECT_EQ(plan.total_cases, all.total_cases);
    SweepReport report;
    report.world = 2;
    report.target = "model";
    report.shard = shard;
    report.shards = 3;
    for (const SweepCase& sc : plan.cases) {
      EXPECT_TRUE(seen.insert(sc.index).second) << sc.id << " is in two shards";
      EXPECT_EQ(sc.layout % 3, shard) << sc.id << ": a layout's cases stay in one shard";
      report.results.push_back(run_sweep_case(sc, *model, {}));
    }
    reports.push_back(report);
  }
  EXPECT_EQ(static_cast<std::int64_t>(seen.size()), all.total_cases);
  const SweepReport merged = merge_sweep_reports(reports);
  ASSERT_EQ(merged.results.size(), all.cases.size());
  for (std::size_t i = 0; i < all.cases.size(); ++i) EXPECT_EQ(merged.results[i].id, all.cases[i].id);

  reports.pop_back();
  EXPECT_THROW(merge_sweep_reports(reports), std::invalid_argument) << "a shard missing";
  reports.push_back(reports.front());
  EXPECT_THROW(merge_sweep_reports(reports), std::invalid_argument) << "a shard given twice";
}

TEST(Sweep, OnTallysModelOnlyMegatronsOwnLayoutCornerFails) {
  run::SimBackend backend;
  const std::unique_ptr<run::Target> model = run::model_target(backend);
  SweepOptions o;
  o.world = 4;
  SweepRunOptions run;
  run.known = [](const casefile::Case& c, const oracle::Verdict& v) { return known_finding_of({}, false, c, v); };
  const SweepPlan plan = plan_sweep(o, *model);
  std::map<LayoutCorner, int> corners;
  for (const SweepCase& sc : plan.cases) {
    const SweepResult r = run_sweep_case(sc, *model, run);
    if (r.outcome == SweepResult::Outcome::pass) continue;
    ASSERT_EQ(r.outcome, SweepResult::Outcome::fail) << sc.id << ": " << r.detail;
    const LayoutCorner corner = megatron_layout_corner(sc.c.topology);
    ASSERT_NE(corner, LayoutCorner::none) << sc.id << " fails outside Megatron's layout corners: " << r.detail;
    EXPECT_EQ(r.known, megatron_layout_corner_finding(corner)) << sc.id;
    EXPECT_FALSE(megatron_layout_assumptions_hold(sc.c.topology)) << sc.id;
    ++corners[corner];
  }
  EXPECT_EQ(megatron_layout_corner_finding(LayoutCorner::experts_as_dense), kMegatronLayoutCorner);
  EXPECT_GT(corners[LayoutCorner::experts_as_dense], 0) << "world 4 has layouts of experts as dense, ETP groups unlike TP groups";
  EXPECT_GT(corners[LayoutCorner::instances_split_their_shards], 0) << "and of instances whose stats groups split their shards";
}

TEST(Sweep, AReportReadsBackAsItWasWrittenAndABadOneNamesTheField) {
  SweepReport r;
  r.world = 4;
  r.target = "deepspeed";
  r.version = "0.19.8";
  r.features = {"moe"};
  r.shard = 1;
  r.shards = 2;
  r.configurations = 5016;
  r.layouts = 94;
  r.total_cases = 10;
  r.results.push_back({3, "L001-moe-zero1-bf16", SweepResult::Outcome::fail, "fail: l2", "c/L001.json", "x.fail", 1.5,
                       true, "tally's model: pass; the release: fail: l2"});
  r.results.push_back({5, "L002-moe-zero3-bf16", SweepResult::Outcome::refused, "deepspeed.zero_stage 3 ...", "", "", 0.0,
                       false, ""});
  const SweepReport back = read_sweep_report(sweep_report_json(r).dump(), "state.json");
  EXPECT_EQ(back.world, 4);
  EXPECT_EQ(back.shard, 1);
  ASSERT_EQ(back.results.size(), 2u);
  EXPECT_EQ(back.results[0].known, "x.fail");
  EXPECT_EQ(back.results[1].outcome, SweepResult::Outcome::refused);
  EXPECT_TRUE(back.results[0].model_checked);
  EXPECT_EQ(back.results[0].model_disagrees, r.results[0].model_disagrees);
  EXPECT_FALSE(back.results[1].model_checked);
  nlohmann::ordered_json bad = sweep_report_json(r);
  bad["results"][0]["outcome"] = "flaky";
  try {
    read_sweep_report(bad.dump(), "state.json");
    FAIL() << "read an outcome that is none";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("state.json: sweep.results[0].outcome"), std::string::npos) << error.what();
  }
}

TEST(Sweep, ACorruptReportNamesItsFileOnce) {
  try {
    read_sweep_report("{\"tally_sweep\": 1,", "dir/sweep-state.json");
    FAIL() << "read a report that is cut off";
  } catch (const std::runtime_error& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.rfind("dir/sweep-state.json: ", 0), 0u) << message;
    EXPECT_EQ(message.find("dir/sweep-state.json", 1), std::string::npos) << "the path twice: " << message;
  }
}

TEST(Sweep, StopsWhenItsTargetsMachineryFailsInARowOrHalfTheTime) {
  EXPECT_FALSE(machinery_failing({}));
  EXPECT_FALSE(machinery_failing({true, true, false, true, true})) << "an error recorded and the sweep goes on";
  EXPECT_EQ(machinery_failing({false, true, true, true}), "three infrastructure errors in a row");
  std::vector<bool> alternating;
  for (int i = 0; i < 9; ++i) alternating.push_back(i % 2 == 0);
  EXPECT_FALSE(machinery_failing(alternating)) << "not yet ten cases to judge by";
  alternating.push_back(false);
  EXPECT_EQ(machinery_failing(alternating), "5 infrastructure errors in the last 10 cases");
  std::vector<bool> rare(30, false);
  rare[3] = rare[17] = rare[29] = true;
  EXPECT_FALSE(machinery_failing(rare)) << "a few errors among many passes";
}

// The release is played by tally's model without faults; its model by the same case with faults.
TEST(Sweep, TallysModelOfTheReleaseIsHeldAgainstEachCaseTheReleaseRuns) {
  run::SimBackend backend;
  const std::unique_ptr<run::Target> release = run::model_target(backend);
  SweepCase sc;
  sc.id = "founding-6099";
  sc.c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.fail.json");
  sc.c.expect.reset();
  sc.c.path.faults = {};
  const auto model_with = [](std::vector<vocab::Fault> faults) {
    return [faults](const casefile::Case& c) -> std::optional<oracle::Verdict> {
      casefile::Case m = c;
      for (vocab::Fault f : faults) m.path.faults = m.path.faults.with(f);
      return run::run_case(m);
    };
  };
  SweepRunOptions options;
  options.release_model = model_with({});
  SweepResult r = run_sweep_case(sc, *release, options);
  EXPECT_EQ(r.outcome, SweepResult::Outcome::pass);
  EXPECT_TRUE(r.model_checked);
  EXPECT_EQ(r.model_disagrees, "") << "the same verdict";

  options.release_model = model_with({vocab::Fault::expert_dedup_on_dense_tp});
  r = run_sweep_case(sc, *release, options);
  EXPECT_TRUE(r.model_checked);
  EXPECT_TRUE(r.model_disagrees.starts_with("tally's model: fail: ledger")) << r.model_disagrees;
  EXPECT_TRUE(r.model_disagrees.ends_with("; the release: pass")) << r.model_disagrees;

  options.release_model = [](const casefile::Case&) -> std::optional<oracle::Verdict> { return std::nullopt; };
  r = run_sweep_case(sc, *release, options);
  EXPECT_FALSE(r.model_checked) << "a case the model does not model is not held against it";
}

TEST(Sweep, TwoFailuresDisagreeWhenTheyMiscountOtherParamsOrOtherElements) {
  casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.fail.json");
  c.path.faults = vocab::FaultSet::of({vocab::Fault::expert_dedup_on_dense_tp});
  const oracle::Verdict dedup = run::run_case(c);
  ASSERT_EQ(dedup.kind, oracle::Verdict::Kind::fail);
  EXPECT_EQ(model_disagreement(dedup, dedup), std::nullopt);
  oracle::Verdict fewer = dedup;
  ASSERT_FALSE(fewer.miscounted.empty());
  fewer.miscounted.front().counted += 1;
  const std::optional<std::string> line = model_disagreement(dedup, fewer);
  ASSERT_TRUE(line.has_value()) << "the same param counted another number of times";
  EXPECT_NE(line->find(" params miscounted: "), std::string::npos) << *line;
  oracle::Verdict other = dedup;
  other.miscounted_total += 1;
  EXPECT_TRUE(model_disagreement(dedup, other).has_value()) << "another number of params miscounted";
  oracle::Verdict stats_only = dedup;
  stats_only.miscounted.clear();
  stats_only.miscounted_total = 0;
  EXPECT_TRUE(model_disagreement(dedup, stats_only).has_value()) << "one fails its ledger, the other does not";
  EXPECT_TRUE(model_disagreement(dedup, oracle::Verdict{}).has_value());
}

// The world-8 sweep of megatron-core 0.19.2 on one H200 (bench/RESULTS.md): with two
// distributed-optimizer instances in orders outside Megatron-LM's two, each stats group counts the
// halves of the buffers it holds twice and the others never, so which params are miscounted
// depends on where each param lies in the buffer (its start at a multiple of 64, buckets padded to
// lcm(D, 128), the shared embedding of PP 2 in a bucket of its own). tally's model of the release
// must miscount the same params the same number of times as the release's own manifests.
TEST(Sweep, TheReleaseModelLaysOutTheDistributedOptimizersBuffersAsTheReleaseDoes) {
  const run::FrameworkTarget* megatron = run::framework_target("megatron-core");
  ASSERT_NE(megatron, nullptr);
  const std::string folder = TALLY_SOURCE_DIR "/tests/fixtures/sweeps/megatron-core-0.19.2/";
  for (const char* name : {"world8-L002-dense-distributed-instances2", "world8-L012-moe-distributed-instances2",
                           "world8-L024-dense-distributed-instances2"}) {
    SCOPED_TRACE(name);
    const casefile::Case c = casefile::load_case_file(folder + name + ".json");
    const oracle::Verdict release = run::judge_target_run(c, folder + name + ".manifests", oracle::kFrameworkRtol);
    ASSERT_EQ(release.kind, oracle::Verdict::Kind::fail);
    const std::optional<casefile::Case> model_case = megatron->release_model_case(c, "0.19.2");
    ASSERT_TRUE(model_case.has_value());
    const std::optional<std::string> disagreement = model_disagreement(run::run_case(*model_case), release);
    EXPECT_EQ(disagreement, std::nullopt) << *disagreement;
  }
}

std::string miscountings_text(const std::set<Miscounting>& m) {
  std::string out;
  for (const Miscounting& one : m) out += (out.empty() ? "" : ", ") + describe(one);
  return "{" + out + "}";
}

std::string findings_text(const std::vector<KnownFinding>& known) {
  std::string out;
  for (const KnownFinding& k : known)
    out += "\n  " + k.name + " [" + k.path + "] " + miscountings_text(k.miscounts) + " failed " +
           ::testing::PrintToString(k.failed);
  return out;
}

TEST(Known, AFindingIsKnownOnItsOwnNormCodeWhenItFailsTheSameWay) {
  const std::vector<KnownFinding> known = load_known(TALLY_SOURCE_DIR "/seeds/real", "deepspeed", "0.19.8");
  ASSERT_FALSE(known.empty());
  EXPECT_TRUE(load_known(TALLY_SOURCE_DIR "/seeds/real", "deepspeed", "0.19.7").empty()) << "another release";
  const std::string file = TALLY_SOURCE_DIR "/seeds/real/deepspeed-0.19.8-zero-drops-expert-partitions-of-tp-ranks.fail.json";
  casefile::Case c = casefile::load_case_file(file);
  const oracle::Verdict verdict = run::judge_target_run(
      c, TALLY_SOURCE_DIR "/seeds/real/deepspeed-0.19.8-zero-drops-expert-partitions-of-tp-ranks.fail.manifests",
      oracle::kFrameworkRtol);
  const KnownFinding* k = known_as(known, c, verdict);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(known_path(c), k->path);
  // The same failure in another of DeepSpeed's norm codes is not that finding.
  c.deepspeed->zero_stage = 0;
  c.path.gradients.generator.dtype = kernels::Dtype::fp32;
  EXPECT_EQ(known_path(c), "clip_grad_norm_");
  const KnownFinding* elsewhere = known_as(known, c, verdict);
  EXPECT_TRUE(elsewhere == nullptr || elsewhere->path == "clip_grad_norm_");
  EXPECT_EQ(known_as(known, c, oracle::Verdict{}), nullptr) << "a pass repeats no finding";
}

// The world-4 sweep of megatron-core 0.19.2 on one H200 (bench/RESULTS.md): the written-up layout
// corner (saved with the plain optimizer) failing the same way under the distributed optimizer.
TEST(Known, AFindingOfMegatronsLayoutCornerIsKnownUnderEveryOptimizer) {
  const std::vector<KnownFinding> known = load_known(TALLY_SOURCE_DIR "/seeds/real", "megatron-core", "0.19.2");
  const std::string file = TALLY_SOURCE_DIR "/tests/fixtures/sweeps/megatron-core-0.19.2/L070-moe-distributed.json";
  casefile::Case c = casefile::load_case_file(file);
  ASSERT_TRUE(experts_as_dense_with_other_groups(c.topology));
  const oracle::Verdict verdict = run::judge_target_run(
      c, TALLY_SOURCE_DIR "/tests/fixtures/sweeps/megatron-core-0.19.2/L070-moe-distributed.manifests",
      oracle::kFrameworkRtol);
  ASSERT_EQ(verdict.kind, oracle::Verdict::Kind::fail);
  const KnownFinding* k = known_as(known, c, verdict);
  ASSERT_NE(k, nullptr) << "the corner's finding, saved with the plain optimizer, is this one too: "
                        << why_new(known, c, verdict) << "; it miscounts " << miscountings_text(miscountings(verdict))
                        << "; failed " << ::testing::PrintToString(run::failed_statistics(verdict)) << findings_text(known);
  EXPECT_EQ(k->name, "megatron-core-0.19.2-experts-as-dense-cp-before-tp.fail");
  EXPECT_NE(k->path, known_path(c)) << "another norm code";
  // Outside the corner a finding stays tied to its norm code.
  std::vector<KnownFinding> not_corner = known;
  for (KnownFinding& f : not_corner) f.corner = LayoutCorner::none;
  EXPECT_EQ(known_as(not_corner, c, verdict), nullptr);
}

// A campaign of megatron-core 0.19.2 on one H200 (bench/RESULTS.md): the layer-wise optimizer's
// dropped expert bias (saved with normal gradients, seen in the norm), here with all-zero
// gradients, seen in the zero count only. The same miscounted params are the same finding.
TEST(Known, ALedgerFindingIsKnownWhicheverStatisticShowsIt) {
  const std::vector<KnownFinding> known = load_known(TALLY_SOURCE_DIR "/seeds/real", "megatron-core", "0.19.2");
  const std::string folder = TALLY_SOURCE_DIR "/tests/fixtures/campaigns/megatron-core-0.19.2/";
  const casefile::Case c = casefile::load_case_file(folder + "layerwise-expert-bias-zeros-gradients.json");
  const oracle::Verdict verdict = run::judge_target_run(
      c, folder + "layerwise-expert-bias-zeros-gradients.manifests", oracle::kFrameworkRtol);
  ASSERT_EQ(verdict.kind, oracle::Verdict::Kind::fail);
  const FailureSignature signature = failure_signature(verdict);
  ASSERT_TRUE(signature.ledger);
  ASSERT_EQ(signature.statistic, "zeros");
  const KnownFinding* k = known_as(known, c, verdict);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->name, "megatron-core-0.19.2-layerwise-clips-with-the-miscounted-norm.fail");
  EXPECT_EQ(k->signature.statistic, "l2") << "the finding's saved run showed it in the norm";
  // A failure the miscount does not explain alone (a rank reported other than its ledger implies)
  // is also the statistic it fails.
  oracle::Verdict unexplained = verdict;
  oracle::StatisticCheck off_its_ledger;
  off_its_ledger.name = "zeros-ledger";
  off_its_ledger.ok = false;
  unexplained.stats.push_back(off_its_ledger);
  ASSERT_EQ(failure_signature(unexplained), signature);
  EXPECT_EQ(known_as(known, c, unexplained), nullptr);
  // Another miscounted kind is another defect, whatever the statistic.
  oracle::Verdict other_kind = verdict;
  for (oracle::Miscount& m : other_kind.miscounted) m.kind = "tensor-parallel shard (dim 0)";
  EXPECT_EQ(known_as(known, c, other_kind), nullptr);
  // A failure without a ledger miscount is matched by its statistic, and only by a finding without one.
  std::vector<KnownFinding> stats_only = known;
  oracle::Verdict no_ledger = verdict;
  no_ledger.miscounted.clear();
  no_ledger.miscounted_total = 0;
  const FailureSignature unledgered = failure_signature(no_ledger);
  for (KnownFinding& f : stats_only) f.miscounts.clear();
  for (KnownFinding& f : stats_only) f.signature = unledgered;
  for (KnownFinding& f : stats_only) f.signature.statistic = "l2";
  EXPECT_EQ(known_as(stats_only, c, no_ledger), nullptr) << "zeros is not l2 without a ledger to say why";
  for (KnownFinding& f : stats_only) f.signature.statistic = "zeros";
  EXPECT_NE(known_as(stats_only, c, no_ledger), nullptr);
  EXPECT_EQ(known_as(known, c, no_ledger), nullptr) << "a finding that miscounts does not explain a failure that does not";
}

// The forms of one finding: the layer-wise optimizer's dropped expert bias (#6099 on 0.19.2),
// saved from normal gradients in the main norm, is the same defect counted in MTP's own norm, in
// every element or some, in the zero count; the same kind counted the other way, or another
// kind beside it, is not.
TEST(Known, AFindingIsItsCauseWhateverFormItTakes) {
  const std::vector<KnownFinding> known = load_known(TALLY_SOURCE_DIR "/seeds/real", "megatron-core", "0.19.2");
  const std::string folder = TALLY_SOURCE_DIR "/tests/fixtures/campaigns/megatron-core-0.19.2/";
  const casefile::Case c = casefile::load_case_file(folder + "layerwise-expert-bias-zeros-gradients.json");
  const oracle::Verdict verdict =
      run::judge_target_run(c, folder + "layerwise-expert-bias-zeros-gradients.manifests", oracle::kFrameworkRtol);
  ASSERT_FALSE(verdict.miscounted.empty());
  const std::string finding = "megatron-core-0.19.2-layerwise-clips-with-the-miscounted-norm.fail";
  ASSERT_NE(known_as(known, c, verdict), nullptr);
  ASSERT_EQ(known_as(known, c, verdict)->name, finding);

  oracle::Verdict in_mtp = verdict;  // the bias of an MTP layer, in MTP's own norm
  for (oracle::Miscount& m : in_mtp.miscounted) m.param_class = m.kind + "; in the 'mtp' norm";
  oracle::StatisticCheck mtp_norm;
  mtp_norm.name = "mtp-l2";
  mtp_norm.ok = false;
  in_mtp.stats.push_back(mtp_norm);
  ASSERT_NE(known_as(known, c, in_mtp), nullptr);
  EXPECT_EQ(known_as(known, c, in_mtp)->name, finding);

  oracle::Verdict some_elements = verdict;  // "its elements counted from 0 to 1 times"
  for (oracle::Miscount& m : some_elements.miscounted) {
    m.param_class = m.kind + "; its elements counted from 0 to 1 times";
    m.most = 1;
  }
  EXPECT_NE(known_as(known, c, some_elements), nullptr);

  oracle::Verdict repeated = verdict;  // the same kind, counted twice instead of never
  for (oracle::Miscount& m : repeated.miscounted) m.least = m.most = 2;
  EXPECT_EQ(known_as(known, c, repeated), nullptr) << "the other direction is another defect";

  oracle::Verdict beside = verdict;  // a new defect beside the known one
  oracle::Miscount other = beside.miscounted.front();
  other.name = "decoder.layers.0.self_attention.linear_qkv.weight";
  other.kind = other.param_class = "tensor-parallel shard (dim 0)";
  other.least = other.most = 2;
  beside.miscounted.push_back(other);
  ++beside.miscounted_total;
  EXPECT_EQ(known_as(known, c, beside), nullptr) << "a new defect beside a known one stays new";
}

// ci/nightly-real's DeepSpeed campaign on one H200 (bench/RESULTS.md) called two failures new, each a
// written-up finding in a form no saved case showed; with those saved in seeds/real, the
// campaign's own (unshrunk) runs are known.
TEST(Known, TheNightlysDeepSpeedFailuresAreKnownFindings) {
  const std::vector<KnownFinding> known = load_known(TALLY_SOURCE_DIR "/seeds/real", "deepspeed", "0.19.8");
  const std::string folder = TALLY_SOURCE_DIR "/tests/fixtures/campaigns/deepspeed-0.19.8/";
  const std::pair<std::string, std::string> runs[] = {
      {"expert-tp-expert-bias-fused-adam", "deepspeed-0.19.8-expert-tp-counts-replicated-expert-bias-per-tp-rank-fused-adam.fail"},
      {"unfused-tp2-pp2-tied-fp16", "deepspeed-0.19.8-unfused-optimizer-drops-tp-shards-expert-tp-tp2-pp2-fp16.fail"},
  };
  for (const auto& [run, finding] : runs) {
    const casefile::Case c = casefile::load_case_file(folder + run + ".json");
    const oracle::Verdict verdict = run::judge_target_run(c, folder + run + ".manifests", oracle::kFrameworkRtol);
    ASSERT_EQ(verdict.kind, oracle::Verdict::Kind::fail) << run;
    const KnownFinding* k = known_as(known, c, verdict);
    ASSERT_NE(k, nullptr) << run << " miscounts " << miscountings_text(miscountings(verdict)) << "; failed "
                          << ::testing::PrintToString(run::failed_statistics(verdict)) << "; the findings: " << findings_text(known);
    EXPECT_EQ(k->name, finding);
  }
}

// The world-4 campaigns of issue 54 on one H200 (megatron-core 0.19.2, seed 40404; DeepSpeed 0.19.8,
// seed 40444; 120 s each): every failure a form of a written-up finding, none of them saved in
// seeds/real. By cause they are known: hybrid FSDP on MoE (the instance's own shards, and the
// expert biases of Megatron-FSDP's strategies), the zero count's TP duplicates with an FSDP-sharded
// router, ZeRO-1 CPU offload's dropped experts (DeepSpeedZeroOptimizer's code), FusedAdam's fp16
// norm beside expert TP's miscounts, and #8475's averaging behind a pipeline.
TEST(Known, TheWorld4CampaignsFailuresAreKnownByCause) {
  const std::pair<std::string, std::string> runs[] = {
      {"megatron-core-0.19.2/hybrid-fsdp-moe-tp2-ep2", ""},  // two known defects at once
      {"megatron-core-0.19.2/fsdp-optim-zero-count-router-tp2", ""},
      {"deepspeed-0.19.8/zero1-offload-drops-experts-of-tp-ranks", ""},
      {"deepspeed-0.19.8/fused-adam-fp16-tp2-pp2-expert-tp", ""},
      {"deepspeed-0.19.8/fp32-clip-pp2-ep2-averaged", "deepspeed-0.19.8-8475-clip-averages-rank-norms-pp2-stage-norms.fail"},
  };
  for (const auto& [run, finding] : runs) {
    const std::string file = TALLY_SOURCE_DIR "/tests/fixtures/campaigns/" + run;
    const casefile::Case c = casefile::load_case_file(file + ".json");
    const std::vector<KnownFinding> known =
        load_known(TALLY_SOURCE_DIR "/seeds/real", c.target->framework, c.target->version);
    const oracle::Verdict verdict = run::judge_target_run(c, file + ".manifests", oracle::kFrameworkRtol);
    ASSERT_EQ(verdict.kind, oracle::Verdict::Kind::fail) << run;
    const KnownFinding* k = known_as(known, c, verdict);
    ASSERT_NE(k, nullptr) << run << ": " << why_new(known, c, verdict);
    if (!finding.empty()) EXPECT_EQ(k->name, finding) << run;
  }
}

// The world-8 sweep's instances corner on one H200 (tally's saved runs of it, in forms the seeds do not
// show: PP 2 with the release counting the embedding twice; 4 instances): known by the corner's
// findings, and only by them, whatever the norm code, since the defect is in the groups.
TEST(Known, FailuresWhereInstancesSplitTheirShardsAreKnownByThatCornersFindingsOnly) {
  for (const std::string run : {"world8-instances2-moe-order-cp-ep-dp-tp-pp", "world8-instances4-dense-order-cp-ep-dp-tp-pp"}) {
    const std::string file = TALLY_SOURCE_DIR "/tests/fixtures/campaigns/megatron-core-0.19.2/" + run;
    const casefile::Case c = casefile::load_case_file(file + ".json");
    ASSERT_EQ(megatron_layout_corner(c.topology), LayoutCorner::instances_split_their_shards) << run;
    std::vector<KnownFinding> known = load_known(TALLY_SOURCE_DIR "/seeds/real", "megatron-core", "0.19.2");
    const oracle::Verdict verdict = run::judge_saved_run_of(c, file + ".manifests", oracle::kFrameworkRtol);
    ASSERT_EQ(verdict.kind, oracle::Verdict::Kind::fail) << run;
    const KnownFinding* k = known_as(known, c, verdict);
    ASSERT_NE(k, nullptr) << run << ": " << why_new(known, c, verdict);
    EXPECT_TRUE(k->name.starts_with("megatron-core-0.19.2-dist-opt-instances-split-their-shards")) << run << ": " << k->name;
    std::erase_if(known, [](const KnownFinding& f) { return f.corner == LayoutCorner::instances_split_their_shards; });
    EXPECT_EQ(known_as(known, c, verdict), nullptr) << run << " is known without the corner's findings";
  }
}

}  // namespace
}  // namespace tally::fuzz
