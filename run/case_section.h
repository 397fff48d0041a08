// A framework's case section as its own typed configuration (run/<framework>/section.h): the case
// holds it as canonical JSON (casefile::FrameworkSection), and only the framework's code reads it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "casefile/case.h"

namespace tally::run {

// `c`'s section `key` read by `read` (the framework's strict reader); nullopt when `c` holds none.
template <typename Config>
std::optional<Config> read_case_section(const casefile::Case& c, std::string_view key,
                                        Config (*read)(const nlohmann::json& value, const std::string& path)) {
  const nlohmann::ordered_json* settings = casefile::section_settings(c, key);
  if (!settings) return std::nullopt;
  return read(nlohmann::json(*settings), std::string(key));
}

}  // namespace tally::run
