#include "record/text.h"

#include <algorithm>
#include <cstdio>

namespace tally::record {

std::string all_digits(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string rank_list_text(const std::vector<int>& ranks, std::int64_t total, std::size_t shown) {
  std::string out = "[";
  const std::size_t listed = std::min(ranks.size(), shown);
  for (std::size_t i = 0; i < listed; ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  if (total > static_cast<std::int64_t>(listed))
    out += ",... " + std::to_string(total - static_cast<std::int64_t>(listed)) + " more";
  return out + "]";
}

}  // namespace tally::record
