// How tally writes values and rank lists in every message and report (verdicts, diagnoses,
// manifest errors), so two values a message calls different print differently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tally::record {

// Every digit of a double: "%.17g".
std::string all_digits(double value);
// "[0,1,2]"; past the first `shown` of `ranks`, ",... N more" counts the rest of `total`.
std::string rank_list_text(const std::vector<int>& ranks, std::int64_t total, std::size_t shown = 16);

}  // namespace tally::record
