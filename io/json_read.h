// Strict reading of JSON documents that users write (model specs, case files): bounded
// parsing, and readers for one field each that name the field path and the rule on error.
// Shared by casefile/model_json.cpp, casefile/case_file.cpp and manifest/manifest_json.cpp;
// each translates JsonReadError into its own public error type at its boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tally::io {

// One line: "<path>: <why>".
class JsonReadError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

[[noreturn]] void fail(const std::string& path, const std::string& why);

// The value as it was written, shortened so a message stays one line.
std::string shown(const nlohmann::json& value);
// "an object", "an array", "a string", "a boolean", "null", "a number".
const char* type_word(const nlohmann::json& value);

// An integer literal in [min, max]; a fraction, a string or a literal out of range is an error.
std::int64_t read_integer(const nlohmann::json& value, const std::string& path, std::int64_t min,
                          std::int64_t max);
// An integer literal in [0, 2^64 - 1].
std::uint64_t read_uint64(const nlohmann::json& value, const std::string& path);
// Any JSON number (integer literals convert), finite.
double read_number(const nlohmann::json& value, const std::string& path);
bool read_bool(const nlohmann::json& value, const std::string& path);
// A string of at most `max_length` bytes.
std::string read_string(const nlohmann::json& value, const std::string& path,
                        std::size_t max_length = std::size_t{1} << 20);
// One of `names`, returned as its index.
int read_choice(const nlohmann::json& value, const std::string& path,
                const std::vector<std::string_view>& names);
// An array of at most `max_size` elements (the elements are the caller's to read).
const nlohmann::json& read_array(const nlohmann::json& value, const std::string& path,
                                 std::size_t max_size);

// `text` with every control character written as an escape (\n, \t, \r, \x01, ...), and every
// byte that is not part of a valid UTF-8 character as \xNN, so a message that quotes user input
// (a garbage file's bytes) stays one printable line.
std::string escape_controls(std::string_view text);

// "case.topology" and "tp" -> "case.topology.tp"; a key that is not a plain name is shown
// JSON-quoted: case["to\nol"], so a message stays one line.
std::string key_path(const std::string& path, const std::string& key);

// A reader for one key of an object.
using FieldReader = std::function<void(const nlohmann::json& value, const std::string& path)>;
struct Field {
  std::string_view key;
  FieldReader read;
};

// Reads every key of `object` with its field (an unknown key is an error naming it), then
// checks that the `required` keys are present. `what` names the object in messages.
void read_object(const nlohmann::json& object, const std::string& path,
                 const std::vector<Field>& fields, std::string_view what,
                 const std::vector<std::string_view>& required = {});

// What parse_json accepts. Every limit is checked while parsing, before any deeper recursion
// or larger allocation than the input itself needs.
struct ParseLimits {
  std::size_t max_depth = 64;             // nested objects and arrays
  std::size_t max_array_size = 1'000'000;  // elements of one array
};

// Parses `text` as strict JSON (no comments, no trailing commas), rejecting a key that appears
// twice in one object and anything past `limits`. Errors are one line prefixed with `source`:
// "FILE.json: invalid JSON: ...", "FILE.json: nested deeper than 64 levels".
nlohmann::json parse_json(std::string_view text, std::string_view source,
                          const ParseLimits& limits = {});

// The bytes of `file`, at most `max_bytes`. Errors name the file and `noun` ("model file"):
// "FILE: cannot open the model file", "FILE: larger than 64 MiB, more than a model file holds".
std::string read_bounded_file(const std::string& file, std::size_t max_bytes,
                              std::string_view noun);

}  // namespace tally::io
