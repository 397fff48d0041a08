// A regular file read by range without ever blocking (io/regular_file.h), and the bounded reader
// of users' files on top of it (io/json_read.h read_bounded_file).
#include "io/regular_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "io/json_read.h"

namespace tally::io {
namespace {

namespace fs = std::filesystem;

struct Folder {
  fs::path path = fs::temp_directory_path() / ("tally-regular-file-" + std::to_string(::getpid()));
  Folder() { fs::create_directories(path); }
  ~Folder() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
};

TEST(RegularFile, ReadsAnyRangeAndLessAtTheEnd) {
  Folder folder;
  const RegularFile file(folder.write("log", "0123456789").string());
  ASSERT_TRUE(file.is_open());
  EXPECT_EQ(file.size(), 10);
  EXPECT_EQ(file.read(3, 4), "3456");
  EXPECT_EQ(file.read(8, 100), "89");
  EXPECT_EQ(file.read(20, 5), "");
}

TEST(RegularFile, AFifoIsRefusedWithoutBlocking) {
  Folder folder;
  const fs::path fifo = folder.path / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const RegularFile file(fifo.string());  // a plain open would wait for a writer forever
  EXPECT_FALSE(file.is_open());
  EXPECT_EQ(file.problem(), RegularFile::Problem::not_regular);
  EXPECT_EQ(file.why_not(), "is a FIFO, not a regular file");
}

TEST(RegularFile, AFolderAndAMissingFileSayWhy) {
  Folder folder;
  EXPECT_EQ(RegularFile(folder.path.string()).why_not(), "is a folder, not a regular file");
  const RegularFile missing((folder.path / "none").string());
  EXPECT_EQ(missing.problem(), RegularFile::Problem::cannot_stat);
  EXPECT_EQ(missing.why_not(), "cannot be read (No such file or directory)");
}

TEST(ReadBoundedFile, ReadsAWholeFileUpToItsBound) {
  Folder folder;
  const std::string text(200000, 'x');  // several of the reader's chunks
  EXPECT_EQ(read_bounded_file(folder.write("case.json", text).string(), 200000, "case file"), text);
}

TEST(ReadBoundedFile, ALargerFileNamesTheBoundAndTheNoun) {
  Folder folder;
  const std::string file = folder.write("model.json", std::string((1 << 20) + 1, ' ')).string();
  try {
    read_bounded_file(file, 1 << 20, "model file");
    FAIL() << "a file over the bound was read";
  } catch (const JsonReadError& error) {
    EXPECT_EQ(std::string(error.what()), file + ": larger than 1 MiB, more than a model file holds");
  }
}

TEST(ReadBoundedFile, AFifoAFolderAndAMissingFileAreRefusedByName) {
  Folder folder;
  const fs::path fifo = folder.path / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW(
      {
        try {
          read_bounded_file(fifo.string(), 100, "case file");
        } catch (const JsonReadError& error) {
          EXPECT_EQ(std::string(error.what()), fifo.string() + ": is a FIFO, not a case file (only regular files are read)");
          throw;
        }
      },
      JsonReadError);
  try {
    read_bounded_file(folder.path.string(), 100, "case file");
    FAIL();
  } catch (const JsonReadError& error) {
    EXPECT_EQ(std::string(error.what()), folder.path.string() + ": is a folder, not a case file");
  }
  try {
    read_bounded_file((folder.path / "none").string(), 100, "case file");
    FAIL();
  } catch (const JsonReadError& error) {
    EXPECT_EQ(std::string(error.what()), (folder.path / "none").string() + ": cannot open the case file");
  }
}

}  // namespace
}  // namespace tally::io
