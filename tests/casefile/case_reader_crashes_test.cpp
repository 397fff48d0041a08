// Every input that once made the case-file reader fail under libFuzzer (ci/fuzz-case-reader),
// kept in tests/casefile/case_reader_crashes/: each must now read as a case or be rejected with a
// CaseFileError, never crash or throw anything else. Read as the fuzzer reads them: with the real
// frameworks' sections (run::case_frameworks()).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "casefile/case_file.h"
#include "run/target.h"

namespace tally::casefile {
namespace {

namespace fs = std::filesystem;

TEST(CaseReaderCrashes, EveryKeptInputIsReadOrRejected) {
  const fs::path folder = fs::path(TALLY_SOURCE_DIR) / "tests" / "casefile" / "case_reader_crashes";
  int inputs = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    ++inputs;
    try {
      const Case c = case_from_text(bytes.str(), entry.path().filename().string(), run::case_frameworks());
      EXPECT_EQ(case_from_text(case_to_text(c), "canonical.json", run::case_frameworks()), c) << entry.path();
    } catch (const CaseFileError& error) {
      EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << entry.path();
    } catch (const std::exception& error) {
      ADD_FAILURE() << entry.path() << ": " << typeid(error).name() << ": " << error.what();
    }
  }
  EXPECT_GE(inputs, 1);
}

}  // namespace
}  // namespace tally::casefile
