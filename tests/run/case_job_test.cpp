// The case job (run/case_job.h): the order every command runs a case in, on a stand-in target
// whose runs the tests choose, and on tally's model.
#include "run/case_job.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "casefile/case_file.h"
#include "run/backend.h"
#include "run/deepspeed/section.h"
#include "run/target.h"
#include "tests/support/runner_target.h"
#include "tests/support/founding_case.h"

namespace tally::run {
namespace {

namespace fs = std::filesystem;
using testing::RunnerTarget;

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(TALLY_BINARY_DIR) / "tests" / "run" / "case-job" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

using testing::founding_case;

oracle::Verdict passes(const casefile::Case&) { return {}; }

oracle::Verdict fails(const casefile::Case&) {
  oracle::Verdict v;
  v.kind = oracle::Verdict::Kind::fail;
  oracle::StatisticCheck l2;
  l2.name = "l2";
  l2.ok = false;
  v.stats.push_back(l2);
  v.miscounted_total = 1;
  oracle::Miscount m;
  m.name = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.bias";
  v.miscounted.push_back(m);
  return v;
}

TEST(CaseJob, SavesTheCaseBeforeTheRunSoThatACrashLosesNothing) {
  const std::string file = fresh_dir("save-first") + "/case.json";
  bool on_disk_during_run = false;
  RunnerTarget target(
      [&](const casefile::Case&) {
        on_disk_during_run = fs::exists(file);
        return oracle::Verdict{};
      },
      2);
  CaseJob job;
  job.c = founding_case();
  job.save = file;
  const CaseJobResult r = run_case_job(target, job);
  EXPECT_TRUE(on_disk_during_run);
  EXPECT_EQ(r.verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_FALSE(r.refused);
  ASSERT_TRUE(r.c.target) << "a real target's case names the framework and release it ran on";
  EXPECT_EQ(r.c.target->framework, "megatron-core");
  EXPECT_EQ(r.c.target->version, "0.0-stand-in");
  EXPECT_EQ(r.c.target->manifests, "") << "a pass saved without an expectation keeps no evidence";
  EXPECT_EQ(casefile::load_case_file(file, run::case_frameworks()), r.c);
}

TEST(CaseJob, AnInvalidCaseIsBadInputBeforeTheTargetOpens) {
  RunnerTarget target(passes, 2);
  CaseJob job;
  job.c = founding_case();
  job.c.topology.tp = 3;  // does not divide the world
  EXPECT_THROW(run_case_job(target, job), casefile::InvalidCase);
  EXPECT_EQ(target.opened, 0);
  EXPECT_TRUE(target.executed.empty());
}

TEST(CaseJob, WhatNoReleaseRunsIsRefusedBeforeTheTargetOpensAndNothingIsSaved) {
  const std::string file = fresh_dir("refused-before-open") + "/case.json";
  RunnerTarget target(passes, 2);
  target.refuses_before_open = [](const casefile::Case&) { return std::string("model.kind custom: no such module"); };
  CaseJob job;
  job.c = founding_case();
  job.save = file;
  const CaseJobResult r = run_case_job(target, job);
  ASSERT_TRUE(r.refused);
  EXPECT_EQ(*r.refused, "--target megatron-core cannot run this case: model.kind custom: no such module");
  EXPECT_EQ(target.opened, 0) << "no worker started for a case no release runs";
  EXPECT_TRUE(target.executed.empty());
  EXPECT_FALSE(fs::exists(file));
}

TEST(CaseJob, WhatTheOpenedReleaseDoesNotRunIsRefusedNamingTheRelease) {
  RunnerTarget target(passes, 2);
  target.refuses = [](const casefile::Case&) { return std::string("statistics.p_norms: L2 only"); };
  CaseJob job;
  job.c = founding_case();
  const CaseJobResult r = run_case_job(target, job);
  ASSERT_TRUE(r.refused);
  EXPECT_EQ(*r.refused, "--target megatron-core 0.0-stand-in cannot run this case: statistics.p_norms: L2 only");
  EXPECT_EQ(target.opened, 1);
  EXPECT_TRUE(target.executed.empty());
}

// The founding case, saved to `file` with the expectation `expect`.
CaseJob job_saving_to(const std::string& file, CaseJob::Expect expect = CaseJob::Expect::as_given) {
  CaseJob job;
  job.c = founding_case();
  job.save = file;
  job.expect = expect;
  return job;
}

// A folder of manifests as a worker's run leaves them.
std::string run_evidence(const std::string& name) {
  const std::string dir = fresh_dir(name);
  std::ofstream(dir + "/rank-0.json") << "{}\n";
  return dir;
}

TEST(CaseJob, AFailureIsSavedAgainWithItsEvidenceNextToTheCaseFile) {
  const std::string file = fresh_dir("evidence") + "/case.json";
  RunnerTarget target(fails, 2);
  target.evidence = run_evidence("evidence-run");
  CaseJob job;
  job.c = founding_case();
  job.save = file;
  const CaseJobResult r = run_case_job(target, job);
  EXPECT_EQ(r.verdict.kind, oracle::Verdict::Kind::fail);
  EXPECT_EQ(target.releases_asked, 2) << "the framework and release before the run, and again with the evidence";
  EXPECT_EQ(casefile::load_case_file(file, run::case_frameworks()).target->manifests, "case.manifests");
  EXPECT_TRUE(fs::is_regular_file(fs::path(file).parent_path() / "case.manifests" / "rank-0.json"))
      << "the run's manifests copied next to the case file";
}

TEST(CaseJob, AFailureWhoseRunKeptNoManifestsIsSavedWithoutEvidence) {
  const std::string file = fresh_dir("no-evidence") + "/case.json";
  RunnerTarget target(fails, 2);
  run_case_job(target, job_saving_to(file));
  EXPECT_EQ(casefile::load_case_file(file, run::case_frameworks()).target->manifests, "");
}

TEST(CaseJob, APassSavedAsAnExpectationKeepsItsEvidence) {
  const std::string file = fresh_dir("pass-expectation") + "/case.json";
  RunnerTarget target(passes, 2);
  target.evidence = run_evidence("pass-expectation-run");
  CaseJob job;
  job.c = founding_case();
  job.save = file;
  job.expect = CaseJob::Expect::pass;
  const CaseJobResult r = run_case_job(target, job);
  const casefile::Case saved = casefile::load_case_file(file, run::case_frameworks());
  EXPECT_EQ(saved.target->manifests, "case.manifests");
  ASSERT_TRUE(saved.expect);
  EXPECT_EQ(saved.expect->outcome, casefile::Expectation::Outcome::pass);
  EXPECT_FALSE(r.unmet);
}

TEST(CaseJob, AnObservedExpectationIsWhatTheRunShowed) {
  const std::string file = fresh_dir("observed") + "/case.json";
  RunnerTarget target(fails, 2);
  const CaseJobResult r = run_case_job(target, job_saving_to(file, CaseJob::Expect::observed));
  const casefile::Case saved = casefile::load_case_file(file, run::case_frameworks());
  ASSERT_TRUE(saved.expect);
  EXPECT_EQ(saved.expect->outcome, casefile::Expectation::Outcome::fail);
  EXPECT_EQ(saved.expect->statistics, (std::vector<std::string>{"l2", "ledger"}));
  EXPECT_EQ(saved.expect->miscounted, (std::vector<std::string>{"decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.bias"}));
  EXPECT_FALSE(r.unmet) << "the run meets the expectation it showed";
}

TEST(CaseJob, TheVerdictIsHeldAgainstTheCasesExpectation) {
  RunnerTarget target(fails, 2);
  CaseJob job;
  job.c = founding_case();
  job.c.expect = casefile::Expectation{};  // pass
  const CaseJobResult r = run_case_job(target, job);
  ASSERT_TRUE(r.unmet);
  EXPECT_EQ(*r.unmet, "expected pass, got fail");
}

TEST(CaseJob, ACaseOfAnotherFrameworkIsRefusedNamingTheTargetItIsFor) {
  SimBackend backend;
  const std::unique_ptr<Target> model = model_target(backend);
  CaseJob job;
  job.c = founding_case();
  kDeepSpeedSection.set(job.c, DeepSpeedConfig{});
  job.source = "ds.json";
  const CaseJobResult with_section = run_case_job(*model, job);
  ASSERT_TRUE(with_section.refused);
  EXPECT_EQ(with_section.refused->rfind("ds.json has a deepspeed section, which only --target deepspeed reads", 0), 0u)
      << *with_section.refused;

  RunnerTarget megatron(passes, 2);
  const CaseJobResult on_another = run_case_job(megatron, job);
  ASSERT_TRUE(on_another.refused);
  EXPECT_EQ(*on_another.refused,
            "ds.json is a deepspeed case; --target megatron-core cannot re-execute it (use --target deepspeed)");
  EXPECT_TRUE(megatron.executed.empty());
}

TEST(CaseJob, AReplayWithoutTheFrameworkJudgesTheManifestsTheCaseFileSaved) {
  SimBackend backend;
  const std::unique_ptr<Target> model = model_target(backend);
  const std::string file = TALLY_SOURCE_DIR "/seeds/real/megatron-core-0.19.2-distributed-optimizer-dp2-clipped.pass.json";
  CaseJob job;
  job.c = casefile::load_case_file(file, run::case_frameworks());
  job.source = file;
  job.judge_saved_runs = true;
  const CaseJobResult r = run_case_job(*model, job);
  ASSERT_FALSE(r.refused) << *r.refused;
  EXPECT_EQ(r.verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_EQ(r.how, "judged from its saved manifests, megatron-core 0.19.2");
  EXPECT_FALSE(r.unmet);

  job.judge_saved_runs = false;  // `tally run` of the same file
  const CaseJobResult run = run_case_job(*model, job);
  ASSERT_TRUE(run.refused);
  EXPECT_NE(run.refused->find("run it with --target megatron-core where the framework is installed"), std::string::npos);
}

TEST(CaseJob, TheModelTargetWritesTheManifestsOfItsRun) {
  SimBackend backend;
  const std::unique_ptr<Target> model = model_target(backend);
  const std::string dir = fresh_dir("model-manifests") + "/run";
  CaseJob job;
  job.c = founding_case();
  job.manifests = dir;
  const CaseJobResult r = run_case_job(*model, job);
  EXPECT_EQ(r.verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_TRUE(r.manifests_written);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "rank-0.json"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "groups.json"));
  EXPECT_FALSE(r.c.target) << "tally's model names no framework";
}

TEST(CaseJob, ACaseExpectingAHangIsRefusedOnlyWhereItWouldEndTheCasesAfterIt) {
  RunnerTarget target(fails, 2);
  target.hang_ends_job = true;  // tally's model on an mpi job
  CaseJob job;
  job.c = founding_case();
  job.c.expect = casefile::Expectation{casefile::Expectation::Outcome::infra_error, {}, {}};
  job.more_cases_follow = true;  // tally replay
  const CaseJobResult replayed = run_case_job(target, job);
  ASSERT_TRUE(replayed.refused);
  EXPECT_NE(replayed.refused->find("it expects a hang"), std::string::npos) << *replayed.refused;
  EXPECT_TRUE(target.executed.empty());

  job.more_cases_follow = false;  // tally run: nothing after it to lose
  EXPECT_FALSE(run_case_job(target, job).refused);
  target.hang_ends_job = false;  // sim: a hang is a verdict
  job.more_cases_follow = true;
  EXPECT_FALSE(run_case_job(target, job).refused);
}

TEST(CaseJob, ManifestsOfATargetThatWritesNoneAreAnOutputErrorBeforeAnythingIsSaved) {
  const std::string file = fresh_dir("no-manifests") + "/case.json";
  RunnerTarget target(passes, 2);
  target.no_manifests = "needs --backend sim (the mpi backend returns only the verdict)";
  CaseJob job;
  job.c = founding_case();
  job.save = file;
  job.manifests = fresh_dir("no-manifests") + "/run";
  try {
    run_case_job(target, job);
    FAIL() << "manifests asked of a target that writes none";
  } catch (const JobOutputError& error) {
    EXPECT_EQ(std::string(error.what()), "--manifests needs --backend sim (the mpi backend returns only the verdict)");
  }
  EXPECT_FALSE(fs::exists(file));
  EXPECT_TRUE(target.executed.empty());
}

TEST(CaseJob, AFileThatCannotBeWrittenIsAnOutputErrorNamingIt) {
  RunnerTarget target(passes, 2);
  const std::string blocked = fresh_dir("blocked") + "/a-file";
  { std::ofstream(blocked) << "x"; }
  CaseJob job;
  job.c = founding_case();
  job.save = blocked + "/case.json";  // a folder that is a file
  try {
    run_case_job(target, job);
    FAIL() << "saved under a file";
  } catch (const JobOutputError& error) {
    EXPECT_NE(std::string(error.what()).find("a-file"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(target.executed.empty());
}

}  // namespace
}  // namespace tally::run
