// Case files: the durable, human-editable form of a Case (docs/case-files.md). Versioned
// JSON; reading is strict (an unknown key, a wrong type, a number out of range is an error
// naming the field path and the rule, e.g. `case.topology.tp: expected a positive integer,
// got 0`); writing gives the canonical form, and reading then writing a canonical file gives
// the same bytes.
#pragma once

#include <cstddef>
#include <optional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "casefile/case.h"

namespace tally::casefile {

inline constexpr int kCaseFileVersion = 1;
// The largest case file load_case_file reads (a custom layout of 10^6 params fits).
inline constexpr std::size_t kMaxCaseFileBytes = std::size_t{16} << 20;
inline constexpr std::size_t kMaxDescriptionBytes = 4096;

// Why `description` cannot be a case's description (longer than kMaxDescriptionBytes, or not one
// line of text), or nullopt. The reader and every writer apply this one rule.
std::optional<std::string> description_error(std::string_view description);
// `text` made a valid description: control characters become '?', and a text too long is cut
// (between UTF-8 characters) and ends in "...". For descriptions tally builds from paths.
std::string fit_description(std::string_view text);

// One line naming the file (when there is one), the field path and the problem.
class CaseFileError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Where gradients enter a framework's reduction, as a case writes it (gradients.enter, a
// framework section's gradients_enter): "after_reduction", the default, which a writer leaves out so
// earlier case files keep their digests, or kBeforeReduction. Strict: throws io::JsonReadError
// naming `path`.
inline constexpr std::string_view kBeforeReduction = "before_reduction";
bool read_before_reduction(const nlohmann::json& value, const std::string& path);

// The canonical JSON of a case (docs/case-files.md). case_from_json(case_to_json(c)) == c for
// every valid case whose gradient class_mask is ~0 (all classes, written without "classes") or
// a subset of the param classes (anything else throws std::invalid_argument).
nlohmann::ordered_json case_to_json(const Case& c);
// Reads every field strictly, then checks the case as a whole (check_case, and that expected
// p-norm statistics and miscounted params exist in the case). `frameworks`: the real frameworks a
// case may name and the sections they read (run::case_frameworks(); a key of none is unknown).
// Messages: "<path>.<field>: <rule>" for a field, check_case's line for a rule of the whole case.
Case case_from_json(const nlohmann::json& json, FrameworkSchemas frameworks, std::string_view path = "case");

// The canonical text of a case file (2-space indented JSON and a final newline).
std::string case_to_text(const Case& c);
// Parses (bounded: nesting depth 64, arrays of 10^6 elements, no repeated keys) and reads.
// Every message starts with `source`: "FILE.json: case.topology.tp: expected ...".
Case case_from_text(std::string_view text, std::string_view source, FrameworkSchemas frameworks);

// Reads a case file (bounded size). Throws CaseFileError.
Case load_case_file(const std::string& file, FrameworkSchemas frameworks);
// Writes atomically: a temporary file in the same folder, flushed, then renamed over `file`,
// so a reader (or a crash) never sees a partial case. Throws std::runtime_error on I/O errors,
// std::invalid_argument (writing nothing) when load_case_file would reject what it would write.
void write_case_file(const std::string& file, const Case& c, FrameworkSchemas frameworks);

}  // namespace tally::casefile
