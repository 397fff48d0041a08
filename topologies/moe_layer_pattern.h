// Which decoder layers are MoE, in Megatron-LM's own words: `--moe-layer-freq` takes an integer N
// (layers 0, N, 2N, ... are MoE) or a Python list expression of 0 (dense) and 1 (MoE) per layer,
// such as "([0]*3+[1]*58)" for DeepSeek-V3's first three dense layers
// (megatron/training/arguments.py, moe_freq_type; gpt_layer_specs.py builds the layers from it).
#pragma once

#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tally::topologies {

// Longest pattern tally reads: the expression is expanded, so "[1]*1000000000" must not be.
inline constexpr int kMaxPatternLayers = 1 << 16;

// The layers of a pattern expression: lists of 0 and 1 ("[0,1,1]"), repeated ("[1]*3" or
// "3*[1]"), joined ("+") and grouped ("(...)"), spaces anywhere. Throws std::invalid_argument
// naming the text, the position and the rule it broke.
std::vector<bool> parse_moe_layer_pattern(std::string_view text);

// The shortest run-length form Megatron-LM reads back: "([0]*3+[1]*58)", "([1]*4)".
std::string moe_layer_pattern_text(const std::vector<bool>& pattern);

}  // namespace tally::topologies
