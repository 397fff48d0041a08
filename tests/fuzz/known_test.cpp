// Known findings (fuzz/known.h, fuzz/findings.h): a failure is known only where a finding's cause
// acts, and only in the ways it miscounts there.
#include "fuzz/known.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <tuple>

#include "casefile/case_file.h"
#include "fuzz/findings.h"
#include "fuzz/generators.h"
#include "fuzz/known_measure.h"
#include "gradnorm/releases.h"
#include "manifest/manifest.h"
#include "run/deepspeed/section.h"
#include "run/model_manifests.h"
#include "run/run_case.h"
#include "run/target.h"
#include "run/target_run.h"
#include "tests/support/json_schema.h"
#include "vocab/faults.h"
#include "vocab/optimizer_models.h"

namespace tally::fuzz {
namespace {

namespace fs = std::filesystem;

const std::string kSeeds = TALLY_SOURCE_DIR "/seeds/real";
const std::string kCampaigns = TALLY_SOURCE_DIR "/tests/fixtures/campaigns/";

std::string names_of(const std::vector<KnownFinding>& known) {
  std::string out;
  for (const KnownFinding& k : known) out += "\n  " + k.name();
  return out;
}

std::string joined(const Explanation& e) {
  std::string out;
  for (const std::string& name : e.findings) out += (out.empty() ? "" : " + ") + name;
  return out.empty() ? "NEW: " + e.why_new : out;
}

// The run saved next to `file` (its case file's manifests), judged again.
oracle::Verdict saved_verdict(const casefile::Case& c, const std::string& file) {
  return run::judge_saved_run_of(c, (fs::path(file).parent_path() / c.target->manifests).string(), oracle::kFrameworkRtol);
}

casefile::Case as_megatron_core(casefile::Case c, std::string version = "0.19.2") {
  c.target = casefile::RealTarget{"megatron-core", version, ""};
  return c;
}

TEST(FindingFiles, ConditionsAreSizesComparedOrFeatures) {
  casefile::Case c;
  c.topology = {.world = 8, .tp = 2, .ep = 2, .etp = 1};
  EXPECT_TRUE(holds(parse_condition("tp > 1"), c));
  EXPECT_TRUE(holds(parse_condition("ep * etp == tp"), c));
  EXPECT_FALSE(holds(parse_condition("tp != ep * etp"), c));
  EXPECT_TRUE(holds(parse_condition("dp_cp == 4"), c));
  EXPECT_TRUE(holds(parse_condition("not experts"), c)) << "the default model has none";
  EXPECT_TRUE(holds(parse_condition("fp32"), c));
  EXPECT_THROW(parse_condition("tp >"), std::invalid_argument);
  EXPECT_THROW(parse_condition("tpp > 1"), std::invalid_argument);
  EXPECT_THROW(parse_condition("tp + 1 > 1"), std::invalid_argument);
  EXPECT_THROW(parse_condition("wings"), std::invalid_argument);
}

TEST(FindingFiles, AMalformedFileIsAnErrorNamingTheFieldAndTheRule) {
  const fs::path dir = fs::path(::testing::TempDir()) / "malformed-findings";
  fs::create_directories(dir);
  const auto write = [&](const std::string& text) {
    std::ofstream(dir / "x.finding.json") << text;
    return (dir / "x.finding.json").string();
  };
  const std::string base = R"("tally_finding": 1, "framework": "megatron-core", "version": "0.19.2", "source": "s", )";
  try {
    read_finding_file(write("{" + base + R"("corner": {"norm_codes": ["plain"], "needs": ["tp >> 1"]}, "miscounts": [], "saved_runs": []})"));
    ADD_FAILURE() << "read a bad condition";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("corner.needs[0]"), std::string::npos) << e.what();
  }
  try {
    read_finding_file(write("{" + base + R"("cause": "fault no-such", "corner": {"norm_codes": ["plain"]}, "miscounts": [], "saved_runs": []})"));
    ADD_FAILURE() << "read an unknown fault";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no fault of the catalog"), std::string::npos) << e.what();
  }
  try {
    read_finding_file(write("{" + base + R"("corner": {"norm_codes": []}, "miscounts": [], "saved_runs": []})"));
    ADD_FAILURE() << "read a corner without a norm code";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("norm_codes"), std::string::npos) << e.what();
  }
  const FindingFile f =
      read_finding_file(write("{" + base + R"("corner": {"norm_codes": ["plain"]}, "miscounts": [{"kind": "any", "counted": "more", "in": "zero count"}], "saved_runs": []})"));
  EXPECT_EQ(f.name, "x");
  ASSERT_EQ(f.miscounts.size(), 1u);
  EXPECT_EQ(f.miscounts[0].in, LedgerFamily::zero_count);
}

// The finding files in seeds/real, and a file with every field the schema names, against
// docs/schemas/finding.schema.json; a field the schema lacks is refused by name.
TEST(FindingFiles, TheSchemaAndTheReaderNameTheSameFields) {
  const nlohmann::json schema = testing::load_json_file(TALLY_SOURCE_DIR "/docs/schemas/finding.schema.json");
  int files = 0;
  for (const auto& entry : fs::directory_iterator(kSeeds))
    if (entry.path().string().ends_with(".finding.json")) {
      ++files;
      const std::vector<std::string> errors = testing::schema_errors(schema, testing::load_json_file(entry.path().string()));
      EXPECT_TRUE(errors.empty()) << entry.path() << ": " << (errors.empty() ? "" : errors.front());
    }
  EXPECT_GE(files, 20);
  const fs::path dir = fs::path(::testing::TempDir()) / "schema-findings";
  fs::create_directories(dir);
  nlohmann::json full = testing::full_instance(schema);
  std::ofstream(dir / "full.finding.json") << full.dump();
  EXPECT_NO_THROW(read_finding_file((dir / "full.finding.json").string()));
  full["seen_on"] = "H200";
  std::ofstream(dir / "more.finding.json") << full.dump();
  EXPECT_THROW(read_finding_file((dir / "more.finding.json").string()), std::runtime_error);
}

// Every saved failing run of a real framework in seeds/real belongs to a written-up finding (or a
// public report), which states its corner; each is known by its own finding, and only by findings
// of its release.
TEST(KnownFindings, EverySavedRunIsKnownByTheFindingThatClaimsIt) {
  std::set<std::pair<std::string, std::string>> releases;
  for (const auto& entry : fs::directory_iterator(kSeeds))
    if (entry.path().string().ends_with(".finding.json")) {
      const FindingFile f = read_finding_file(entry.path().string());
      releases.emplace(f.framework, f.version);
    }
  ASSERT_TRUE(releases.contains({"megatron-core", "0.19.2"}));
  ASSERT_TRUE(releases.contains({"megatron-core", "0.16.1"}));
  ASSERT_TRUE(releases.contains({"deepspeed", "0.19.8"}));
  int runs = 0;
  for (const auto& [framework, version] : releases) {
    const std::vector<KnownFinding> known = load_known(kSeeds, framework, version);
    for (const KnownFinding& k : known) {
      EXPECT_FALSE(k.only_layout) << k.spec.file << ": a saved failing run no finding file claims";
      for (const SavedRun& r : k.runs) {
        ++runs;
        const casefile::Case c = casefile::load_case_file(r.file, run::case_frameworks());
        const Explanation e = explain(known, c, saved_verdict(c, r.file));
        EXPECT_NE(std::find(e.findings.begin(), e.findings.end(), k.name()), e.findings.end())
            << r.file << " of " << k.name() << ": " << joined(e);
      }
    }
  }
  EXPECT_GE(runs, 40);
}

// tally's model of each release it models has a finding for each of its causes: every fault of
// its rules and Megatron-LM's two layout corners.
TEST(KnownFindings, EveryCauseOfAReleaseModelIsAFinding) {
  for (const gradnorm::ReleaseInfo& info : gradnorm::megatron_releases()) {
    const std::vector<KnownFinding> known = load_known(kSeeds, "megatron-core", info.name);
    const auto claimed = [&](auto&& is_cause) {
      return std::any_of(known.begin(), known.end(), [&](const KnownFinding& k) { return is_cause(k.spec); });
    };
    for (const vocab::OptimizerModelInfo& optimizer : vocab::optimizer_models())
      for (const vocab::FaultInfo& fault : vocab::fault_catalog())
        if (gradnorm::release_faults(info.release, optimizer.model).has(fault.fault)) {
          EXPECT_TRUE(claimed([&](const FindingFile& f) { return f.fault == fault.fault; }))
              << info.name << ": no finding file's cause is " << fault.name << names_of(known);
        }
    for (LayoutCorner corner : {LayoutCorner::experts_as_dense, LayoutCorner::instances_split_their_shards})
      EXPECT_TRUE(claimed([&](const FindingFile& f) { return f.layout_corner == corner; }))
          << info.name << ": no finding file's cause is " << layout_corner_id(corner);
  }
}

// ci/nightly-real's DeepSpeed campaign and the world-4 campaigns of issue 54 on one H200
// (bench/RESULTS.md): forms of written-up findings no saved run shows; hybrid FSDP on MoE is two
// findings at once (the instance's own shards, and the expert biases of Megatron-FSDP's strategies).
TEST(KnownFindings, TheNightsFailuresAreKnownByCause) {
  const std::pair<std::string, std::string> runs[] = {
      {"deepspeed-0.19.8/expert-tp-expert-bias-fused-adam", "deepspeed-0.19.8-expert-tp-counts-replicated-expert-bias-per-tp-rank"},
      {"deepspeed-0.19.8/unfused-tp2-pp2-tied-fp16", "deepspeed-0.19.8-unfused-optimizer-drops-tp-shards"},
      {"deepspeed-0.19.8/zero1-offload-drops-experts-of-tp-ranks", "deepspeed-0.19.8-zero-drops-expert-partitions-of-tp-ranks"},
      {"deepspeed-0.19.8/fused-adam-fp16-tp2-pp2-expert-tp",
       "deepspeed-0.19.8-expert-tp-counts-replicated-expert-bias-per-tp-rank + deepspeed-0.19.8-fp16-zero0-loss-never-scaled"},
      {"deepspeed-0.19.8/fp32-clip-pp2-ep2-averaged", "deepspeed-0.19.8-8475-clip-averages-rank-norms"},
      {"megatron-core-0.19.2/hybrid-fsdp-moe-tp2-ep2",
       "megatron-core-0.19.2-fsdp-expert-bias-dense-tp + megatron-core-0.19.2-hybrid-fsdp-counts-one-instance"},
      {"megatron-core-0.19.2/fsdp-optim-zero-count-router-tp2", "megatron-core-0.19.2-fsdp-zero-count-tp-duplicates"},
      {"megatron-core-0.19.2/layerwise-expert-bias-zeros-gradients", "megatron-core-0.19.2-layerwise-expert-bias"},
      {"megatron-core-0.19.2/world8-instances2-moe-order-cp-ep-dp-tp-pp", "megatron-core-0.19.2-dist-opt-instances-split-their-shards"},
      {"megatron-core-0.19.2/world8-instances4-dense-order-cp-ep-dp-tp-pp", "megatron-core-0.19.2-dist-opt-instances-split-their-shards"},
      // Before megatron-core's reduction (an H100, 2026-12-07): the dense gradients held wrong
      // (held-gradients), which the finding's saved dense run shows too; its MoE form is known by it.
      {"megatron-core-0.19.2/world8-instances2-moe-unreduced-order-tp-cp-dp-ep-pp",
       "megatron-core-0.19.2-dist-opt-instances-split-their-shards"},
  };
  for (const auto& [run, expected] : runs) {
    const std::string file = kCampaigns + run + ".json";
    const casefile::Case c = casefile::load_case_file(file, run::case_frameworks());
    const std::vector<KnownFinding> known = load_known(kSeeds, c.target->framework, c.target->version);
    const oracle::Verdict verdict = saved_verdict(c, file);
    ASSERT_EQ(verdict.kind, oracle::Verdict::Kind::fail) << run;
    EXPECT_EQ(joined(explain(known, c, verdict)), expected) << run;
  }
}

// On a case tally's model of the release runs, the model decides: the layer-wise optimizer's
// dropped expert bias (#6099), with all-zero gradients seen in the zero count only, is that
// finding; the same params counted otherwise, or another param miscounted beside them, is what the
// release does not do there: new.
TEST(KnownFindings, WhereTheReleaseIsModelledAFailureIsKnownOnlyAsTheModelGivesIt) {
  const std::string file = kCampaigns + "megatron-core-0.19.2/layerwise-expert-bias-zeros-gradients.json";
  const casefile::Case c = casefile::load_case_file(file, run::case_frameworks());
  const std::vector<KnownFinding> known = load_known(kSeeds, "megatron-core", "0.19.2");
  const oracle::Verdict verdict = saved_verdict(c, file);
  ASSERT_FALSE(verdict.miscounted.empty());
  EXPECT_EQ(joined(explain(known, c, verdict)), "megatron-core-0.19.2-layerwise-expert-bias");

  oracle::Verdict repeated = verdict;  // the same params, counted twice instead of never
  for (oracle::Miscount& m : repeated.miscounted) m.least = m.most = 2 * (m.expected / std::max<std::int64_t>(m.numel, 1));
  const Explanation other_way = explain(known, c, repeated);
  EXPECT_TRUE(other_way.findings.empty());
  EXPECT_NE(other_way.why_new.find("tally's model of megatron-core 0.19.2 gives"), std::string::npos) << other_way.why_new;

  oracle::Verdict beside = verdict;  // a new defect beside the known one
  oracle::Miscount other = beside.miscounted.front();
  other.name = "decoder.layers.0.self_attention.linear_qkv.weight";
  other.kind = other.param_class = "tensor-parallel shard (dim 0)";
  other.least = other.most = 2 * (other.expected / std::max<std::int64_t>(other.numel, 1));
  beside.miscounted.push_back(other);
  ++beside.miscounted_total;
  EXPECT_TRUE(explain(known, c, beside).findings.empty()) << "a new defect beside a known one stays new";

  // A case without its target section (a campaign's, before it is saved) is the findings' framework's.
  casefile::Case unsectioned = c;
  unsectioned.target.reset();
  EXPECT_EQ(joined(explain(known, unsectioned, verdict)), "megatron-core-0.19.2-layerwise-expert-bias");

  // Without the finding of its cause, its form is no other finding's.
  std::vector<KnownFinding> without = known;
  std::erase_if(without, [](const KnownFinding& k) { return k.name() == "megatron-core-0.19.2-layerwise-expert-bias"; });
  EXPECT_TRUE(explain(without, c, verdict).findings.empty());
}

// Where tally does not model the release (Megatron-FSDP), the stated corner and miscounts decide:
// the zero count's TP duplicates are known in any Megatron-FSDP strategy at TP > 1, counted more;
// the same param counted fewer times is not that finding, nor is the form at TP 1.
TEST(KnownFindings, WhereTheReleaseIsNotModelledTheStatedCornerDecides) {
  const std::string file = kCampaigns + "megatron-core-0.19.2/fsdp-optim-zero-count-router-tp2.json";
  const casefile::Case c = casefile::load_case_file(file, run::case_frameworks());
  const std::vector<KnownFinding> known = load_known(kSeeds, "megatron-core", "0.19.2");
  const oracle::Verdict verdict = saved_verdict(c, file);
  ASSERT_EQ(joined(explain(known, c, verdict)), "megatron-core-0.19.2-fsdp-zero-count-tp-duplicates");
  oracle::Verdict fewer = verdict;
  for (oracle::Miscount& m : fewer.miscounted) m.least = m.most = 0;
  EXPECT_TRUE(explain(known, c, fewer).findings.empty());
  casefile::Case tp1 = c;
  tp1.topology.tp = 1;
  tp1.topology.etp = 1;
  EXPECT_TRUE(explain(known, tp1, verdict).findings.empty()) << "outside the corner";
  // A failure of a statistic no miscount makes needs a saved run failing it.
  oracle::Verdict off_ledger = verdict;
  oracle::StatisticCheck zeros_ledger;
  zeros_ledger.name = "zeros-ledger";
  zeros_ledger.ok = false;
  off_ledger.stats.push_back(zeros_ledger);
  const Explanation e = explain(known, c, off_ledger);
  EXPECT_TRUE(e.findings.empty());
  EXPECT_NE(e.why_new.find("zeros-ledger failing"), std::string::npos) << e.why_new;
}

// A DeepSpeed finding is tied to DeepSpeed's code that computes the norm: the same miscount under
// another optimizer is another defect.
TEST(KnownFindings, AFindingIsTiedToItsNormCode) {
  const std::string file = kSeeds + "/deepspeed-0.19.8-zero-drops-expert-partitions-of-tp-ranks.fail.json";
  casefile::Case c = casefile::load_case_file(file, run::case_frameworks());
  const std::vector<KnownFinding> known = load_known(kSeeds, "deepspeed", "0.19.8");
  EXPECT_TRUE(load_known(kSeeds, "deepspeed", "0.19.7").empty()) << "another release";
  const oracle::Verdict verdict = saved_verdict(c, file);
  EXPECT_EQ(joined(explain(known, c, verdict)), "deepspeed-0.19.8-zero-drops-expert-partitions-of-tp-ranks");
  run::kDeepSpeedSection.change(c, [&](run::DeepSpeedConfig& d) { d.zero_stage = 3; });
  EXPECT_EQ(known_path(c), "DeepSpeedZeroOptimizer_Stage3");
  EXPECT_TRUE(explain(known, c, verdict).findings.empty());
  EXPECT_TRUE(explain(known, c, oracle::Verdict{}).findings.empty()) << "a pass is no finding";
}

// Issue 64's smallest miss: world 2, TP 2, one instance, a one-layer dense GPT, the distributed
// optimizer, with no-dedup-filter planted (NeMo-RL #3788's class): the position embedding counted
// twice in the stats group [0,1] is no finding of 0.19.2, whatever the optimizer.
TEST(KnownFindings, APlantedFaultThatIsNoFindingIsNew) {
  const std::vector<KnownFinding> known = load_known(kSeeds, "megatron-core", "0.19.2");
  casefile::Case c;
  c.topology = {.world = 2, .tp = 2, .etp = 2};
  c.model.num_layers = 1;
  c.model.hidden_size = 8;
  c.model.num_attention_heads = 2;
  c.model.vocab_size = 8;
  c.model.max_position_embeddings = 4;
  for (vocab::OptimizerModel optimizer : {vocab::OptimizerModel::distributed, vocab::OptimizerModel::plain}) {
    c.path.optimizer = optimizer;
    const casefile::Case real = as_megatron_core(c);
    const oracle::Verdict verdict = stand_in_run(real, vocab::FaultSet::of({vocab::Fault::no_dedup_filter}));
    ASSERT_EQ(verdict.kind, oracle::Verdict::Kind::fail);
    const Explanation e = explain(known, real, verdict);
    EXPECT_TRUE(e.findings.empty()) << vocab::optimizer_model_name(optimizer) << ": " << joined(e);
  }
}

// The matcher in both directions, the short form (fuzz/known_measure.h; bench/known_matcher_bench
// is the long one, at worlds 2, 4 and 8).
TEST(KnownFindings, PlantedFaultsAreNeverKnownAndTheReleaseModelIsAlwaysKnown) {
  for (const std::string version : {"0.19.2", "0.16.1"}) {
    const std::vector<KnownFinding> known = load_known(kSeeds, "megatron-core", version);
    for (int world : {2, 4}) {
      const MatcherMeasure m = measure_known_matcher(known, version, world, 40, 7);
      std::int64_t in_release = 0, alone = 0, misses = 0, coincidences = 0;
      for (const auto& [fault, n] : m.in_release) in_release += n.failures, misses += n.known;
      for (const auto& [fault, n] : m.alone) alone += n.failures, misses += n.known, coincidences += n.coincidences;
      std::cout << version << " world " << world << ": " << m.cases << " cases, the release failed " << m.release_failures
                << " (new " << m.release_new << "), planted in the release " << in_release << ", planted alone " << alone
                << " (known by coincidence " << coincidences << "), misses " << misses << "\n";
      std::string lines;
      for (const std::string& line : m.misses) lines += "\n  " + line;
      EXPECT_EQ(m.release_new + misses, 0) << lines;
      EXPECT_GT(in_release, 50);
      EXPECT_GT(alone, 50);
      EXPECT_LT(coincidences * 20, alone);
    }
  }
}

}  // namespace
}  // namespace tally::fuzz
