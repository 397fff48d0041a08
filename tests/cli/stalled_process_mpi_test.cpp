// A process of an mpi job that stops (SIGSTOP) or a timeout shorter than start-up: the job ends
// with exit code 3, each process that gave up prints one line naming what it waited for, and
// nothing hangs, crashes or reports an internal error. Each test runs stall_helper.cpp under
// mpirun -np 2, bounded by `timeout` so that a job that hangs fails the test instead of CTest.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "casefile/case_file.h"
#include "run/target.h"

namespace {

namespace fs = std::filesystem;

constexpr int kLimitSeconds = 20;  // a job still running then has hung

struct JobResult {
  int exit_code = -1;  // 124: killed by `timeout`
  std::string err;
};

std::string quoted(const std::string& word) { return "'" + word + "'"; }

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(TALLY_BINARY_DIR) / "tests" / "cli" / "stalled-process" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Runs `mpirun -np 2 stall_helper ARGS` with its stderr in `dir`.
JobResult run_job(const fs::path& dir, const std::vector<std::string>& args) {
  std::string command = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 " +
                        std::to_string(kLimitSeconds) + " " + quoted(TALLY_MPIEXEC_PATH) +
                        " --oversubscribe -np 2 " + quoted(TALLY_STALL_HELPER);
  for (const std::string& arg : args) command += " " + quoted(arg);
  command += " >" + quoted((dir / "out").string()) + " 2>" + quoted((dir / "err").string());
  const int status = std::system(command.c_str());
  JobResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = read_text(dir / "err");
  return result;
}

// The job ended with exit code 3; every line tally printed is one process's infrastructure
// failure, at most one per process; one is `waiter`'s and matches `waited` (what it waited for).
void expect_job_ended(const JobResult& job, int waiter, const std::string& waited) {
  ASSERT_NE(job.exit_code, 124) << "the job did not end within " << kLimitSeconds
                                << " s; stderr:\n" << job.err;
  EXPECT_EQ(job.exit_code, 3) << job.err;
  EXPECT_EQ(job.err.find("terminate called"), std::string::npos) << job.err;
  EXPECT_EQ(job.err.find("internal error"), std::string::npos) << job.err;
  EXPECT_EQ(job.err.find("tally: error"), std::string::npos) << job.err;
  const std::regex line_format("^tally: rank ([01]): infrastructure failure: rank \\1 waited "
                               "[0-9.e+-]+ s in (.*): a member never joined \\(the job would hang\\)$");
  std::map<int, std::string> waited_for;  // by rank
  std::istringstream lines(job.err);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("tally", 0) != 0) continue;  // mpirun's own lines
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, line_format)) << "unexpected line: " << line;
    const int rank = std::stoi(match[1]);
    EXPECT_EQ(waited_for.count(rank), 0u) << "rank " << rank << " printed two lines:\n" << job.err;
    waited_for[rank] = match[2];
  }
  ASSERT_EQ(waited_for.count(waiter), 1u) << "no line from rank " << waiter << ":\n" << job.err;
  EXPECT_TRUE(std::regex_match(waited_for[waiter], std::regex(waited))) << waited_for[waiter];
}

bool have_mpirun() { return std::string(TALLY_MPIEXEC_PATH).size() > 0; }

const std::string kSeed = std::string(TALLY_SOURCE_DIR) + "/seeds/average-rank-norms.pass.json";

// Rank 1 stops before it serves any case; `tally run` on rank 0 gives up in the case's broadcast
// (the case is large) or in creating its communicators, and ends the job.
TEST(StalledProcess, TallyRunEndsWhenAServingProcessStops) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun found when tally was configured";
  const fs::path dir = scratch("run");
  tally::casefile::Case c = tally::casefile::load_case_file(kSeed, tally::run::case_frameworks());
  c.description = std::string(4000, 'x');  // past the eager limit: the broadcast waits for rank 1
  tally::casefile::write_case_file((dir / "case.json").string(), c, tally::run::case_frameworks());
  const JobResult job = run_job(dir, {"cli", "1", "run", (dir / "case.json").string(), "--backend",
                                      "mpi", "--timeout", "2"});
  expect_job_ended(job, 0, "broadcast of a case|MPI_Comm_split of the .* communicators");
}

// The same in a campaign, whose command catches errors (cli/fuzz_command.cpp): the job still ends.
TEST(StalledProcess, TallyFuzzEndsWhenAServingProcessStops) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun found when tally was configured";
  const fs::path dir = scratch("fuzz");
  const JobResult job =
      run_job(dir, {"cli", "1", "fuzz", "--cases", "5", "--seed", "1", "--backend", "mpi",
                    "--timeout", "2", "--corpus", (dir / "corpus").string()});
  expect_job_ended(job, 0, "broadcast of a case|MPI_Comm_split of the .* communicators");
}

// Rank 0 stops after broadcasting a case, before creating its communicators: the serving
// process gives up waiting for it there and ends the job.
TEST(StalledProcess, ServingProcessEndsTheJobWhenRankZeroStops) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun found when tally was configured";
  const JobResult job = run_job(scratch("rank0"), {"engine", "0", "2", kSeed});
  expect_job_ended(job, 1, "MPI_Comm_split of the .* communicators");
}

// A timeout shorter than the processes' start-up skew: some wait expires, on either process,
// and the job ends as for any hang.
TEST(StalledProcess, TimeoutShorterThanStartUpEndsTheJob) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun found when tally was configured";
  const JobResult job = run_job(scratch("tiny-timeout"), {"engine", "-1", "1e-6", kSeed});
  ASSERT_NE(job.exit_code, 124) << "the job did not end within " << kLimitSeconds << " s";
  // Which process gives up first is up to the scheduler.
  const int waiter = job.err.find("tally: rank 0:") != std::string::npos ? 0 : 1;
  expect_job_ended(job, waiter, ".*");
}

}  // namespace
