// The optimizer models a case may ask for, by name: which child optimizers and ownership each
// means is gradnorm/optimizer_model.h's (docs/megatron-reference.md §5).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tally::vocab {

enum class OptimizerModel : std::uint8_t { plain, distributed, layerwise, muon };
inline constexpr int kOptimizerModelCount = 4;

struct OptimizerModelInfo {
  OptimizerModel model;
  std::string_view name;
  std::string_view description;
};
const std::array<OptimizerModelInfo, kOptimizerModelCount>& optimizer_models();
std::string_view optimizer_model_name(OptimizerModel model);
std::optional<OptimizerModel> optimizer_model_from_name(std::string_view name);

}  // namespace tally::vocab
