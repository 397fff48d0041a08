// What `tally check` must do with any folder of manifests, as properties of one input: the
// libFuzzer target fuzz/fuzz_manifests.cpp checks them on arbitrary bytes (ci/fuzz-manifests),
// tests/fuzz/manifest_properties_test.cpp on the real runs and on every finding kept in
// tests/manifest/manifest_fuzz_crashes/. Not part of the tally_fuzz library: both compile this
// file, so the fuzzer links only what tally check's reading and judging need.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tally::fuzz {

// A folder as one byte string: each file starts with a line "=== NAME" and holds the bytes up to
// the next line starting with "=== " (the newline before it is the separator, not content) or
// the end. Bytes before the first such line are ignored.
struct FramedFile {
  std::string name;
  std::string text;
  friend bool operator==(const FramedFile&, const FramedFile&) = default;
};
std::vector<FramedFile> unframe(std::string_view input);
std::string frame(const std::vector<FramedFile>& files);

// The folder `input` frames read, validated, rebuilt and judged as `tally check` does
// (cli/check_command.cpp: manifest::read_run, manifest::to_record, the truth from box statistics,
// oracle::judge with the default --rtol). The first property it breaks, as a sentence; "" when
// it keeps them all:
//  - a rejection is a ManifestError, a RecordTooLarge or a TruthUnknown (tally check's exit 2)
//    whose message is one non-empty line; nothing else escapes;
//  - the same manifests judged twice give the same verdict;
//  - what the judge reads is possible and consistent (manifest/statistics.h), rechecked here on
//    the record, piece against piece;
//  - where no rank miscounts, every rank's ledger implies the truth's zero count exactly and its
//    norm within the rounding the validator allows: the validator and the judge agree on what
//    the statistics say.
std::string broken_property(std::string_view input);

}  // namespace tally::fuzz
