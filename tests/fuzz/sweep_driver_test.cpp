// A sweep's run (fuzz/sweep_driver.h): it resumes only what its state holds of the same sweep and
// the same cases, matching the state's new failures again against today's known findings; writes
// its state as cases end, stops on a lane whose machinery keeps failing, refuses lanes of
// different releases, and tells its observers in order.
#include "fuzz/sweep_driver.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "io/json_read.h"
#include "run/backend.h"
#include "tests/support/model_lane.h"

namespace tally::fuzz {
namespace {

namespace fs = std::filesystem;

// tally's model, or after `healthy` cases a machinery that gives no verdict; of the release `version`.
class Lane : public testing::ModelLane {
 public:
  Lane(run::Backend& backend, std::string version = "", std::int64_t healthy = -1)
      : ModelLane(backend), version_(std::move(version)), healthy_(healthy) {}
  const run::TargetAbilities& open(int world) override {
    abilities_ = ModelLane::open(world);
    if (!version_.empty()) abilities_.version = version_;
    return abilities_;
  }
  run::TargetRun execute(const casefile::Case& c, bool keep_record) override {
    if (healthy_ >= 0 && executed_++ >= healthy_) {
      run::TargetRun broken;
      broken.verdict.kind = oracle::Verdict::Kind::infra_error;
      broken.verdict.infra_call = "the stand-in's worker";
      broken.verdict.infra_message = "gone (as the test asks)";
      return broken;
    }
    return ModelLane::execute(c, keep_record);
  }

 private:
  std::string version_;
  std::int64_t healthy_, executed_ = 0;
  run::TargetAbilities abilities_;
};

// What the observers hear, as one line per call.
class Heard : public SweepObserver {
 public:
  void case_done(const SweepCase& sc, const SweepResult& r, const SweepProgress& p) override {
    lines.push_back("case " + sc.id + " " + std::string(sweep_outcome_name(r.outcome)) + " " + std::to_string(p.done) + "/" +
                    std::to_string(p.planned));
  }
  void failure_saved(const SweepCase& sc, const casefile::Case&, const oracle::Verdict&, const std::string& file) override {
    lines.push_back("saved " + sc.id + (file.empty() ? "" : " to a file"));
  }
  void machinery_stops(const std::string& why, std::size_t lane, std::size_t) override {
    lines.push_back("stops: " + why + " (lane " + std::to_string(lane) + ")");
  }
  void finished(const SweepEnd& end) override { lines.push_back("finished " + std::to_string(end.report.results.size())); }
  std::vector<std::string> lines;
};

struct Sweep {
  run::SimBackend backend;
  Lane lane{backend};
  fs::path dir = fs::temp_directory_path() / ("tally-sweep-driver-" + std::to_string(::getpid()) + "-" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  SweepDrive drive;
  Sweep() {
    fs::remove_all(dir);
    drive.plan = plan_sweep({.world = 2, .features = {SweepFeature::dense}}, lane);
    drive.head = sweep_report_head(drive.plan, 2, "model", "test", 0, 1);
    drive.state_file = default_sweep_state_file(dir.string(), 0, 1);
    drive.run.corpus_dir = dir.string();
  }
  ~Sweep() { fs::remove_all(dir); }
};

TEST(SweepDriver, RunsEveryCaseWritesItsStateAndTellsTheObserversInOrder) {
  Sweep s;
  Heard heard;
  run::Target* lanes[] = {&s.lane};
  const SweepEnd end = drive_sweep(s.drive, lanes, heard, [] { return false; });
  ASSERT_FALSE(end.error);
  EXPECT_FALSE(end.stopped);
  EXPECT_EQ(end.not_run, 0);
  ASSERT_EQ(end.report.results.size(), s.drive.plan.cases.size());
  ASSERT_EQ(heard.lines.size(), s.drive.plan.cases.size() + 1);
  EXPECT_EQ(heard.lines.front(), "case " + s.drive.plan.cases[0].id + " pass 1/" + std::to_string(s.drive.plan.cases.size()));
  EXPECT_EQ(heard.lines.back(), "finished " + std::to_string(s.drive.plan.cases.size()));
  const SweepReport state = read_sweep_report(io::read_bounded_file(s.drive.state_file, 1 << 24, "state"), s.drive.state_file);
  EXPECT_EQ(state.results.size(), s.drive.plan.cases.size()) << "the state holds what ran";
  EXPECT_EQ(state.target, "model");
}

TEST(SweepDriver, AResumedSweepRunsOnlyWhatItsStateDoesNotHoldOfTheSameCases) {
  Sweep s;
  ASSERT_GE(s.drive.plan.cases.size(), 3u);
  SweepReport previous = s.drive.head;
  const auto result = [](const SweepCase& sc, SweepResult::Outcome outcome, std::string id = "") {
    SweepResult r;
    r.index = sc.index;
    r.id = id.empty() ? sc.id : id;
    r.outcome = outcome;
    return r;
  };
  previous.results = {result(s.drive.plan.cases[0], SweepResult::Outcome::pass),
                      result(s.drive.plan.cases[1], SweepResult::Outcome::infra_error),
                      result(s.drive.plan.cases[2], SweepResult::Outcome::pass, "L999-another-case")};
  s.drive.resumed = resume_sweep(previous, s.drive.head, s.drive.plan, "state.json");
  EXPECT_EQ(s.drive.resumed.done.size(), 1u);
  EXPECT_EQ(s.drive.resumed.no_verdict, 1) << "an infrastructure error is no verdict";
  EXPECT_EQ(s.drive.resumed.renumbered, 1) << "a number that names another case now";
  Heard heard;
  run::Target* lanes[] = {&s.lane};
  const SweepEnd end = drive_sweep(s.drive, lanes, heard, [] { return false; });
  EXPECT_EQ(heard.lines.size(), s.drive.plan.cases.size()) << "every case but the one resumed, and the end";
  EXPECT_EQ(end.report.results.size(), s.drive.plan.cases.size());

  SweepReport other = previous;
  other.version = "another";
  try {
    resume_sweep(other, s.drive.head, s.drive.plan, "dir/state.json");
    FAIL() << "a state of another sweep was resumed";
  } catch (const std::invalid_argument& error) {
    EXPECT_EQ(std::string(error.what()), "dir/state.json is of another sweep (model another, world 2, shard 0/1)");
  }
}

TEST(SweepDriver, AResumedNewFailureFiledSinceCountsAsKnownAndNothingElseIsTouched) {
  const fs::path dir = fs::temp_directory_path() / ("tally-rematch-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "moved");
  const auto touch = [](const fs::path& p) { std::ofstream(p) << "{}"; };
  touch(dir / "moved" / "L001-new.json");  // its state says /elsewhere/: found beside the state
  touch(dir / "moved" / "L002-new.json");
  touch(dir / "moved" / "L003-passes-now.json");
  const auto failure = [](std::int64_t index, std::string file, std::string known) {
    SweepResult r;
    r.index = index;
    r.id = "L00" + std::to_string(index);
    r.outcome = SweepResult::Outcome::fail;
    r.case_file = std::move(file);
    r.known = std::move(known);
    return r;
  };
  ResumedSweep resumed;
  resumed.done = {{1, failure(1, "/elsewhere/L001-new.json", "")},
                  {2, failure(2, (dir / "moved" / "L002-new.json").string(), "")},
                  {3, failure(3, (dir / "moved" / "L003-passes-now.json").string(), "")},
                  {4, failure(4, (dir / "moved" / "L004-gone.json").string(), "")},
                  {5, failure(5, "/elsewhere/L005-known.json", "finding-b")}};
  std::vector<std::string> judged;
  const SavedFailureJudge judge = [&](const std::string& file) -> std::optional<std::pair<casefile::Case, oracle::Verdict>> {
    judged.push_back(fs::path(file).filename().string());
    oracle::Verdict v;
    v.kind = file.find("passes-now") != std::string::npos ? oracle::Verdict::Kind::pass : oracle::Verdict::Kind::fail;
    casefile::Case c;
    c.description = fs::path(file).stem().string();
    return std::pair{c, v};
  };
  const KnownFindingOf known = [](const casefile::Case& c, const oracle::Verdict&) {
    return c.description == "L001-new" ? std::string("finding-a") : std::string();
  };
  const RematchedFailures counts = rematch_new_failures(resumed, (dir / "moved" / "sweep-state.json").string(), judge, known);
  EXPECT_EQ(counts.now_known, 1);
  EXPECT_EQ(counts.still_new, 1);
  EXPECT_EQ(counts.not_judged, 2) << "one passes when judged again, one's file is gone";
  EXPECT_EQ(judged, (std::vector<std::string>{"L001-new.json", "L002-new.json", "L003-passes-now.json"}))
      << "only new failures are judged again, a known one's record stands";
  EXPECT_EQ(resumed.done[1].known, "finding-a");
  EXPECT_EQ(resumed.done[2].known, "");
  EXPECT_EQ(resumed.done[3].outcome, SweepResult::Outcome::fail) << "a failure that passes now keeps its record";
  EXPECT_EQ(resumed.done[5].known, "finding-b");
  fs::remove_all(dir);
}

TEST(SweepDriver, ALaneWhoseMachineryKeepsFailingStopsTheSweepResumably) {
  Sweep s;
  s.drive.plan = plan_sweep({.world = 4}, s.lane);
  s.drive.head = sweep_report_head(s.drive.plan, 4, "model", "test", 0, 1);
  Lane broken(s.backend, "", 2);
  Heard heard;
  run::Target* lanes[] = {&broken};
  const SweepEnd end = drive_sweep(s.drive, lanes, heard, [] { return false; });
  ASSERT_FALSE(end.error);
  EXPECT_TRUE(end.stopped);
  EXPECT_EQ(end.report.results.size(), 5u) << "two cases, then three infrastructure errors in a row";
  EXPECT_EQ(end.not_run, static_cast<std::int64_t>(s.drive.plan.cases.size()) - 5);
  ASSERT_GE(heard.lines.size(), 3u);
  EXPECT_EQ(heard.lines[heard.lines.size() - 2], "stops: three infrastructure errors in a row (lane 0)");
  EXPECT_EQ(heard.lines.back(), "finished 5");
  EXPECT_EQ(std::count_if(heard.lines.begin(), heard.lines.end(), [](const std::string& l) { return l.rfind("saved", 0) == 0; }), 3)
      << "each infrastructure error is saved";
  const SweepReport state = read_sweep_report(io::read_bounded_file(s.drive.state_file, 1 << 24, "state"), s.drive.state_file);
  EXPECT_EQ(state.results.size(), 5u) << "the state holds what ran before the stop";
  EXPECT_EQ(sweep_standing(count_sweep(state.results)), Standing::no_true_count);
}

TEST(SweepDriver, LanesOfDifferentReleasesRunNothing) {
  Sweep s;
  Lane other(s.backend, "another release");
  Heard heard;
  run::Target* lanes[] = {&s.lane, &other};
  const SweepEnd end = drive_sweep(s.drive, lanes, heard, [] { return false; });
  ASSERT_TRUE(end.error);
  try {
    std::rethrow_exception(end.error);
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("lane 1's worker is model another release where lane 0's is model"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(end.not_run, static_cast<std::int64_t>(s.drive.plan.cases.size()));
  EXPECT_EQ(heard.lines, std::vector<std::string>{"finished 0"});
}

TEST(SweepDriver, NothingCheckedWhenTheFrameworkRefusedMostOfWhatItWasSent) {
  SweepCounts c;
  c.pass = 2;
  c.refused = c.refused_by_framework = 3;
  EXPECT_EQ(sweep_standing(c), Standing::no_true_count);
  c.refused_by_framework = 2;
  EXPECT_EQ(sweep_standing(c), Standing::clean) << "half is not most";
  c.fail_new = 1;
  EXPECT_EQ(sweep_standing(c), Standing::new_failures);
  EXPECT_FALSE(nothing_checked(0, 0));
}

}  // namespace
}  // namespace tally::fuzz
