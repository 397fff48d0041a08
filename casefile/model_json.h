// JSON form of a ModelSpec, the `model` object of a case file and of `tally layout --model`.
// Keys are Megatron-LM's argument names. Reading is strict: an unknown key, a wrong type, a
// negative or oversized number is an error naming the field path and the rule, never a silent
// default. (The semantic rules, e.g. divisibility, are topologies::check_model's.)
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "topologies/model_spec.h"

namespace tally::casefile {

// One line: "model.num_layers: expected a positive integer, got -3".
class ModelJsonError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Every GPT field (optional ones only when set), or kind, num_experts and params for a
// custom layout. model_spec_from_json(model_spec_to_json(s)) == s.
nlohmann::ordered_json model_spec_to_json(const topologies::ModelSpec& spec);

// A stated gradient (topologies::StatedGradient): a number (a constant for every element),
// {"scale": x} (the generated values times x), or an array of one number per element. Throws the
// reader's error naming `path`; the rules that need the model are vocab::check_stated's.
topologies::StatedGradient stated_gradient_from_json(const nlohmann::json& json, const std::string& path);
nlohmann::ordered_json stated_gradient_to_json(const topologies::StatedGradient& gradient);

// Throws ModelJsonError; `path` prefixes every message ("model", "case.model", ...).
topologies::ModelSpec model_spec_from_json(const nlohmann::json& json,
                                           std::string_view path = "model");

// Parses `text` as JSON, rejecting duplicate keys, then reads the spec. `source` names the
// input in messages ("FILE.json: invalid JSON: ...").
topologies::ModelSpec model_spec_from_text(std::string_view text, std::string_view source);

// Reads a JSON file holding one model object. Throws ModelJsonError naming the file when it
// cannot be read or parsed.
topologies::ModelSpec load_model_spec(const std::string& file);

}  // namespace tally::casefile
