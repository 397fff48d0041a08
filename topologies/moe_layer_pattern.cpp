#include "topologies/moe_layer_pattern.h"

#include <cstdint>
#include <stdexcept>

namespace tally::topologies {

namespace {

// A recursive-descent reader of the expression subset Megatron-LM's users write:
//   sum := product ('+' product)* ; product := factor ('*' factor)* ; factor := list | int | '(' sum ')'
// A product multiplies one list by integers, in either order.
class PatternReader {
 public:
  explicit PatternReader(std::string_view text) : text_(text) {}

  std::vector<bool> read() {
    Value v = sum();
    skip_spaces();
    if (at_ < text_.size()) fail("unexpected '" + std::string(1, text_[at_]) + "'");
    if (!v.is_list) fail("the expression is a number, not a list of layers");
    if (v.layers.empty()) fail("the pattern has no layers");
    return v.layers;
  }

 private:
  struct Value {
    bool is_list = false;
    std::vector<bool> layers;
    std::int64_t number = 0;
  };

  [[noreturn]] void fail(const std::string& rule) const {
    throw std::invalid_argument("moe_layer_freq '" + std::string(text_) + "' at position " + std::to_string(at_) +
                                ": " + rule + " (Megatron-LM's syntax: an integer, or a list of 0 and 1 per layer "
                                "such as \"([0]*1+[1]*3)\")");
  }

  void skip_spaces() {
    while (at_ < text_.size() && text_[at_] == ' ') ++at_;
  }

  bool take(char ch) {
    skip_spaces();
    if (at_ < text_.size() && text_[at_] == ch) {
      ++at_;
      return true;
    }
    return false;
  }

  std::int64_t integer() {
    skip_spaces();
    const std::size_t start = at_;
    std::int64_t n = 0;
    while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') {
      n = n * 10 + (text_[at_++] - '0');
      if (n > kMaxPatternLayers) fail("a number larger than " + std::to_string(kMaxPatternLayers));
    }
    if (at_ == start) fail("expected a number, a list or '('");
    return n;
  }

  Value list() {
    Value v{.is_list = true, .layers = {}, .number = 0};
    if (take(']')) return v;
    do {
      const std::int64_t n = integer();
      if (n != 0 && n != 1) fail("a layer is 0 (dense) or 1 (MoE), not " + std::to_string(n));
      v.layers.push_back(n == 1);
    } while (take(','));
    if (!take(']')) fail("expected ',' or ']'");
    return v;
  }

  Value factor() {
    if (take('[')) return list();
    if (take('(')) {
      Value v = sum();
      if (!take(')')) fail("expected ')'");
      return v;
    }
    return Value{.is_list = false, .layers = {}, .number = integer()};
  }

  Value product() {
    Value v = factor();
    while (take('*')) {
      Value w = factor();
      if (v.is_list == w.is_list) fail(v.is_list ? "a list times a list" : "a number times a number");
      if (w.is_list) std::swap(v, w);
      if (static_cast<std::int64_t>(v.layers.size()) * w.number > kMaxPatternLayers)
        fail("more than " + std::to_string(kMaxPatternLayers) + " layers");
      std::vector<bool> repeated;
      for (std::int64_t i = 0; i < w.number; ++i) repeated.insert(repeated.end(), v.layers.begin(), v.layers.end());
      v.layers = std::move(repeated);
    }
    return v;
  }

  Value sum() {
    Value v = product();
    while (take('+')) {
      Value w = product();
      if (!v.is_list || !w.is_list) fail("'+' joins lists");
      if (v.layers.size() + w.layers.size() > static_cast<std::size_t>(kMaxPatternLayers))
        fail("more than " + std::to_string(kMaxPatternLayers) + " layers");
      v.layers.insert(v.layers.end(), w.layers.begin(), w.layers.end());
    }
    return v;
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

}  // namespace

std::vector<bool> parse_moe_layer_pattern(std::string_view text) { return PatternReader(text).read(); }

std::string moe_layer_pattern_text(const std::vector<bool>& pattern) {
  std::string out = "(";
  for (std::size_t i = 0; i < pattern.size();) {
    std::size_t run = i;
    while (run < pattern.size() && pattern[run] == pattern[i]) ++run;
    if (i > 0) out += "+";
    out += pattern[i] ? "[1]*" : "[0]*";
    out += std::to_string(run - i);
    i = run;
  }
  return out + ")";
}

}  // namespace tally::topologies
