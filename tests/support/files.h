// Files the tests read back whole.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace tally::testing {

// The whole of `file` ("" when it cannot be opened).
inline std::string text_of(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace tally::testing
