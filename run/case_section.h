// A framework's case section as its own typed configuration (run/<framework>/section.h): the case
// holds it as canonical JSON (casefile::FrameworkSection), and only the framework's code reads it,
// through its CaseSection: its key, its strict reader and canonical writer.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "casefile/case.h"

namespace tally::run {

template <typename Config>
struct CaseSection {
  std::string_view key;
  // Strict: an unknown key, a wrong type or a value out of range throws io::JsonReadError naming the field.
  Config (*read)(const nlohmann::json& value, const std::string& path);
  nlohmann::ordered_json (*write)(const Config& config);  // the canonical JSON
  bool own_models = false;  // casefile::FrameworkSection::own_models

  // Whether `c` holds this section.
  bool held_by(const casefile::Case& c) const { return casefile::section_settings(c, key) != nullptr; }
  // `c`'s configuration; nullopt when it holds none.
  std::optional<Config> of(const casefile::Case& c) const {
    const nlohmann::ordered_json* settings = casefile::section_settings(c, key);
    if (!settings) return std::nullopt;
    return read(nlohmann::json(*settings), std::string(key));
  }
  void set(casefile::Case& c, const Config& config) const {
    c.sections[std::string(key)] = casefile::FrameworkSection{write(config), own_models};
  }
  // `c`'s configuration changed by `change` (a case holding none starts from the defaults).
  void change(casefile::Case& c, const std::function<void(Config&)>& change) const {
    Config config = of(c).value_or(Config{});
    change(config);
    set(c, config);
  }
};

// The row's reader of `section` (FrameworkTarget::read_section): read strictly, written canonically.
template <const auto& section>
nlohmann::ordered_json canonical_section(const nlohmann::json& value, const std::string& path) {
  return section.write(section.read(value, path));
}

}  // namespace tally::run
