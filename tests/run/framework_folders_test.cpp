// A framework lives in its two folders (docs/architecture.md, "A real target"): no source file
// outside run/<framework>/ names what its run/<framework>/section.h declares (its configuration,
// its enums, its reader and writer, its CaseSection) or its section's key as a string, so adding
// or changing a framework edits no other framework's files. Tests are left out: a test of the
// table may name every framework.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "run/target.h"
#include "tests/support/files.h"

namespace tally::run {
namespace {

namespace fs = std::filesystem;

// run/<folder>/ of the row named `name` ("megatron-core" -> run/megatron_core).
fs::path folder_of(std::string_view name) {
  std::string folder(name);
  for (char& ch : folder)
    if (ch == '-') ch = '_';
  return fs::path(TALLY_SOURCE_DIR) / "run" / folder;
}

// The names section.h declares at namespace scope: its structs and enums, its constants, its functions.
std::set<std::string> declared_names(const std::string& header) {
  static const std::regex declaration(
      R"(^(?:struct|enum class) (\w+)|^inline constexpr [^={]*?\b(k\w+)(?:\[\])? ?[={]|^[\w:<>&, ]+?[ &*](\w+)\()");
  std::set<std::string> names;
  std::istringstream lines(header);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, declaration)) continue;
    for (int i = 1; i <= 3; ++i)
      if (m[i].matched) names.insert(m[i].str());
  }
  return names;
}

// Every C++ source of tally's own code (not its tests).
std::vector<fs::path> production_sources() {
  std::vector<fs::path> files;
  for (const char* top : {"casefile", "cli", "comm", "fuzz", "gradnorm", "io", "kernels", "manifest", "oracle",
                          "record", "run", "topologies", "vocab", "bench"})
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(fs::path(TALLY_SOURCE_DIR) / top)) {
      const std::string ext = entry.path().extension().string();
      if (entry.is_regular_file() && (ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".cuh")) files.push_back(entry.path());
    }
  return files;
}

TEST(FrameworkFolders, NoFileOutsideAFrameworksFolderNamesItsSection) {
  const std::vector<fs::path> sources = production_sources();
  int sections = 0;
  for (const FrameworkTarget* t : framework_targets()) {
    if (t->section.empty()) continue;
    ++sections;
    const fs::path folder = folder_of(t->name);
    const fs::path header = folder / "section.h";
    ASSERT_TRUE(fs::is_regular_file(header)) << t->name << "'s section belongs in " << header;
    const std::set<std::string> names = declared_names(testing::text_of(header));
    EXPECT_GE(names.size(), 4u) << header << ": its configuration, reader, writer and section";
    std::string alternatives;
    for (const std::string& n : names) alternatives += (alternatives.empty() ? "" : "|") + n;
    const std::regex named("\\b(" + alternatives + ")\\b|\"" + std::string(t->section) + "[\".]");
    for (const fs::path& file : sources) {
      if (file.parent_path() == folder) continue;
      const std::string text = testing::text_of(file);
      std::smatch m;
      if (std::regex_search(text, m, named))
        ADD_FAILURE() << file.lexically_relative(TALLY_SOURCE_DIR).string() << " names " << m.str() << ", which belongs to "
                      << folder.lexically_relative(TALLY_SOURCE_DIR).string() << "/";
    }
  }
  EXPECT_GE(sections, 4) << "megatron-core, DeepSpeed, torchtitan and Automodel each have a section";
}

}  // namespace
}  // namespace tally::run
