// Sweeps (fuzz/sweep.h) and known findings (fuzz/known.h).
#include "fuzz/sweep.h"

#include <gtest/gtest.h>

#include <algorithm>

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

// Every feature and every preset by default; naming features or presets sweeps only those named.
TEST(Sweep, SweepsThePresetsBesideTheFeatures) {
  run::SimBackend backend;
  const std::unique_ptr<run::Target> model = run::model_target(backend);
  const SweepPlan every = plan_sweep({.world = 2}, *model);
  EXPECT_EQ(every.models, (std::vector<std::string>{"dense", "moe", "moe-expert-biases", "moe-shared-untied", "llama3",
                                                     "mixtral", "qwen3-moe", "gpt-oss", "deepseek-v3"}));
  const auto ids_with = [](const SweepPlan& plan, const std::string& part) {
    return std::count_if(plan.cases.begin(), plan.cases.end(),
                         [&](const SweepCase& c) { return c.id.find(part) != std::string::npos; });
  };
  EXPECT_GT(ids_with(every, "-gpt-oss-"), 0);
  EXPECT_GT(ids_with(every, "-deepseek-v3-"), 0);
  for (const SweepCase& c : every.cases) {
    if (c.id.find("-qwen3-moe-") != std::string::npos) EXPECT_EQ(c.c.model.preset, "qwen3-moe");
    if (c.id.find("-deepseek-v3-") != std::string::npos) EXPECT_TRUE(c.c.model.multi_latent_attention);
  }

  const SweepPlan features = plan_sweep({.world = 2, .features = {SweepFeature::dense}}, *model);
  EXPECT_EQ(features.models, std::vector<std::string>{"dense"});
  const SweepPlan presets = plan_sweep({.world = 2, .presets = {topologies::Preset::mixtral}}, *model);
  EXPECT_EQ(presets.models, std::vector<std::string>{"mixtral"});
  EXPECT_EQ(ids_with(presets, "-mixtral-"), static_cast<std::int64_t>(presets.cases.size()));
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
  sc.c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.fail.json", run::case_frameworks());
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
  casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.fail.json", run::case_frameworks());
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
    const casefile::Case c = casefile::load_case_file(folder + name + ".json", run::case_frameworks());
    const oracle::Verdict release = run::judge_target_run(c, folder + name + ".manifests", oracle::kFrameworkRtol);
    ASSERT_EQ(release.kind, oracle::Verdict::Kind::fail);
    const std::optional<casefile::Case> model_case = megatron->release_model_case(c, "0.19.2");
    ASSERT_TRUE(model_case.has_value());
    const std::optional<std::string> disagreement = model_disagreement(run::run_case(*model_case), release);
    EXPECT_EQ(disagreement, std::nullopt) << *disagreement;
  }
}

}  // namespace
}  // namespace tally::fuzz
