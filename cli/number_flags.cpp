#include "cli/number_flags.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace tally::cli {

namespace {

std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

bool all_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char ch : text)
    if (ch < '0' || ch > '9') return false;
  return true;
}

// The shortest text that reads back as `x`: bounds in messages, never 300 digits.
std::string shortest(double x) {
  std::ostringstream out;
  out.precision(17);
  out << x;
  return out.str();
}

}  // namespace

std::optional<std::string> whole_number_error(std::string_view text, std::int64_t least,
                                              std::int64_t most) {
  const std::string_view digits = !text.empty() && text[0] == '-' ? text.substr(1) : text;
  if (!all_digits(digits))
    return "expected a whole number in decimal, got " + quoted(text);
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool too_large = error != std::errc() ? digits.size() == text.size() : value > most;
  const bool too_small = error != std::errc() ? !too_large : value < least;
  // A bound that is only the type's is not worth naming when the other side was broken.
  const bool type_bound = most >= kIntMax;
  if (too_small)
    return "must be " + (type_bound ? "at least " + std::to_string(least)
                                    : "between " + std::to_string(least) + " and " + std::to_string(most)) +
           ", got " + std::string(text);
  if (too_large)
    return "must be at most " + std::to_string(most) + ", got " + std::string(text);
  return std::nullopt;
}

std::optional<std::string> seed_error(std::string_view text) {
  if (!all_digits(text))
    return "expected a seed: a whole number from 0 to 18446744073709551615 in decimal, got " +
           quoted(text);
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size())
    return "a seed is at most 18446744073709551615, got " + std::string(text);
  return std::nullopt;
}

std::optional<std::string> real_number_error(std::string_view text, double least, double most) {
  // The grammar first: strtod alone also takes "nan", "inf", hex floats and leading spaces.
  std::size_t at = 0;
  auto digits = [&] {
    const std::size_t start = at;
    while (at < text.size() && text[at] >= '0' && text[at] <= '9') ++at;
    return at - start;
  };
  if (at < text.size() && text[at] == '-') ++at;
  std::size_t mantissa = digits();
  if (at < text.size() && text[at] == '.') {
    ++at;
    mantissa += digits();
  }
  bool valid = mantissa > 0;
  if (valid && at < text.size() && (text[at] == 'e' || text[at] == 'E')) {
    ++at;
    if (at < text.size() && (text[at] == '+' || text[at] == '-')) ++at;
    valid = digits() > 0;
  }
  if (!valid || at != text.size()) return "expected a finite number in decimal, got " + quoted(text);
  const std::string copy(text);
  errno = 0;
  const double value = std::strtod(copy.c_str(), nullptr);
  if (!std::isfinite(value) || value < least || value > most)
    return "must be between " + shortest(least) + " and " + shortest(most) + ", got " + copy;
  return std::nullopt;
}

std::optional<double> duration_seconds(std::string_view text) {
  double total = 0.0;
  std::size_t at = 0;
  int amounts = 0;
  while (at < text.size()) {
    const std::size_t start = at;
    while (at < text.size() && ((text[at] >= '0' && text[at] <= '9') || text[at] == '.')) ++at;
    const std::string_view amount = text.substr(start, at - start);
    if (real_number_error(amount, 0.0, kMostDurationSeconds)) return std::nullopt;
    double unit = 1.0;
    if (at < text.size()) {
      const char c = text[at++];
      if (c == 'm') unit = 60.0;
      else if (c == 'h') unit = 3600.0;
      else if (c != 's') return std::nullopt;
    } else if (amounts > 0) {
      return std::nullopt;  // "1h30": the last amount lacks its unit
    }
    total += std::strtod(std::string(amount).c_str(), nullptr) * unit;
    ++amounts;
  }
  if (amounts == 0 || !(total > 0.0) || total > kMostDurationSeconds) return std::nullopt;
  return total;
}

std::optional<std::string> duration_error(std::string_view text) {
  if (duration_seconds(text)) return std::nullopt;
  return "expected a duration longer than 0 and at most " + shortest(kMostDurationSeconds) +
         " s (e.g. 90s, 10m, 1h30m; a plain number is seconds), got " + quoted(text);
}

CLI::Validator whole_number(std::int64_t least, std::int64_t most) {
  return CLI::Validator(
      [least, most](std::string& text) { return whole_number_error(text, least, most).value_or(""); },
      most == kNoUpperBound ? "INT>=" + std::to_string(least)
                            : "INT in [" + std::to_string(least) + " - " + std::to_string(most) + "]");
}

CLI::Validator seed_number() {
  return CLI::Validator([](std::string& text) { return seed_error(text).value_or(""); },
                        "");
}

CLI::Validator duration() {
  return CLI::Validator([](std::string& text) { return duration_error(text).value_or(""); },
                        "DURATION");
}

CLI::Validator real_number(double least, double most) {
  return CLI::Validator(
      [least, most](std::string& text) { return real_number_error(text, least, most).value_or(""); },
      "NUMBER in [" + shortest(least) + " - " + shortest(most) + "]");
}

}  // namespace tally::cli
