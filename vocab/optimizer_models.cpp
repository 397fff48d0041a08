#include "vocab/optimizer_models.h"

namespace tally::vocab {

namespace {

constexpr std::array<OptimizerModelInfo, kOptimizerModelCount> kModels = {{
    {OptimizerModel::plain, "plain",
     "non-distributed chained optimizer: dense child over tp-pp, expert child over "
     "expt-tp-ep-pp (tp-ep-gtp-pp with expert GTP); one reduction when they share a group, else "
     "sqrt of summed squares"},
    {OptimizerModel::distributed, "distributed",
     "distributed optimizer (ZeRO-1): bucketed flat buffers split in equal contiguous ranges over "
     "dp-cp (dense) and expt-dp (expert), with padding; stats over the instance (the world with "
     "GTP)"},
    {OptimizerModel::layerwise, "layerwise",
     "layer-wise distributed optimizer (Muon): whole params owned by one DP (EDP) rank; stats "
     "over the world; children receive both TP groups"},
    {OptimizerModel::muon, "muon",
     "non-layer-wise Muon: linear weights in Muon children, the rest in Adam children; expert "
     "children over expt-tp-ep-pp, dense over tp-pp"},
}};

}  // namespace

const std::array<OptimizerModelInfo, kOptimizerModelCount>& optimizer_models() { return kModels; }

std::string_view optimizer_model_name(OptimizerModel model) {
  return kModels[static_cast<std::size_t>(model)].name;
}

std::optional<OptimizerModel> optimizer_model_from_name(std::string_view name) {
  for (const OptimizerModelInfo& info : kModels)
    if (info.name == name) return info.model;
  return std::nullopt;
}

}  // namespace tally::vocab
