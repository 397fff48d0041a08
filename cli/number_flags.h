// One strict reading of numbers for every flag. CLI11 alone reads "0x2" as 2, "" as 0, "-1" as
// 2^64-1 for an unsigned flag, saturates what does not fit and takes "nan" and "inf" as reals;
// each of those turned a typo into a silent, different run. A flag's text must be the whole
// number in decimal, within the type's range and the flag's bounds, and a real must be finite.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tally::cli {

// Why `text` is not a whole number in [least, most], or nullopt. Decimal digits with an optional
// leading '-' only.
std::optional<std::string> whole_number_error(std::string_view text, std::int64_t least,
                                              std::int64_t most);
// Why `text` is not a seed: decimal digits only, at most 2^64-1.
std::optional<std::string> seed_error(std::string_view text);
// Why `text` is not a finite real in [least, most], or nullopt: [-]digits[.digits][e[+-]digits].
std::optional<std::string> real_number_error(std::string_view text, double least, double most);

// A duration: "90", "90s", "10m", "1h", "1h30m", "0.5m": decimal amounts, each with a unit
// (s, m, h; a lone last amount is seconds), more than 0 and at most kMostDurationSeconds.
inline constexpr double kMostDurationSeconds = 1e9;  // about 31 years: chrono never overflows
std::optional<double> duration_seconds(std::string_view text);
std::optional<std::string> duration_error(std::string_view text);

// The same rules as CLI11 validators, for add_option(...)->check(...).
CLI::Validator whole_number(std::int64_t least, std::int64_t most);
CLI::Validator seed_number();
CLI::Validator real_number(double least, double most);
CLI::Validator duration();

// A whole number with no upper bound of its own beyond its type.
inline constexpr std::int64_t kNoUpperBound = INT64_MAX;
inline constexpr std::int64_t kIntMax = INT32_MAX;

// Any int or any finite real: for flags whose bounds the domain's own checks state (check_config,
// check_model, check_case), so a user sees one message for one rule.
inline CLI::Validator any_int() { return whole_number(INT32_MIN, INT32_MAX).description(""); }
inline CLI::Validator any_real() {
  return real_number(-1.7976931348623157e308, 1.7976931348623157e308).description("");
}

}  // namespace tally::cli
