// Inputs that are not regular files: opening a FIFO for reading blocks until a writer comes, so
// each reader once hung forever on one. Every command refuses them with exit 2 and one line.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/usage_error.h"

namespace tally::cli {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code = 0;
  std::string out, err;
};

Outcome run(std::vector<std::string> args) {
  args.insert(args.begin(), "tally");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = run_tally(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

class NotARegularFile : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test process: ctest runs these tests in parallel processes.
    folder_ = fs::path(::testing::TempDir()) / ("tally-not-regular-" + std::to_string(::getpid()));
    fs::remove_all(folder_);
    fs::create_directories(folder_);
    fifo_ = (folder_ / "input.json").string();
    ASSERT_EQ(::mkfifo(fifo_.c_str(), 0600), 0);
  }
  void TearDown() override { fs::remove_all(folder_); }

  void expect_refused(const Outcome& o) {
    EXPECT_EQ(o.code, kExitBadInput) << o.out << o.err;
    EXPECT_NE(o.err.find("is a FIFO, not a"), std::string::npos) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  }

  fs::path folder_;
  std::string fifo_;
};

TEST_F(NotARegularFile, RunShowAndReplayRefuseAFifoCaseFile) {
  expect_refused(run({"run", fifo_}));
  expect_refused(run({"show", fifo_}));
  expect_refused(run({"replay", fifo_}));
}

TEST_F(NotARegularFile, ModelFlagRefusesAFifo) {
  expect_refused(run({"run", "--world", "2", "--model", fifo_}));
  expect_refused(run({"layout", "--world", "2", "--model", fifo_}));
}

TEST_F(NotARegularFile, CheckRefusesAFifoRankFile) {
  const fs::path source = fs::path(TALLY_SOURCE_DIR) /
                          "tests/fixtures/manifests/megatron-core-0.16.1/chained-adam-tp1-pp2-hashed";
  const fs::path run_folder = folder_ / "run";
  fs::copy(source, run_folder);
  fs::remove(run_folder / "rank-1.json");
  ASSERT_EQ(::mkfifo((run_folder / "rank-1.json").c_str(), 0600), 0);
  expect_refused(run({"check", run_folder.string()}));
}

}  // namespace
}  // namespace tally::cli
