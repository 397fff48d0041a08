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

std::string_view dtensor_clip_name(DTensorClip clip) {
  return clip == DTensorClip::torch ? "torch" : "torchtitan";
}

void drop_other_frameworks_sections(Case& c, std::string_view framework) {
  if (framework != "deepspeed") c.deepspeed.reset();
  if (framework != "torchtitan") c.torchtitan.reset();
  if (framework != "automodel") c.automodel.reset();
  if (framework != "megatron-core") c.megatron_fsdp.reset();
}

std::string_view spmd_backend_name(SpmdBackend backend) {
  return backend == SpmdBackend::partial_dtensor ? "partial_dtensor" : "full_dtensor";
}

std::string_view fsdp_sharding_name(FsdpSharding sharding) {
  switch (sharding) {
    case FsdpSharding::no_shard: return "no_shard";
    case FsdpSharding::optim: return "optim";
    case FsdpSharding::optim_grads: return "optim_grads";
    case FsdpSharding::optim_grads_params: return "optim_grads_params";
  }
  return "?";
}

std::string_view fsdp_outer_sharding_name(FsdpOuterSharding sharding) {
  return sharding == FsdpOuterSharding::optim ? "optim" : "no_shard";
}

std::optional<std::string> check_case(const Case& c) {
  if (std::optional<std::string> error = topologies::check_config(c.topology)) return error;
  if (std::optional<std::string> error = topologies::check_model(c.model, c.topology)) return error;
  if (!c.deepspeed)
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
