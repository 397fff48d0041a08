// libFuzzer target for the case-file reader (built with -DTALLY_BUILD_LIBFUZZER=ON and clang;
// ci/fuzz-case-reader runs it). Any input must either read as a case or be rejected with a
// CaseFileError of one line; a crash, a sanitizer report, another exception, a leak or a
// timeout is a finding. A case that reads must also write back and read again to the same case
// and the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "casefile/case_file.h"
#include "run/target.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const tally::casefile::FrameworkSchemas frameworks = tally::run::case_frameworks();
  tally::casefile::Case c;
  try {
    c = tally::casefile::case_from_text(text, "input.json", frameworks);
  } catch (const tally::casefile::CaseFileError& error) {
    // Every message is one line (the CLI prints it as the one line of a bad input).
    if (std::string_view(error.what()).find('\n') != std::string_view::npos) std::abort();
    return 0;
  }
  // Round trip: what was read writes back canonically and reads to the same case.
  const std::string canonical = tally::casefile::case_to_text(c);
  if (!(tally::casefile::case_from_text(canonical, "canonical.json", frameworks) == c)) std::abort();
  if (tally::casefile::case_to_text(tally::casefile::case_from_text(canonical, "canonical.json", frameworks)) != canonical)
    std::abort();
  return 0;
}
