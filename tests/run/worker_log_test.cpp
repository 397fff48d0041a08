// A worker's log (run/worker_log.h): everything the worker writes, until the bound; past it, the
// start, about how much was left out, and the newest output.
#include "run/worker_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/support/files.h"
#include <thread>

namespace tally::run {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& file) { return testing::text_of(file); }

void write_all(int fd, const std::string& text) {
  for (std::size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    ASSERT_GT(n, 0);
    at += static_cast<std::size_t>(n);
  }
}

fs::path log_file(const char* name) {
  return fs::temp_directory_path() / ("tally-worker-log-" + std::string(name) + "-" + std::to_string(::getpid()));
}

TEST(WorkerLog, HoldsWhatTheWorkerWrote) {
  const fs::path file = log_file("small");
  {
    WorkerLog log(file);
    write_all(log.fd(), "first line\nsecond line\n");
    EXPECT_EQ(read(file), "first line\nsecond line\n");
    EXPECT_EQ(log.left_out_bytes(), 0u);
  }
  fs::remove(file);
}

TEST(WorkerLog, PastItsBoundKeepsItsStartHowMuchWasLeftOutAndTheNewest) {
  const fs::path file = log_file("bounded");
  // 64 KiB, its first 4 KiB kept; the thread never looks (bytes appended while the log is cut are
  // only "about" counted): the test looks once the worker has written.
  const WorkerLog::Bounds bounds{1 << 16, 1 << 12, 3600 * 1000};
  {
    WorkerLog log(file, bounds);
    const int worker = ::dup(log.fd());  // the worker's stdout: the same file, appending
    std::string output = "START\n";
    for (int i = 0; i < 5000; ++i) output += std::string(99, 'x') + "\n";  // 500 KB
    output += "NEWEST\n";
    write_all(worker, output);
    ::close(worker);
    log.enforce_bound();
    const std::string text = read(file);
    EXPECT_LE(text.size(), bounds.max_bytes);
    EXPECT_EQ(text.rfind("START\n", 0), 0u);
    EXPECT_EQ(text.substr(text.size() - 7), "NEWEST\n");
    EXPECT_GT(log.left_out_bytes(), 400000u);
    // Every byte the worker wrote is in the file or counted as left out, none twice.
    const std::size_t marker_begin = text.rfind("\n[tally: about ");
    ASSERT_NE(marker_begin, std::string::npos);
    const std::size_t marker_end = text.find("follow]\n", marker_begin) + 8;
    EXPECT_EQ(marker_begin, bounds.head_bytes);
    EXPECT_NE(text.find("about " + std::to_string(log.left_out_bytes()) + " bytes"), std::string::npos);
    EXPECT_EQ(text.size() - (marker_end - marker_begin) + log.left_out_bytes(), 6u + 5000u * 100u + 7u);
  }
  fs::remove(file);
}

TEST(WorkerLog, TheWorkerAppendsAfterItsLogWasCut) {
  const fs::path file = log_file("append");
  const WorkerLog::Bounds bounds{1 << 16, 1 << 12, 1};
  {
    WorkerLog log(file, bounds);
    const int worker = ::dup(log.fd());
    write_all(worker, std::string(1 << 17, 'y'));
    for (int i = 0; i < 500 && log.left_out_bytes() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_GT(log.left_out_bytes(), 0u);
    write_all(worker, "AFTER THE CUT\n");
    ::close(worker);
    const std::string text = read(file);
    EXPECT_EQ(text.substr(text.size() - 14), "AFTER THE CUT\n") << "no hole, no overwrite: appended at the new end";
    EXPECT_LE(text.size(), bounds.max_bytes);
  }
  fs::remove(file);
}

}  // namespace
}  // namespace tally::run
