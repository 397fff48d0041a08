// The properties the manifest fuzzer checks (fuzz/manifest_properties.h), on the real runs and
// hand-written folders (each accepted or rejected as it should be) and on every input kept in
// tests/manifest/manifest_fuzz_crashes/ after a finding was fixed.
#include "fuzz/manifest_properties.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tally::fuzz {
namespace {

namespace fs = std::filesystem;

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// The rank-<R>.json files of a folder and its groups.json, framed (as ci/fuzz-manifests frames its seeds).
std::string framed_folder(const fs::path& folder) {
  std::vector<FramedFile> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder))
    if (entry.path().extension() == ".json") files.push_back({entry.path().filename().string(), bytes_of(entry.path())});
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return frame(files);
}

TEST(ManifestFraming, FramedFilesComeBackAsTheyWere) {
  const std::vector<FramedFile> files = {
      {"rank-0.json", "{\n  \"a\": \"=== not a header\"\n}\n"}, {"rank-1.json", ""}, {"notes.txt", "x\n\n"}};
  EXPECT_EQ(unframe(frame(files)), files);
  EXPECT_EQ(unframe("ignored\n=== rank-0.json\n{}"), (std::vector<FramedFile>{{"rank-0.json", "{}"}}));
  EXPECT_EQ(unframe("=== rank-0.json"), (std::vector<FramedFile>{{"rank-0.json", ""}}));
  EXPECT_TRUE(unframe("no header").empty());
}

TEST(ManifestProperties, EveryRealAndHandWrittenRunKeepsThem) {
  const fs::path root(TALLY_SOURCE_DIR);
  int folders = 0;
  for (const fs::path& parent : {root / "tests/fixtures/manifests/megatron-core-0.16.1",
                                  root / "tests/fixtures/manifests/megatron-core-0.16.1-v2",
                                  root / "tests/fixtures/manifests/megatron-core-0.19.2", root / "tests/cli/data"})
    for (const fs::directory_entry& entry : fs::directory_iterator(parent)) {
      if (!entry.is_directory()) continue;
      ++folders;
      EXPECT_EQ(broken_property(framed_folder(entry.path())), "") << entry.path();
    }
  EXPECT_GE(folders, 27);
}

TEST(ManifestProperties, EveryKeptFindingKeepsThem) {
  int inputs = 0;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(fs::path(TALLY_SOURCE_DIR) / "tests/manifest/manifest_fuzz_crashes")) {
    if (!entry.is_regular_file()) continue;
    ++inputs;
    EXPECT_EQ(broken_property(bytes_of(entry.path())), "") << entry.path();
  }
  EXPECT_GE(inputs, 1);
}

}  // namespace
}  // namespace tally::fuzz
