#include "io/json_read.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <unordered_set>

#include "io/regular_file.h"

namespace tally::io {

using nlohmann::json;

void fail(const std::string& path, const std::string& why) { throw JsonReadError(path + ": " + why); }

namespace {

// Appends the compact dump of `value` to `out`, stopping once `out` is longer than `limit`, so
// showing a huge array costs no more than showing a short one.
void append_shown(const json& value, std::string& out, std::size_t limit) {
  if (out.size() > limit) return;
  if (value.is_array() || value.is_object()) {
    out += value.is_array() ? '[' : '{';
    bool first = true;
    for (auto it = value.begin(); it != value.end() && out.size() <= limit; ++it) {
      if (!first) out += ',';
      first = false;
      if (value.is_object()) out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ":";
      append_shown(*it, out, limit);
    }
    out += value.is_array() ? ']' : '}';
    return;
  }
  out += value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string shown(const json& value) {
  std::string text;
  append_shown(value, text, 40);
  if (text.size() > 40) {
    std::size_t cut = 37;  // not inside a UTF-8 sequence
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text = text.substr(0, cut) + "...";
  }
  return text;
}

const char* type_word(const json& value) {
  if (value.is_object()) return "an object";
  if (value.is_array()) return "an array";
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "a boolean";
  if (value.is_null()) return "null";
  return "a number";
}

std::int64_t read_integer(const json& value, const std::string& path, std::int64_t min,
                          std::int64_t max) {
  const std::string expected =
      min == 1   ? "a positive integer"
      : min == 0 ? "an integer >= 0"
                 : "an integer >= " + std::to_string(min);
  const std::string range = expected + " at most " + std::to_string(max);
  if (!value.is_number_integer()) fail(path, "expected " + expected + ", got " + shown(value));
  if (value.is_number_unsigned()) {
    // Non-negative literals parse as unsigned; compare before narrowing.
    const std::uint64_t v = value.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(max)) fail(path, "expected " + range + ", got " + shown(value));
    if (static_cast<std::int64_t>(v) < min) fail(path, "expected " + expected + ", got " + shown(value));
    return static_cast<std::int64_t>(v);
  }
  const std::int64_t v = value.get<std::int64_t>();
  if (v < min) fail(path, "expected " + expected + ", got " + shown(value));
  if (v > max) fail(path, "expected " + range + ", got " + shown(value));
  return v;
}

std::uint64_t read_uint64(const json& value, const std::string& path) {
  // Literals beyond 2^64 - 1 parse as floating point, and so are rejected here too.
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer() && value.get<std::int64_t>() == 0) return 0;  // "-0"
  fail(path, "expected an integer from 0 to 18446744073709551615, got " + shown(value));
}

double read_number(const json& value, const std::string& path) {
  if (!value.is_number()) fail(path, "expected a number, got " + shown(value));
  const double v = value.get<double>();
  if (!std::isfinite(v)) fail(path, "expected a finite number, got " + shown(value));
  return v;
}

bool read_bool(const json& value, const std::string& path) {
  if (!value.is_boolean()) fail(path, "expected true or false, got " + shown(value));
  return value.get<bool>();
}

std::string read_string(const json& value, const std::string& path, std::size_t max_length) {
  if (!value.is_string()) fail(path, "expected a string, got " + shown(value));
  const std::string& text = value.get_ref<const std::string&>();
  if (text.size() > max_length)
    fail(path, "a string of " + std::to_string(text.size()) + " bytes is longer than the " +
                   std::to_string(max_length) + " allowed");
  return text;
}

int read_choice(const json& value, const std::string& path,
                const std::vector<std::string_view>& names) {
  const std::string text = read_string(value, path);
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == text) return static_cast<int>(i);
  std::string list;
  for (std::size_t i = 0; i < names.size(); ++i) list += (i ? ", " : "") + std::string(names[i]);
  fail(path, "expected one of " + list + ", got " + shown(value));
}

const json& read_array(const json& value, const std::string& path, std::size_t max_size) {
  if (!value.is_array()) fail(path, std::string("expected an array, got ") + type_word(value));
  if (value.size() > max_size)
    fail(path, "has " + std::to_string(value.size()) + " elements; at most " +
                   std::to_string(max_size) + " are allowed");
  return value;
}

namespace {

// The length of the valid UTF-8 character of 2 to 4 bytes that starts `text` (no overlong form,
// no surrogate, at most U+10FFFF); 0 when there is none.
std::size_t utf8_character(std::string_view text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  const std::size_t length = lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3
                             : lead >= 0xF0 && lead <= 0xF4                                    ? 4
                                                                                               : 0;
  if (length == 0 || text.size() < length) return 0;
  for (std::size_t i = 1; i < length; ++i)
    if ((byte(i) & 0xC0) != 0x80) return 0;
  const unsigned char second = byte(1);
  if ((lead == 0xE0 && second < 0xA0) || (lead == 0xED && second > 0x9F) || (lead == 0xF0 && second < 0x90) ||
      (lead == 0xF4 && second > 0x8F))
    return 0;
  return length;
}

}  // namespace

std::string escape_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size(); ++at) {
    const char ch = text[at];
    const auto byte = static_cast<unsigned char>(ch);
    if (byte >= 0x80) {
      if (const std::size_t length = utf8_character(text.substr(at)); length > 0) {
        out.append(text.substr(at, length));
        at += length - 1;
      } else {
        char code[8];
        std::snprintf(code, sizeof code, "\\x%02x", byte);
        out += code;
      }
    } else if (byte >= 0x20 && byte != 0x7f) {
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '\r') {
      out += "\\r";
    } else {
      char code[8];
      std::snprintf(code, sizeof code, "\\x%02x", byte);
      out += code;
    }
  }
  return out;
}

std::string key_path(const std::string& path, const std::string& key) {
  const bool plain = !key.empty() && key.size() <= 64 &&
                     key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789_-") == std::string::npos;
  return plain ? path + "." + key : path + "[" + shown(json(key)) + "]";
}

void read_object(const json& object, const std::string& path, const std::vector<Field>& fields,
                 std::string_view what, const std::vector<std::string_view>& required) {
  if (!object.is_object()) fail(path, std::string("expected an object, got ") + type_word(object));
  for (const auto& [key, value] : object.items()) {
    const Field* field = nullptr;
    for (const Field& f : fields)
      if (f.key == key) field = &f;
    if (!field) fail(key_path(path, key), "unknown key for " + std::string(what));
    field->read(value, path + "." + key);
  }
  for (std::string_view key : required)
    if (!object.contains(std::string(key)))
      fail(path, "missing key '" + std::string(key) + "' for " + std::string(what));
}

namespace {

// A parse stopped by a limit; carries the complete message.
struct LimitExceeded {
  std::string message;
};

// A message of the parser, as one line of bounded length: the bytes it quotes of a garbage file
// written as escapes.
std::string one_line(std::string text) {
  constexpr std::size_t kMaxLength = 200;
  if (text.size() > kMaxLength) {
    std::size_t cut = kMaxLength - 3;  // not inside a UTF-8 sequence
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text = text.substr(0, cut) + "...";
  }
  for (char& ch : text)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
  return escape_controls(text);
}

}  // namespace

json parse_json(std::string_view text, std::string_view source, const ParseLimits& limits) {
  // One frame per open container: whether it is an array, its element count, and (objects)
  // the keys seen so far. nlohmann keeps the last of repeated keys; a document with two values
  // for one field is ambiguous, so it is rejected.
  struct Frame {
    bool array = false;
    std::size_t elements = 0;
    std::unordered_set<std::string> keys;
  };
  std::vector<Frame> frames;
  auto count_element = [&] {
    if (frames.empty() || !frames.back().array) return;
    if (++frames.back().elements > limits.max_array_size)
      throw LimitExceeded{std::string(source) + ": an array has more than " +
                          std::to_string(limits.max_array_size) + " elements"};
  };
  const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (frames.size() >= limits.max_depth)
          throw LimitExceeded{std::string(source) + ": nested deeper than " +
                              std::to_string(limits.max_depth) + " levels"};
        frames.push_back(Frame{event == json::parse_event_t::array_start, 0, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        count_element();
        break;
      case json::parse_event_t::key:
        if (!frames.empty() && !frames.back().keys.insert(parsed.get<std::string>()).second)
          throw LimitExceeded{std::string(source) + ": key '" +
                              one_line(parsed.get<std::string>()) +
                              "' appears twice in one object"};
        break;
      case json::parse_event_t::value: count_element(); break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const LimitExceeded& limit) {
    throw JsonReadError(limit.message);
  } catch (const json::exception& error) {
    // parse_error, and out_of_range for a number literal beyond double ("1e400").
    throw JsonReadError(std::string(source) + ": invalid JSON: " + one_line(error.what()));
  }
}

std::string read_bounded_file(const std::string& file, std::size_t max_bytes,
                              std::string_view noun) {
  // Only a regular file (or a link to one): opening a FIFO or a terminal would block forever.
  const RegularFile opened(file);
  switch (opened.problem()) {
    case RegularFile::Problem::none: break;
    case RegularFile::Problem::not_regular:
      if (opened.kind() == "folder") throw JsonReadError(file + ": is a folder, not a " + std::string(noun));
      throw JsonReadError(file + ": is a " + opened.kind() + ", not a " + std::string(noun) +
                          " (only regular files are read)");
    case RegularFile::Problem::replaced:
      throw JsonReadError(file + ": is not a regular file once opened, not a " + std::string(noun) +
                          " (only regular files are read)");
    case RegularFile::Problem::cannot_stat:
    case RegularFile::Problem::cannot_open: throw JsonReadError(file + ": cannot open the " + std::string(noun));
  }
  // Read to the end (the file may have grown since it was opened), never past one byte over the bound.
  constexpr std::size_t kChunk = 1 << 16;
  std::string text;
  for (;;) {
    const std::optional<std::string> chunk =
        opened.read(static_cast<off_t>(text.size()), std::min(kChunk, max_bytes + 1 - text.size()));
    if (!chunk) throw JsonReadError(file + ": cannot read the " + std::string(noun));
    if (chunk->empty()) break;
    text += *chunk;
    if (text.size() > max_bytes)
      throw JsonReadError(file + ": larger than " + std::to_string(max_bytes >> 20) +
                          " MiB, more than a " + std::string(noun) + " holds");
  }
  return text;
}

}  // namespace tally::io
