#include "casefile/case.h"

#include <algorithm>
#include <cmath>

#include "vocab/gradients.h"
#include "topologies/logical_model.h"

namespace tally::casefile {

std::string_view outcome_name(Expectation::Outcome outcome) {
  switch (outcome) {
    case Expectation::Outcome::pass: return "pass";
    case Expectation::Outcome::fail: return "fail";
    case Expectation::Outcome::infra_error: return "infra-error";
  }
  return "?";
}

const nlohmann::ordered_json* section_settings(const Case& c, std::string_view key) {
  const auto it = c.sections.find(key);
  return it == c.sections.end() ? nullptr : &it->second.settings;
}

void keep_only_section(Case& c, std::string_view key) {
  std::erase_if(c.sections, [&](const auto& entry) { return entry.first != key; });
}

std::optional<std::string> check_case(const Case& c) {
  if (std::optional<std::string> error = topologies::check_config(c.topology)) return error;
  if (std::optional<std::string> error = topologies::check_model(c.model, c.topology)) return error;
  const bool megatron_models =
      std::none_of(c.sections.begin(), c.sections.end(), [](const auto& entry) { return entry.second.own_models; });
  if (megatron_models)
    if (std::optional<std::string> error = topologies::check_megatron_expert_bias(c.model, c.topology)) return error;
  const vocab::PathOptions& o = c.path;
  for (double p : o.p_values)
    if (!std::isfinite(p) || p <= 0.0)
      return "p-norm p " + std::to_string(p) + " must be finite and > 0";
  if (o.p_values.size() > 8) return "at most 8 p-norms (got " + std::to_string(o.p_values.size()) + ")";
  if (!std::isfinite(o.max_norm) || o.max_norm < 0.0)
    return "max_norm must be finite and >= 0 (0: no clipping)";
  if (o.bucket_elements < 0) return "bucket_elements must be >= 0 (0: one bucket per buffer)";
  if (o.layer_wise_param_layout && o.optimizer != vocab::OptimizerModel::layerwise)
    return "optimizer.layer_wise_param_layout belongs to optimizer.model layerwise (the layer-wise optimizer's "
           "parameter layout), not " + std::string(vocab::optimizer_model_name(o.optimizer));
  if (vocab::states_gradients(o.gradients, c.model)) return vocab::check_stated(o.gradients, topologies::LogicalModel(c.model, c.topology));
  return std::nullopt;
}

void drop_stated_gradients_without_a_param(Case& c, const topologies::ParallelConfig& naming) {
  const topologies::LogicalModel model(c.model, naming);
  std::erase_if(c.path.gradients.stated, [&](const vocab::StatedFor& s) {
    return std::none_of(model.params().begin(), model.params().end(), [&](const topologies::LogicalParam& p) {
      return s.param.empty() ? p.param_class == s.param_class : p.name == s.param;
    });
  });
}

}  // namespace tally::casefile
