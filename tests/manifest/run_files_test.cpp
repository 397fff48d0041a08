// A run's folder (manifest/manifest_json.h, docs/manifest.md "Files"): version 2 (rank files
// refer to groups.json) and version 1 (rank files list their groups' ranks) read into the same
// manifests and the same verdict; the groups file's rules; reading on several threads gives what
// one thread gives and names the first bad file in rank order; replicas share one params list.
#include "manifest/manifest_json.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "manifest/to_record.h"
#include "tests/manifest/hand_built_runs.h"

namespace tally::manifest {
namespace {

namespace fs = std::filesystem;
using namespace hand_built;

const std::string kFixtures = std::string(TALLY_SOURCE_DIR) + "/tests/fixtures/manifests/";

// A fresh folder per test process (ctest runs tests in parallel processes).
class RunFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = fs::path(::testing::TempDir()) /
              ("tally-run-files-" + std::to_string(::getpid()) + "-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(folder_);
  }
  void TearDown() override { fs::remove_all(folder_); }
  std::string dir(const std::string& name) const { return (folder_ / name).string(); }

  fs::path folder_;
};

std::string load_error(const std::string& dir, unsigned threads = 0) {
  try {
    load_run(dir, threads);
  } catch (const ManifestError& error) {
    return error.what();
  }
  return "no error";
}

void write_text(const std::string& file, const std::string& text) { std::ofstream(file) << text; }

std::string read_text(const std::string& file) {
  std::ifstream in(file);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Each rank's groups as rank lists: equal runs whatever their table's order.
std::map<std::string, std::vector<int>> lists_of(const RunManifests& run, const RankManifest& m) {
  std::map<std::string, std::vector<int>> out;
  for (const auto& [name, id] : m.groups) out[name] = run.group(id);
  for (std::size_t c = 0; c < m.optimizers.size(); ++c) {
    const OptimizerRecord& o = m.optimizers[c];
    const std::string at = "optimizers[" + std::to_string(c) + "].";
    out[at + "stats_group"] = run.group(o.stats_group);
    if (o.tp_group) out[at + "tp_group"] = run.group(*o.tp_group);
    if (o.expert_tp_group) out[at + "expert_tp_group"] = run.group(*o.expert_tp_group);
  }
  return out;
}

// `one` (version 1) and `two` (version 2) hold the same ranks, groups, params and values.
void expect_same_run(const RunManifests& one, const RunManifests& two) {
  EXPECT_EQ(one.version, 1);
  EXPECT_EQ(two.version, 2);
  ASSERT_EQ(one.ranks.size(), two.ranks.size());
  for (std::size_t r = 0; r < one.ranks.size(); ++r) {
    EXPECT_EQ(lists_of(one, one.ranks[r]), lists_of(two, two.ranks[r]));
    EXPECT_EQ(one.ranks[r].params, two.ranks[r].params);
    EXPECT_EQ(one.ranks[r].reported, two.ranks[r].reported);
  }
}

TEST_F(RunFiles, VersionTwoWritesEachGroupOnceAndReadsBackTheSameRun) {
  const RunManifests run = distributed_run(5, 7);
  write_run(dir("v2"), run);
  ASSERT_TRUE(fs::exists(dir("v2") + "/groups.json"));
  const RunManifests back = load_run(dir("v2"));
  EXPECT_EQ(back.version, 2);
  EXPECT_EQ(back.groups, run.groups);
  EXPECT_EQ(back.ranks, run.ranks);
  // No rank file spells out a rank list.
  EXPECT_EQ(read_text(dir("v2") + "/rank-3.json").find("\"stats_group\": ["), std::string::npos);
}

// A rank's separate grad-norm group norms (reported.group_norms) are written and read back, and
// a bad one is an error naming the file and the group.
TEST_F(RunFiles, GroupNormsReadBackAndABadOneIsNamed) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) {
    m.params.edit()[0].attributes.grad_norm_group = "mtp";
    m.reported.group_norms["mtp"] = std::sqrt(8.0);
  }
  write_run(dir("run"), run);
  EXPECT_EQ(load_run(dir("run")).ranks, run.ranks);
  std::string text = read_text(dir("run") + "/rank-1.json");
  const std::size_t at = text.find("\"group_norms\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(text.find("\"mtp\"", at), 5, "\"mtp\": -1, \"x\"");
  write_text(dir("run") + "/rank-1.json", text);
  const std::string message = load_error(dir("run"));
  EXPECT_NE(message.find("rank-1.json: manifest.reported.group_norms.mtp"), std::string::npos) << message;
}

TEST_F(RunFiles, VersionOneAndTwoOfOneRunGiveTheSameManifestsAndVerdict) {
  for (bool fallback : {false, true}) {
    const RunManifests run = founding_run(fallback);
    write_run(dir("v1"), run, 1);
    write_run(dir("v2"), run, 2);
    EXPECT_FALSE(fs::exists(dir("v1") + "/groups.json"));
    const RunManifests one = load_run(dir("v1")), two = load_run(dir("v2"));
    expect_same_run(one, two);
    const CheckReport a = check_run(one), b = check_run(two);
    EXPECT_EQ(a.verdict.kind, b.verdict.kind);
    EXPECT_EQ(a.verdict.kind, fallback ? oracle::Verdict::Kind::fail : oracle::Verdict::Kind::pass);
    EXPECT_EQ(a.truth_norm, b.truth_norm);
  }
}

TEST_F(RunFiles, WritingVersionOneOverVersionTwoRemovesTheGroupsFile) {
  write_run(dir("run"), founding_run(false), 2);
  write_run(dir("run"), founding_run(false), 1);
  EXPECT_FALSE(fs::exists(dir("run") + "/groups.json"));
  EXPECT_EQ(load_run(dir("run")).version, 1);
}

// The real Megatron-core 0.16.1 runs, written by the adapter in both versions.
TEST(RealRuns, EachVersionTwoFixtureIsItsVersionOneTwin) {
  int runs = 0;
  for (const auto& entry : fs::directory_iterator(kFixtures + "megatron-core-0.16.1-v2")) {
    if (!entry.is_directory()) continue;
    SCOPED_TRACE(entry.path().string());
    ++runs;
    const RunManifests two = load_run(entry.path().string());
    const RunManifests one = load_run(kFixtures + "megatron-core-0.16.1/" + entry.path().filename().string());
    expect_same_run(one, two);
    EXPECT_EQ(check_run(one).verdict.kind, check_run(two).verdict.kind);
  }
  EXPECT_EQ(runs, 8);
}

TEST_F(RunFiles, GroupsFileRulesNameTheFileTheIndexAndTheRule) {
  const RunManifests run = founding_run(false);  // groups [0,1], [0], [1]
  write_run(dir("run"), run);
  const std::string groups = dir("run") + "/groups.json";
  // groups.json's text, and a fragment of the one-line error it must give.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"tally_groups": 2, "world": 2, "groups": [[0, 1], [0], [1], [0]]})",
       "groups.json: groups.groups[3]: repeats groups[1]"},
      {R"({"tally_groups": 2, "world": 2, "groups": [[1, 0], [0], [1]]})",
       "groups.groups[0][1]: expected ranks in increasing order"},
      {R"({"tally_groups": 2, "world": 2, "groups": [[0, 2], [0], [1]]})", "groups.groups[0][1]"},
      {R"({"tally_groups": 2, "world": 2, "groups": [[], [0], [1]]})", "groups.groups[0]: expected at least one rank"},
      {R"({"tally_groups": 3, "world": 2, "groups": []})", "groups.tally_groups: this tally reads groups version 2, got 3"},
      {R"({"world": 2, "groups": []})", "not a tally groups file"},
      // A rank file's index outside the table, or naming a group without its rank.
      {R"({"tally_groups": 2, "world": 2, "groups": [[0, 1], [0]]})",
       "rank-1.json: manifest.groups.expt_tp: groups.json holds 2 groups (indices 0 to 1), got 2"},
      {R"({"tally_groups": 2, "world": 2, "groups": [[0, 1], [1], [0]]})",
       "rank-0.json: manifest.groups.expt_tp: groups.json's groups[1] does not hold this manifest's own rank 0"},
      {R"({"tally_groups": 2, "world": 4, "groups": [[0, 1], [0], [1]]})", "manifest.world: 2, but groups.json says 4"},
  };
  for (const auto& [text, fragment] : cases) {
    write_text(groups, text);
    const std::string message = load_error(dir("run"));
    EXPECT_NE(message.find(fragment), std::string::npos) << text << "\n" << message;
  }
}

TEST_F(RunFiles, EveryFileOfARunHasOneVersion) {
  const RunManifests run = founding_run(false);
  write_run(dir("v1"), run, 1);
  write_run(dir("v2"), run, 2);
  fs::copy_file(dir("v1") + "/rank-1.json", dir("v2") + "/rank-1.json", fs::copy_options::overwrite_existing);
  EXPECT_NE(load_error(dir("v2")).find("rank-1.json: manifest.tally_manifest: version 1 in a version 2 run"),
            std::string::npos)
      << load_error(dir("v2"));
  fs::remove(dir("v2") + "/groups.json");
  EXPECT_NE(load_error(dir("v2")).find("rank-0.json: manifest.tally_manifest: version 2 refers to the run's "
                                       "groups in groups.json, which the folder lacks"),
            std::string::npos)
      << load_error(dir("v2"));
}

TEST_F(RunFiles, ParallelReadingGivesWhatOneThreadGivesAndNamesTheFirstBadFile) {
  const RunManifests run = distributed_run(5, 7);
  write_run(dir("run"), run);
  EXPECT_EQ(load_run(dir("run"), 1), load_run(dir("run"), 8));
  write_text(dir("run") + "/rank-3.json", "{");
  write_text(dir("run") + "/rank-1.json", "[]");
  for (unsigned threads : {1u, 2u, 8u}) {
    const std::string message = load_error(dir("run"), threads);
    EXPECT_NE(message.find("rank-1.json"), std::string::npos) << threads << ": " << message;
    EXPECT_EQ(message.find("rank-3.json"), std::string::npos) << threads << ": " << message;
  }
}

TEST_F(RunFiles, ReplicasReadShareOneParamsList) {
  RunManifests run = distributed_run(5, 7);  // TP 2 x DP 2: ranks 0, 2 and 1, 3 hold equal params
  write_run(dir("run"), run);
  const RunManifests back = load_run(dir("run"), 4);
  EXPECT_EQ(back.ranks[0].params.identity(), back.ranks[2].params.identity());
  EXPECT_EQ(back.ranks[1].params.identity(), back.ranks[3].params.identity());
  EXPECT_NE(back.ranks[0].params.identity(), back.ranks[1].params.identity());
}

}  // namespace
}  // namespace tally::manifest
