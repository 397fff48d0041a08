// Atomic writes (io/atomic_file.h): the temporary file names its writer, so what a killed run left
// is told from what a live one is writing.
#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace tally::io {
namespace {

namespace fs = std::filesystem;

fs::path fresh_folder(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A pid that is no process: a child that has ended and been reaped.
pid_t ended_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST(AtomicFile, WritesTheWholeTextAndLeavesNoTemporary) {
  const fs::path dir = fresh_folder("atomic-write");
  write_file_atomically((dir / "a.json").string(), "{}\n", "test file");
  std::ifstream in(dir / "a.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{}\n");
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
}

TEST(AtomicFile, TheTemporariesOfAnEndedWriterAreRemovedAndALiveOnesKept) {
  const fs::path dir = fresh_folder("atomic-orphans");
  const std::string dead = ".L007-moe.json.tmp." + std::to_string(ended_pid()) + ".a1B2c3";
  const std::string live = ".L008-moe.json.tmp." + std::to_string(::getpid()) + ".d4E5f6";
  for (const std::string& name : {dead, live, std::string(".notes.tmp.txt"), std::string("case.json")})
    std::ofstream(dir / name) << "x";
  EXPECT_EQ(remove_orphaned_temporaries(dir.string()), 1);
  EXPECT_FALSE(fs::exists(dir / dead));
  EXPECT_TRUE(fs::exists(dir / live)) << "a live writer's temporary stays";
  EXPECT_TRUE(fs::exists(dir / ".notes.tmp.txt")) << "not a temporary of ours";
  EXPECT_TRUE(fs::exists(dir / "case.json"));
  EXPECT_EQ(remove_orphaned_temporaries((dir / "missing").string()), 0);
}

}  // namespace
}  // namespace tally::io
