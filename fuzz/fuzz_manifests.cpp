// libFuzzer target for `tally check` (built with -DTALLY_BUILD_LIBFUZZER=ON and clang;
// ci/fuzz-manifests runs it). The input frames a folder of manifests (fuzz/manifest_properties.h:
// "=== rank-0.json" lines before each file); it is read, validated, rebuilt and judged as tally
// check does, and every property of fuzz/manifest_properties.h must hold. A broken property, a
// crash, a sanitizer report, a leak or a timeout is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz/manifest_properties.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string broken =
      tally::fuzz::broken_property(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!broken.empty()) {
    std::fprintf(stderr, "fuzz_manifests: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
