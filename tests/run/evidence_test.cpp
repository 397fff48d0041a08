// A real run's manifests copied next to its saved case (run/evidence.h): only regular files and
// folders, whatever else a worker left there listed with why, and a copy that never blocks on it.
#include "run/evidence.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/support/files.h"

namespace tally::run {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& file) { return testing::text_of(file); }

void write(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }

class EvidenceCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tally-evidence-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(from());
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path from() const { return root_ / "case-3"; }
  fs::path to() const { return root_ / "saved.manifests"; }
  fs::path root_;
};

TEST_F(EvidenceCopyTest, CopiesRegularFilesAndFoldersAndListsNothingWhenThatIsAll) {
  write(from() / "rank-0.json", "{\"rank\": 0}\n");
  write(from() / "groups.json", "{}\n");
  fs::create_directories(from() / "extra");
  write(from() / "extra" / "note.txt", "x");
  const EvidenceCopy copy = copy_evidence(from(), to());
  EXPECT_TRUE(copy.left_out.empty());
  EXPECT_EQ(read(to() / "rank-0.json"), "{\"rank\": 0}\n");
  EXPECT_EQ(read(to() / "extra" / "note.txt"), "x");
  EXPECT_FALSE(fs::exists(to() / kNotCopiedFile));
}

TEST_F(EvidenceCopyTest, LeavesOutFifosLinksAndDevicesWithoutBlockingAndListsThem) {
  write(from() / "rank-1.json", "{}\n");
  ASSERT_EQ(::mkfifo((from() / "rank-0.json").c_str(), 0644), 0);
  fs::create_symlink("/dev/zero", from() / "rank-2.json");
  fs::create_symlink(from() / "rank-1.json", from() / "rank-3.json");
  const auto start = std::chrono::steady_clock::now();
  const EvidenceCopy copy = copy_evidence(from(), to());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  ASSERT_EQ(copy.left_out.size(), 3u);
  const std::string listed = read(to() / kNotCopiedFile);
  EXPECT_NE(listed.find("rank-0.json: a FIFO, not copied"), std::string::npos) << listed;
  EXPECT_NE(listed.find("rank-2.json: a symbolic link, not copied"), std::string::npos) << listed;
  EXPECT_NE(listed.find("rank-3.json: a symbolic link, not copied"), std::string::npos) << "a link is never followed";
  EXPECT_TRUE(fs::is_regular_file(to() / "rank-1.json"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(to() / "rank-0.json")));
}

TEST_F(EvidenceCopyTest, AFolderThatIsGoneIsListedNotAnError) {
  fs::remove_all(from());
  const EvidenceCopy copy = copy_evidence(from(), to());
  ASSERT_EQ(copy.left_out.size(), 1u);
  EXPECT_NE(copy.left_out[0].find("missing (the worker left no folder of manifests)"), std::string::npos) << copy.left_out[0];
}

TEST_F(EvidenceCopyTest, ReplacesWhatAnEarlierCopyLeft) {
  fs::create_directories(to());
  write(to() / "rank-9.json", "stale");
  write(from() / "rank-0.json", "{}");
  copy_evidence(from(), to());
  EXPECT_FALSE(fs::exists(to() / "rank-9.json"));
  EXPECT_TRUE(fs::exists(to() / "rank-0.json"));
}

TEST_F(EvidenceCopyTest, ACopyThatCannotBeWrittenNamesWhereItWasGoing) {
  write(from() / "rank-0.json", "{}");
  write(root_ / "a-file", "");
  try {
    copy_evidence(from(), root_ / "a-file" / "saved.manifests");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("a-file/saved.manifests"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace tally::run
