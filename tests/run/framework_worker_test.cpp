// The real target's worker protocol (run/framework_worker.h), driven against a stand-in worker
// (tests/run/model_worker.sh) whose "framework" is tally's own model of the path, so the protocol,
// the judging of the worker's manifests and every way a worker can fail are tested where no real
// framework is installed. The real megatron-core worker runs on the GPU machine
// (adapters/README.md).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "casefile/case_file.h"
#include "run/deepspeed/section.h"
#include "vocab/gradients.h"
#include "kernels/gradient_generator.h"
#include "run/case_job.h"
#include "run/framework_worker.h"
#include "run/target_run.h"
#include "run/run_case.h"
#include "run/target.h"
#include "tests/support/files.h"
#include "topologies/logical_model.h"
#include "vocab/optimizer_models.h"
#include "tests/support/founding_case.h"

namespace tally::run {
namespace {

namespace fs = std::filesystem;

std::string stand_in_command() {
  return "'" TALLY_SOURCE_DIR "/tests/run/model_worker.sh' '" TALLY_BINARY_DIR "/cli/tally' {world}";
}

using testing::founding_case;

// Sets an environment variable for the workers this test starts, and clears it afterwards.
class WorkerEnvironment {
 public:
  WorkerEnvironment(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~WorkerEnvironment() { ::unsetenv(name_); }

 private:
  const char* name_;
};

WorkerOptions stand_in_options() {
  WorkerOptions o;
  o.command = stand_in_command();
  o.judge = judge_as_a_run_of_the_case(oracle::kFrameworkRtol);
  // The stand-in says it is megatron-core, and declines what that row's worker may.
  const std::span<const std::string_view> declines = framework_target("megatron-core")->cannot_run;
  o.cannot_run_settings.assign(declines.begin(), declines.end());
  o.start_seconds = 30;
  o.case_seconds = 30;
  return o;
}

TEST(WorkerPool, ExecutesACaseAndJudgesTheWorkersManifests) {
  WorkerPool pool(stand_in_options());
  EXPECT_EQ(pool.hello(2).framework, "megatron-core");
  EXPECT_EQ(pool.hello(2).version, "0.19.2");
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_EQ(run.verdict.kind, oracle::Verdict::Kind::pass) << run.verdict.infra_message;
  EXPECT_TRUE(run.manifests.empty()) << "a passing run's manifests are not kept";
  EXPECT_FALSE(pool.manifests_of(founding_case()));
}

TEST(WorkerPool, AMiscountingFrameworkFailsWithTheMiscountedParamsAndKeepsItsManifests) {
  const WorkerEnvironment fault("TALLY_TEST_WORKER_FAULT", "expert-dedup-on-dense-tp");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(founding_case());
  ASSERT_EQ(run.verdict.kind, oracle::Verdict::Kind::fail) << run.verdict.infra_message;
  ASSERT_FALSE(run.verdict.miscounted.empty());
  EXPECT_EQ(run.verdict.miscounted.front().name, "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.bias");
  ASSERT_TRUE(pool.manifests_of(founding_case()));
  EXPECT_EQ(*pool.manifests_of(founding_case()), run.manifests);
  EXPECT_TRUE(fs::exists(fs::path(run.manifests) / "rank-1.json"));
  // The same verdict from the kept manifests alone, as replay judges them.
  EXPECT_EQ(judge_manifests(run.manifests, 1e-5).miscounted.front().name, run.verdict.miscounted.front().name);
}

// The founding case with normal gradients in every param, clipped: the norm is far above max_norm.
casefile::Case clipped_case() {
  casefile::Case c = founding_case();
  c.path.gradients.generator.mode = kernels::GradientMode::normal;
  c.path.gradients.class_mask = ~std::uint32_t{0};
  c.path.max_norm = 1e-3;
  return c;
}

bool failed_on(const oracle::Verdict& v, const std::string& statistic) {
  const std::vector<std::string> failed = failed_statistics(v);
  return std::find(failed.begin(), failed.end(), statistic) != failed.end();
}

TEST(WorkerPool, AFrameworkThatClipsRightPassesWithItsClippedStatistics) {
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(clipped_case());
  EXPECT_EQ(run.verdict.kind, oracle::Verdict::Kind::pass) << run.verdict.infra_message;
  EXPECT_EQ(run.verdict.gradient_mismatches, 0);
}

TEST(WorkerPool, AFrameworkHoldingGradientsOtherThanTallysFailsNamingTheParamRanksAndStatistic) {
  // Its manifests and its norm agree with each other: they are of the next seed's gradients.
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "other-seed");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(clipped_case());
  ASSERT_EQ(run.verdict.kind, oracle::Verdict::Kind::fail) << run.verdict.infra_message;
  EXPECT_TRUE(failed_on(run.verdict, "held-gradients"));
  EXPECT_EQ(run.verdict.miscounted_total, 0) << "every element is counted once: of the wrong gradients";
  ASSERT_FALSE(run.verdict.gradients.empty());
  const oracle::GradientMismatch& first = run.verdict.gradients.front();
  EXPECT_EQ(first.name, "embedding.word_embeddings.weight");
  EXPECT_EQ(first.statistic, "sum_squares");
  EXPECT_FALSE(first.after_clip);
  EXPECT_EQ(first.ranks, (std::vector<int>{0})) << "TP 2: rank 0 holds its own box of the embedding";
  EXPECT_EQ(first.where, "its gradient, box [0:8, 0:8]");
  EXPECT_GT(run.verdict.gradient_mismatches, 8) << "every param's gradient differs";
}

// A queue loop one case behind answers case 2 with case 1's manifests: of the same world, topology
// and model, so only the request's digest tells them apart. Never a verdict on the framework.
TEST(WorkerPool, AnAnswerWithThePreviousCasesManifestsIsAnInfraErrorNamingBothCases) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "stale");
  WorkerPool pool(stand_in_options());
  casefile::Case next = clipped_case();
  next.path.optimizer = vocab::OptimizerModel::distributed;
  next.path.gradients.generator.seed += 7;
  EXPECT_EQ(pool.execute(clipped_case()).verdict.kind, oracle::Verdict::Kind::pass);
  const WorkerRun run = pool.execute(next);
  ASSERT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error) << "not a verdict";
  EXPECT_NE(run.verdict.infra_message.find("rank 0's manifest is of another case: it echoes case_digest "),
            std::string::npos)
      << run.verdict.infra_message;
  EXPECT_NE(run.verdict.infra_message.find("(case-1's), not case-2's "), std::string::npos) << run.verdict.infra_message;
  EXPECT_NE(run.verdict.infra_message.find("the worker answered case-2 with the manifests of case-1"), std::string::npos)
      << run.verdict.infra_message;
  EXPECT_FALSE(run.manifests.empty()) << "what the worker answered is the evidence of its error";
}

TEST(WorkerPool, ManifestsThatDoNotEchoTheRequestAreAnInfraErrorNotAVerdict) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "no-digest");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(founding_case());
  ASSERT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(run.verdict.infra_message.find("rank 0's manifest does not echo case-1's case_digest "), std::string::npos)
      << run.verdict.infra_message;
}

TEST(WorkerPool, EachRequestCarriesTheDigestItsManifestsEcho) {
  const LogicalGradients a = logical_gradients(founding_case());
  casefile::Case other = founding_case();
  other.path.optimizer = vocab::OptimizerModel::distributed;
  const LogicalGradients b = logical_gradients(other);
  casefile::Case other_values = founding_case();
  other_values.path.gradients.generator.seed += 1;
  EXPECT_EQ(a.case_digest.size(), 16u);
  EXPECT_EQ(a.case_digest, logical_gradients(founding_case()).case_digest) << "the same request, the same digest";
  EXPECT_NE(a.case_digest, b.case_digest) << "another optimizer model";
  EXPECT_NE(a.case_digest, logical_gradients(other_values).case_digest) << "other gradients";
  casefile::Case described = founding_case();
  described.description = "a case file's own words";
  EXPECT_EQ(a.case_digest, logical_gradients(described).case_digest) << "what the worker is not sent is not in it";
  EXPECT_NE(a.index_json.find("\"case_digest\": \"" + a.case_digest + "\""), std::string::npos) << a.index_json;
}

TEST(WorkerPool, AnOkWithoutAFolderOfManifestsIsAnInfraErrorWithNoEvidence) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "no-manifests");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(founding_case());
  ASSERT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_EQ(run.verdict.infra_message.rfind("the worker answered \"ok\" to case-1 but left no folder of manifests: ", 0), 0u)
      << run.verdict.infra_message;
  EXPECT_TRUE(run.manifests.empty());
  EXPECT_FALSE(pool.manifests_of(founding_case())) << "no earlier run's manifests stand for this one";
  EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass) << "the next case runs";
}

// What a worker left in place of its manifests (a FIFO, a link to a device) is part of its error:
// the case is saved with what could be copied, and the rest listed, never a second failure.
void expect_saved_with_what_it_left(const char* mode, const std::string& listed) {
  const WorkerEnvironment env("TALLY_TEST_WORKER_MODE", mode);
  const fs::path dir = fs::temp_directory_path() / ("tally-evidence-" + std::string(mode) + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::unique_ptr<Target> target = framework_target(*framework_target("megatron-core"), stand_in_options());
  const TargetRun run = target->execute(founding_case(), false);
  ASSERT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error) << mode;
  EXPECT_NE(run.verdict.infra_message.find(listed), std::string::npos) << run.verdict.infra_message;
  const std::string saved = (dir / "case.json").string();
  std::optional<casefile::RealTarget> section;
  ASSERT_NO_THROW(section = saved_section(*target, founding_case(), saved)) << mode;
  ASSERT_TRUE(section);
  EXPECT_EQ(section->manifests, "case.manifests");
  EXPECT_TRUE(fs::is_regular_file(dir / "case.manifests" / "rank-1.json")) << "what could be copied is";
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir / "case.manifests" / "rank-0.json"))) << "never a FIFO or a device";
  const std::string text = testing::text_of(dir / "case.manifests" / "NOT-COPIED.txt");
  EXPECT_NE(text.find("rank-0.json: "), std::string::npos) << text;
  fs::remove_all(dir);
}

TEST(WorkerTarget, AFifoAsAManifestIsAnInfraErrorSavedWithTheOtherRanksManifests) {
  expect_saved_with_what_it_left("fifo-manifest", "rank-0.json: is a FIFO");
}

TEST(WorkerTarget, ALinkToADeviceAsAManifestIsAnInfraErrorSavedWithTheOtherRanksManifests) {
  expect_saved_with_what_it_left("dev-zero-manifest", "rank-0.json: is a character device");
}

TEST(WorkerPool, AParamTheFrameworkLeftUnclippedFailsThoughItsCoefficientIsRight) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "unclipped-param");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(clipped_case());
  ASSERT_EQ(run.verdict.kind, oracle::Verdict::Kind::fail) << run.verdict.infra_message;
  EXPECT_TRUE(failed_on(run.verdict, "clipped"));
  EXPECT_FALSE(failed_on(run.verdict, "clip")) << "the reported coefficient is the truth's";
  EXPECT_FALSE(failed_on(run.verdict, "held-gradients"));
  ASSERT_FALSE(run.verdict.gradients.empty());
  EXPECT_TRUE(run.verdict.gradients.front().after_clip);
  EXPECT_EQ(run.verdict.gradients.front().name, "embedding.word_embeddings.weight");
}

TEST(WorkerPool, OneWorkerPerWorldEachStartedOnce) {
  WorkerPool pool(stand_in_options());
  casefile::Case world4 = founding_case();
  world4.topology.world = 4;
  EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_EQ(pool.execute(world4).verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_EQ(pool.hello(4).world, 4);
}

TEST(WorkerPool, AnErrorTheWorkerReportsIsAnInfraErrorWithItsMessage) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "error");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_EQ(run.verdict.infra_message.rfind("the framework refused the case (as asked); the end of its log ", 0), 0u)
      << "the worker's message, then the end of its log: " << run.verdict.infra_message;
  EXPECT_NE(run.verdict.infra_message.find("model_worker.sh: case 1"), std::string::npos) << run.verdict.infra_message;
}

// The framework's own check declined the case as it set it up: a refusal with its message, no
// verdict and no error; the worker goes on with the next case.
TEST(WorkerPool, ACaseTheFrameworkDeclinesAtSetUpIsRefusedWithItsMessage) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "refuse-odd");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_EQ(run.verdict.kind, oracle::Verdict::Kind::refused);
  EXPECT_EQ(run.verdict.infra_call, "megatron-core 0.19.2");
  EXPECT_EQ(run.verdict.infra_message, "rank 0: ValueError: the framework declines odd cases (as asked)");
  EXPECT_TRUE(run.manifests.empty());
  EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass) << "the worker goes on";
}

// A refusal hides what the case would show, so it is taken only as the framework's own words, before
// any run: without a message naming the framework's exception, or after the worker ran the case and
// wrote its manifests, it is the worker's error.
TEST(WorkerPool, ARefusalWithoutTheFrameworksWordsIsTheWorkersError) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "refuse-without-message");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_EQ(run.verdict.infra_message.rfind("the worker answered \"refused\" to case-1 with no message", 0), 0u)
      << run.verdict.infra_message;
}

TEST(WorkerPool, ARefusalAfterARunIsTheWorkersError) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "refuse-failing");
  const WorkerEnvironment fault("TALLY_TEST_WORKER_FAULT", "expert-dedup-on-dense-tp");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(run.verdict.infra_message.find("the worker answered \"refused\" to case-1 after writing "), std::string::npos)
      << run.verdict.infra_message;
  EXPECT_FALSE(run.manifests.empty()) << "what it ran is kept beside the error";
}

TEST(WorkerFiles, ARefusalNamesTheFrameworksException) {
  EXPECT_EQ(refusal_not_the_frameworks("rank 0: ValueError: tp must divide heads"), std::nullopt);
  EXPECT_EQ(refusal_not_the_frameworks("megatron.core.Error: no"), std::nullopt);
  EXPECT_EQ(refusal_not_the_frameworks("AssertionError: world 3"), std::nullopt);
  EXPECT_NE(refusal_not_the_frameworks(""), std::nullopt);
  EXPECT_NE(refusal_not_the_frameworks("  \n"), std::nullopt);
  EXPECT_NE(refusal_not_the_frameworks("refused"), std::nullopt);
  EXPECT_NE(refusal_not_the_frameworks("rank 0: "), std::nullopt);
  EXPECT_NE(refusal_not_the_frameworks("rank 0: ValueError: "), std::nullopt) << "says nothing";
  EXPECT_NE(refusal_not_the_frameworks("the framework declined"), std::nullopt);
}

TEST(WorkerTarget, ARunOfACaseTheFrameworkDeclinesIsRefusedNotJudged) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "refuse-odd");
  const std::unique_ptr<Target> target = framework_target(*framework_target("megatron-core"), stand_in_options());
  CaseJob job;
  job.c = founding_case();
  const CaseJobResult result = run_case_job(*target, job);
  ASSERT_TRUE(result.refused);
  EXPECT_EQ(*result.refused,
            "megatron-core 0.19.2 refused this case as it set it up: rank 0: ValueError: the framework declines odd "
            "cases (as asked)");
}

TEST(WorkerPool, AWorkerThatDiesIsAnInfraErrorAndIsRestartedForTheNextCase) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "die");
  WorkerPool pool(stand_in_options());
  const WorkerRun first = pool.execute(founding_case());
  EXPECT_EQ(first.verdict.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(first.verdict.infra_message.find("the worker exited during case-1"), std::string::npos)
      << first.verdict.infra_message;
  EXPECT_NE(first.verdict.infra_message.find("model_worker.sh: case 1"), std::string::npos)
      << "the message shows the end of the worker's log: " << first.verdict.infra_message;
  // Restarted: a fresh queue, whose first case is case-1 again.
  const WorkerRun second = pool.execute(founding_case());
  EXPECT_NE(second.verdict.infra_message.find("during case-1"), std::string::npos) << second.verdict.infra_message;
}

TEST(WorkerPool, AWorkerThatRetiresAfterACaseIsWaitedForAndTheNextCaseStartsAFreshOne) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "retire");
  std::ostringstream progress;
  WorkerOptions options = stand_in_options();
  options.progress = &progress;
  WorkerPool pool(options);
  const WorkerRun first = pool.execute(founding_case());
  const WorkerRun second = pool.execute(founding_case());
  EXPECT_EQ(first.verdict.kind, oracle::Verdict::Kind::pass) << first.verdict.infra_message;
  // Not a worker that died during case-1 of the old queue: a fresh one ran it.
  EXPECT_EQ(second.verdict.kind, oracle::Verdict::Kind::pass) << second.verdict.infra_message;
  const std::string said = progress.str();
  EXPECT_NE(said.find("the world-2 worker retires after case-1 (each rank holds 600 threads (as asked)): the next "
                      "case starts a fresh one"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("/world-2-2'"), std::string::npos) << "the second start has a queue of its own: " << said;
}

TEST(WorkerPool, ARetiringWorkerThatLingersIsStoppedAndSaysSo) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "retire-and-linger");
  std::ostringstream progress;
  WorkerOptions options = stand_in_options();
  options.progress = &progress;
  options.stop_seconds = 1;
  WorkerPool pool(options);
  EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass);
  EXPECT_NE(progress.str().find("the retiring world-2 worker did not end within 1 s: it was terminated"),
            std::string::npos)
      << progress.str();
  EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass) << "a fresh worker";
}

// Through the target (run/target.h): a worker that dies is an infra-error verdict; one that then
// cannot be restarted leaves the target unavailable (exit 3), not a verdict or bad input.
TEST(WorkerTarget, AWorkerThatCannotBeRestartedLeavesTheTargetUnavailable) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "die-for-good");
  const std::unique_ptr<Target> target = framework_target(*framework_target("megatron-core"), stand_in_options());
  EXPECT_EQ(target->open(2).version, "0.19.2");
  const TargetRun first = target->execute(founding_case(), false);
  EXPECT_EQ(first.verdict.kind, oracle::Verdict::Kind::infra_error);
  try {
    target->execute(founding_case(), false);
    FAIL() << "a worker that never came back gave a verdict";
  } catch (const TargetUnavailable& error) {
    EXPECT_NE(std::string(error.what()).find("exited before it was up"), std::string::npos) << error.what();
  }
}

TEST(WorkerPool, ACaseThatTakesTooLongIsAnInfraErrorNamingTheTimeout) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "hang");
  WorkerOptions o = stand_in_options();
  o.case_seconds = 1.5;
  WorkerPool pool(o);
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(run.verdict.infra_message.find("case-1 gave no result within 1.5 s (--case-timeout; the worker was stopped)"),
            std::string::npos)
      << "the timeout as given, not rounded down: " << run.verdict.infra_message;
  EXPECT_LT(run.seconds, 1.5 + 3) << "stopped within a short grace of the timeout";
}

TEST(WorkerPool, AWorkerThatNeverSaysHelloIsAnErrorWithTheEndOfItsLog) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "no-hello");
  WorkerPool pool(stand_in_options());
  try {
    pool.hello(2);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("the world-2 worker exited before it was up (exit code 4)"), std::string::npos) << message;
    EXPECT_NE(message.find("the launcher's report, line 30"), std::string::npos) << message;
    EXPECT_NE(message.find("the first error in its log: ValueError: device_id cuda:1 is out of range"),
              std::string::npos)
        << "a rank's error above the launcher's long report is named: " << message;
  }
}

// A pool in a temporary folder of its own keeps that folder when an error's message names a log
// in it: the log outlives tally, to be read.
TEST(WorkerPool, TheLogAnErrorNamesOutlivesThePool) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "no-hello");
  std::string message;
  {
    WorkerPool pool(stand_in_options());
    try {
      pool.hello(2);
    } catch (const std::runtime_error& error) {
      message = error.what();
    }
  }
  const std::string marker = "the end of its log ";
  const std::size_t at = message.find(marker);
  ASSERT_NE(at, std::string::npos) << message;
  const std::size_t begin = at + marker.size();
  const std::string log = message.substr(begin, message.find(':', begin) - begin);
  EXPECT_TRUE(fs::is_regular_file(log)) << log;
  std::error_code ignored;
  fs::remove_all(fs::path(log).parent_path().parent_path(), ignored);
}

// Whether process `pid` runs (a zombie, waiting for its parent to reap it, does not).
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const std::size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// The pid the stand-in's detached child wrote to its queue.
pid_t detached_child(const fs::path& queue) {
  std::ifstream in(queue / "detached.pid");
  pid_t pid = 0;
  in >> pid;
  return pid;
}

// Waits up to `seconds` for `pid` to stop running.
bool ends_within(pid_t pid, double seconds) {
  for (int waited = 0; waited < seconds * 100 && running(pid); ++waited) ::usleep(10000);
  return !running(pid);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(WorkerPool, ALogWithLinesOfAHundredKilobytesGivesTheirStartsNotACrash) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "long-line");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(founding_case());
  ASSERT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error);
  const std::string& message = run.verdict.infra_message;
  EXPECT_NE(message.find("the worker exited during case-1"), std::string::npos) << message.substr(0, 2000);
  EXPECT_NE(message.find("; the first error in its log: ValueError: xxx"), std::string::npos) << message.substr(0, 2000);
  EXPECT_NE(message.find("more bytes)"), std::string::npos) << "each line is cut, saying how much: " << message.substr(0, 2000);
  EXPECT_LT(message.size(), 8000u) << "the message stays short";
}

TEST(WorkerPool, AFifoAsHelloIsRefusedWithoutWaitingOnIt) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "fifo-hello");
  WorkerPool pool(stand_in_options());  // start timeout 30 s
  const auto start = std::chrono::steady_clock::now();
  try {
    pool.hello(2);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("hello.json is a FIFO, not a regular file"), std::string::npos) << error.what();
  }
  EXPECT_LT(seconds_since(start), 5.0);
}

// The error of a world-2 stand-in whose hello is bad in the way `mode` says; empty when none.
std::string hello_error(const char* mode, WorkerOptions o = stand_in_options()) {
  const WorkerEnvironment env("TALLY_TEST_WORKER_MODE", mode);
  WorkerPool pool(o);
  try {
    pool.hello(2);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "";
}

// A hello tally cannot take is one line naming the file, the field and the rule
// (docs/schemas/hello.schema.json), never read as something near it.
void expect_hello_refused(const std::string& message, const std::string& field_and_rule) {
  EXPECT_NE(message.find("hello.json is not a valid hello (docs/schemas/hello.schema.json): " + field_and_rule),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(WorkerPool, AHelloWhoseWorldIsAFractionIsRefusedNotTruncated) {
  expect_hello_refused(hello_error("hello-world-2.5"), "hello.world: expected a positive integer, got 2.5");
}

TEST(WorkerPool, AHelloWhoseWorldIsBeyondTheLargestWorldIsRefusedNotWrappedAround) {
  // 2^40 + 2 read into an int was 2, the world the pool started the worker for.
  expect_hello_refused(hello_error("hello-world-2^40+2"),
                       "hello.world: expected a positive integer at most 1048576, got 1099511627778");
}

TEST(WorkerPool, AHelloPlantingAFaultTheCatalogLacksIsRefusedNamingIt) {
  expect_hello_refused(hello_error("hello-plants-no-such-fault"),
                       "hello.plants.no-such-fault: not a fault of tally's catalog (tally run --list-faults)");
}

TEST(WorkerPool, AHelloWithAKeyTallyDoesNotKnowIsRefusedNamingItAndTheWorkerIsStopped) {
  const WorkerEnvironment detached("TALLY_TEST_WORKER_DETACHED", "1");
  WorkerOptions o = stand_in_options();
  o.work_dir = (fs::temp_directory_path() / ("tally-worker-bad-hello-" + std::to_string(::getpid()))).string();
  expect_hello_refused(hello_error("hello-unknown-key", o), "hello.gpu_name: unknown key for a hello");
  const pid_t child = detached_child(fs::path(o.work_dir) / "world-2");
  ASSERT_GT(child, 0);
  EXPECT_TRUE(ends_within(child, 2.0)) << "the worker whose hello was refused lingers";
  fs::remove_all(o.work_dir);
}

TEST(WorkerPool, AResultWithAKeyTallyDoesNotKnowIsAnInfraErrorNamingIt) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "result-unknown-key");
  WorkerPool pool(stand_in_options());
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(run.verdict.infra_message.find(
                "case-1.result.json is not a result (result.gpu_seconds: unknown key for a case result; the worker "
                "was stopped)"),
            std::string::npos)
      << run.verdict.infra_message;
}

TEST(WorkerPool, AFifoAsACaseResultIsAnInfraErrorWithoutWaitingOnIt) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "fifo-result");
  WorkerPool pool(stand_in_options());  // case timeout 30 s
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_EQ(run.verdict.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_NE(run.verdict.infra_message.find("case-1.result.json is a FIFO, not a regular file"), std::string::npos)
      << run.verdict.infra_message;
  EXPECT_LT(run.seconds, 5.0);
}

TEST(WorkerPool, AStartTimeoutEndsWithinAShortGraceOfItself) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "slow-start");  // reads no stop file
  WorkerOptions o = stand_in_options();
  o.start_seconds = 1.5;
  WorkerPool pool(o);
  const auto start = std::chrono::steady_clock::now();
  try {
    pool.hello(2);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("the world-2 worker was not up after 1.5 s (--start-timeout; it was stopped)"),
              std::string::npos)
        << error.what();
  }
  EXPECT_LT(seconds_since(start), 1.5 + 3);
}

TEST(WorkerPool, AChildInASessionOfItsOwnEndsWithThePool) {
  const WorkerEnvironment detached("TALLY_TEST_WORKER_DETACHED", "1");
  WorkerOptions o = stand_in_options();
  o.work_dir = (fs::temp_directory_path() / ("tally-worker-detached-" + std::to_string(::getpid()))).string();
  pid_t child = 0;
  {
    WorkerPool pool(o);
    EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass);
    child = detached_child(fs::path(o.work_dir) / "world-2");
    ASSERT_GT(child, 0);
    EXPECT_TRUE(running(child));
  }
  EXPECT_TRUE(ends_within(child, 2.0)) << "the worker's child in its own session outlived the pool";
  fs::remove_all(o.work_dir);
}

TEST(WorkerPool, AChildInASessionOfItsOwnEndsWithAWorkerThatDies) {
  const WorkerEnvironment detached("TALLY_TEST_WORKER_DETACHED", "1");
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "die");
  WorkerOptions o = stand_in_options();
  o.work_dir = (fs::temp_directory_path() / ("tally-worker-dies-" + std::to_string(::getpid()))).string();
  WorkerPool pool(o);
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_NE(run.verdict.infra_message.find("the worker exited during case-1"), std::string::npos) << run.verdict.infra_message;
  const pid_t child = detached_child(fs::path(o.work_dir) / "world-2");
  ASSERT_GT(child, 0);
  EXPECT_TRUE(ends_within(child, 2.0)) << "the dead launcher's child in its own session lingers";
  fs::remove_all(o.work_dir);
}

// A child started in a session of its own just before the worker dies is never seen in the worker's
// tree (its parent is gone before tally looks): tally, their subreaper, takes it in, and its
// environment says whose it is.
TEST(WorkerPool, AChildDetachedJustBeforeTheWorkerDiesEndsWithIt) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "detach-and-die");
  WorkerOptions o = stand_in_options();
  o.work_dir = (fs::temp_directory_path() / ("tally-worker-late-" + std::to_string(::getpid()))).string();
  WorkerPool pool(o);
  const WorkerRun run = pool.execute(founding_case());
  EXPECT_NE(run.verdict.infra_message.find("the worker exited during case-1"), std::string::npos) << run.verdict.infra_message;
  std::ifstream in(fs::path(o.work_dir) / "world-2" / "late.pid");
  pid_t child = 0;
  in >> child;
  ASSERT_GT(child, 0);
  EXPECT_TRUE(ends_within(child, 2.0)) << "the child detached before the worker died lingers";
  EXPECT_FALSE(fs::exists("/proc/" + std::to_string(child))) << "and is reaped, not left a zombie";
  fs::remove_all(o.work_dir);
}

TEST(WorkerPool, ADoubleForkedDaemonEndsWithThePool) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "daemon");
  WorkerOptions o = stand_in_options();
  o.work_dir = (fs::temp_directory_path() / ("tally-worker-daemon-" + std::to_string(::getpid()))).string();
  std::vector<pid_t> daemons;
  {
    WorkerPool pool(o);
    EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass);
    EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass);
    std::ifstream in(fs::path(o.work_dir) / "daemon.pids");
    for (pid_t pid = 0; in >> pid;) daemons.push_back(pid);
    ASSERT_EQ(daemons.size(), 2u);
    EXPECT_TRUE(running(daemons.front())) << "a daemon runs while its worker does";
  }
  for (pid_t daemon : daemons) EXPECT_TRUE(ends_within(daemon, 2.0)) << "daemon " << daemon << " outlived the pool";
  fs::remove_all(o.work_dir);
}

TEST(WorkerPool, AnOrphanThatEndsByItselfIsReapedWhileThePoolRuns) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "brief-daemon");
  WorkerOptions o = stand_in_options();
  o.work_dir = (fs::temp_directory_path() / ("tally-worker-brief-" + std::to_string(::getpid()))).string();
  {
    WorkerPool pool(o);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass);
    std::ifstream in(fs::path(o.work_dir) / "daemon.pids");
    std::vector<pid_t> daemons;
    for (pid_t pid = 0; in >> pid;) daemons.push_back(pid);
    ASSERT_EQ(daemons.size(), 3u);
    // The first two ended a case or more ago: reaped by this process, their subreaper, not zombies.
    for (std::size_t i = 0; i + 1 < daemons.size(); ++i)
      EXPECT_FALSE(fs::exists("/proc/" + std::to_string(daemons[i])))
          << "daemon " << daemons[i] << " ended by itself and is left a zombie of the pool";
  }
  fs::remove_all(o.work_dir);
}

TEST(WorkerPool, AFloodingWorkersLogStaysWithinItsBound) {
  const WorkerEnvironment mode("TALLY_TEST_WORKER_MODE", "flood");  // 160 MB a case
  WorkerOptions o = stand_in_options();
  o.work_dir = (fs::temp_directory_path() / ("tally-worker-flood-" + std::to_string(::getpid()))).string();
  {
    WorkerPool pool(o);
    EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass);
    EXPECT_EQ(pool.execute(founding_case()).verdict.kind, oracle::Verdict::Kind::pass);
  }
  const fs::path log = fs::path(o.work_dir) / "world-2" / "worker.log";
  // The bound, and what a worker printing at full speed adds in the 10 ms between two looks.
  EXPECT_LE(fs::file_size(log), std::uintmax_t{96} << 20);
  const std::string text = testing::text_of(log);
  EXPECT_EQ(text.rfind("model_worker.sh: world 2 up", 0), 0u) << "the log keeps its start";
  EXPECT_NE(text.find(" bytes of the worker's output left out here; the newest follow]"), std::string::npos);
  EXPECT_NE(text.find("model_worker.sh: flooded at case 2", text.size() - (1 << 20)), std::string::npos) << "and its newest lines";
  fs::remove_all(o.work_dir);
}

TEST(WorkerPool, AHelloWhoseVersionIsNotAReleaseIsRefusedNotReadAsOne) {
  expect_hello_refused(hello_error("hello-version-not-a-version"),
                       "hello.version: expected a release such as \"0.19.2\"");
}

TEST(WorkerPool, TheWorkDirHoldsOneQueuePerWorld) {
  const fs::path dir = fs::temp_directory_path() / ("tally-worker-test-" + std::to_string(::getpid()));
  WorkerOptions o = stand_in_options();
  o.work_dir = dir.string();
  {
    WorkerPool pool(o);
    pool.hello(2);
    EXPECT_TRUE(fs::exists(dir / "world-2" / "hello.json"));
    EXPECT_TRUE(fs::exists(dir / "world-2" / "worker.log"));
  }
  EXPECT_TRUE(fs::exists(dir)) << "a folder the user named is left for them";
  fs::remove_all(dir);
}

TEST(WorkerPool, SendsEachCaseTheEngineConfigurationItsTargetWrites) {
  const WorkerEnvironment framework("TALLY_TEST_WORKER_FRAMEWORK", "deepspeed");
  const fs::path dir = fs::temp_directory_path() / ("tally-engine-test-" + std::to_string(::getpid()));
  const FrameworkTarget& deepspeed = *framework_target("deepspeed");
  WorkerOptions o = stand_in_options();
  o.work_dir = dir.string();
  o.engine_config = [&deepspeed](const casefile::Case& c) -> std::optional<std::string> {
    if (auto config = deepspeed.engine_config(c)) return config->dump(2);
    return std::nullopt;
  };
  casefile::Case c = founding_case();
  c.topology.ep = 1;  // DeepSpeed's expert groups here must not span TP
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  {
    WorkerPool pool(o);
    const WorkerRun run = pool.execute(c);
    EXPECT_NE(run.verdict.kind, oracle::Verdict::Kind::infra_error) << run.verdict.infra_message;
    std::ifstream seen(dir / "world-2" / "case-1.engine.seen.json");
    ASSERT_TRUE(seen) << "the stand-in found no case-1.engine.json";
    EXPECT_EQ(nlohmann::ordered_json::parse(seen), *deepspeed.engine_config(c));
    EXPECT_FALSE(fs::exists(dir / "world-2" / "case-1.engine.json")) << "removed with the request";
  }
  fs::remove_all(dir);
}

TEST(LogicalGradients, HoldEveryLogicalParamsStoredValuesInModelOrder) {
  const casefile::Case c = founding_case();
  const LogicalGradients g = logical_gradients(c);
  const topologies::LogicalModel model(c.model, c.topology);
  ASSERT_EQ(static_cast<std::int64_t>(g.values.size()), model.total_elements());
  const nlohmann::json index = nlohmann::json::parse(g.index_json);
  ASSERT_EQ(index.at("params").size(), static_cast<std::size_t>(model.size()));
  // The case's class mask too: only the expert FC2 biases have gradients.
  const std::vector<kernels::GeneratorSpec> specs = vocab::param_generators(c.path.gradients, model);
  double sum_squares = 0.0;
  for (const topologies::LogicalParam& p : model.params()) {
    const nlohmann::json& entry = index.at("params").at(static_cast<std::size_t>(p.id));
    EXPECT_EQ(entry.at("name"), p.name);
    const std::size_t offset = entry.at("offset").get<std::size_t>();
    const kernels::GeneratorSpec& spec = specs[static_cast<std::size_t>(p.id)];
    const std::uint64_t key = kernels::stream_key(spec.seed, static_cast<std::uint64_t>(p.id));
    for (std::int64_t e = 0; e < p.numel; ++e) {
      const float value = g.values[offset + static_cast<std::size_t>(e)];
      EXPECT_EQ(value, kernels::stored_value(spec, key, static_cast<std::uint64_t>(e))) << p.name << " element " << e;
      sum_squares += static_cast<double>(value) * value;
    }
  }
  EXPECT_EQ(sum_squares, 2.0 * 8.0) << "ones on the 2 experts' FC2 biases of hidden 8";
}

TEST(LogicalGradients, NameEachParamsStageAndTheTiedCopyOfTheLastStage) {
  casefile::Case c = founding_case();
  c.topology = {.world = 2, .pp = 2};
  c.model = {};
  c.model.num_layers = 2;
  ASSERT_FALSE(casefile::check_case(c));
  const topologies::LogicalModel model(c.model, c.topology);
  const nlohmann::json index = nlohmann::json::parse(logical_gradients(c).index_json);
  int copies = 0;
  for (const topologies::LogicalParam& p : model.params()) {
    const nlohmann::json& entry = index.at("params").at(static_cast<std::size_t>(p.id));
    EXPECT_EQ(entry.at("stage"), p.stage) << p.name;
    if (entry.value("last_stage_copy", false)) {
      ++copies;
      EXPECT_EQ(p.name, "embedding.word_embeddings.weight");
      EXPECT_EQ(p.stage, 0) << "the copy's original lives on the first stage";
    }
  }
  EXPECT_EQ(copies, 1) << "the tied output layer: the last stage holds a copy of the word embedding";
  c.model.untie_embeddings_and_output_weights = true;
  EXPECT_EQ(logical_gradients(c).index_json.find("last_stage_copy"), std::string::npos);
  c.model.untie_embeddings_and_output_weights = false;
  c.topology = {.world = 2, .tp = 2};
  EXPECT_EQ(logical_gradients(c).index_json.find("last_stage_copy"), std::string::npos) << "PP 1: one param";
}

TEST(LogicalGradients, NameTheDimTensorParallelismSplitsEachParamAlong) {
  casefile::Case c = founding_case();
  const topologies::LogicalModel model(c.model, c.topology);
  const nlohmann::json index = nlohmann::json::parse(logical_gradients(c).index_json);
  std::set<std::string> classes;
  for (const topologies::LogicalParam& p : model.params()) {
    const nlohmann::json& split = index.at("params").at(static_cast<std::size_t>(p.id)).at("split_dim");
    const int dim = topologies::partition_dim(p.param_class);
    if (dim < 0)
      EXPECT_TRUE(split.is_null()) << p.name;
    else
      EXPECT_EQ(split, dim) << p.name;
    classes.insert(std::string(topologies::class_name(p.param_class)));
  }
  EXPECT_TRUE(classes.count("row") && classes.count("column") && classes.count("replicated") &&
              classes.count("expert-row-bias"))
      << "the founding case holds split and replicated classes of both kinds";
}

TEST(WorkerCommand, EveryWorldTokenIsReplaced) {
  EXPECT_EQ(worker_command_for("torchrun --nproc-per-node {world} w.py --world {world}", 8),
            "torchrun --nproc-per-node 8 w.py --world 8");
}

}  // namespace
}  // namespace tally::run
