#include "fuzz/junit.h"

#include <cstdint>
#include <cstdio>

#include "io/atomic_file.h"

namespace tally::fuzz {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the valid UTF-8 sequence at text[i], or 0 when it is not one.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b = byte(i);
  std::size_t n = 0;
  std::uint32_t code = 0;
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) n = 2, code = b & 0x1F;
  else if (b >= 0xE0 && b <= 0xEF) n = 3, code = b & 0x0F;
  else if (b >= 0xF0 && b <= 0xF4) n = 4, code = b & 0x07;
  else return 0;
  if (i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  // Overlong forms, surrogates, beyond U+10FFFF, and the non-characters U+FFFE and U+FFFF,
  // which XML 1.0 does not allow.
  if ((n == 3 && code < 0x800) || (n == 4 && code < 0x10000) || code > 0x10FFFF ||
      (code >= 0xD800 && code <= 0xDFFF) || code == 0xFFFE || code == 0xFFFF)
    return 0;
  return n;
}

// Text for an attribute (`attribute`: tab and line breaks as character references, so they
// survive attribute normalisation) or for element content.
std::string escaped(std::string_view text, bool attribute = true) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const char ch = text[i];
    const std::size_t n = utf8_length(text, i);
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\t': out += attribute ? "&#9;" : "\t"; break;
      case '\n': out += attribute ? "&#10;" : "\n"; break;
      case '\r': out += "&#13;"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) out += kReplacement;
        else out += ch;
    }
    ++i;
  }
  return out;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", seconds > 0.0 ? seconds : 0.0);
  return text;
}

// The first line of a message, for the failure's message attribute.
std::string_view first_line(std::string_view text) { return text.substr(0, text.find('\n')); }

}  // namespace

std::string junit_xml(std::string_view suite, const std::vector<JunitCase>& cases) {
  std::size_t failures = 0, errors = 0, skipped = 0;
  double total = 0.0;
  for (const JunitCase& c : cases) {
    if (!c.failure.empty()) ++(c.error ? errors : failures);
    else if (!c.skipped.empty()) ++skipped;
    total += c.seconds > 0.0 ? c.seconds : 0.0;
  }
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  const std::string head = "name=\"" + escaped(suite) + "\" tests=\"" + std::to_string(cases.size()) +
                           "\" failures=\"" + std::to_string(failures) + "\" errors=\"" +
                           std::to_string(errors) + "\" skipped=\"" + std::to_string(skipped) + "\" time=\"" +
                           seconds_text(total) + "\"";
  out += "<testsuites " + head + ">\n";
  out += "  <testsuite " + head + ">\n";
  for (const JunitCase& c : cases) {
    out += "    <testcase name=\"" + escaped(c.name) + "\" classname=\"" + escaped(c.classname) +
           "\" time=\"" + seconds_text(c.seconds) + "\"";
    if (c.failure.empty() && !c.skipped.empty()) {
      out += ">\n      <skipped message=\"" + escaped(first_line(c.skipped)) + "\">" + escaped(c.skipped, false) +
             "</skipped>\n    </testcase>\n";
      continue;
    }
    if (c.failure.empty()) {
      out += "/>\n";
      continue;
    }
    const char* tag = c.error ? "error" : "failure";
    out += ">\n      <" + std::string(tag) + " message=\"" + escaped(first_line(c.failure)) +
           "\">" + escaped(c.failure, false) + "</" + tag + ">\n    </testcase>\n";
  }
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

void write_junit(const std::string& file, std::string_view suite,
                 const std::vector<JunitCase>& cases) {
  io::write_file_atomically(file, junit_xml(suite, cases), "JUnit report");
}

}  // namespace tally::fuzz
