#include "run/megatron_core/rules.h"

#include <algorithm>
#include <charconv>

#include "vocab/faults.h"
#include "run/target.h"
#include "topologies/logical_model.h"
#include "topologies/parallel_config.h"

namespace tally::run {

bool megatron_core_older_than(std::string_view version, int major, int minor) {
  int got_major = 0, got_minor = 0;
  const char* end = version.data() + version.size();
  auto [after_major, e1] = std::from_chars(version.data(), end, got_major);
  if (e1 != std::errc{} || after_major == end || *after_major != '.') return false;
  auto [after_minor, e2] = std::from_chars(after_major + 1, end, got_minor);
  if (e2 != std::errc{}) return false;
  return got_major < major || (got_major == major && got_minor < minor);
}

namespace {

// megatron-core before 0.19: get_megatron_muon_optimizer without LayerWise removes the expert
// param groups with list.remove, which compares the groups' tensors and raises.
bool muon_refuses_experts(std::string_view version) { return megatron_core_older_than(version, 0, 19); }

// Both uneven stages set, no middle stage, several chunks per stage: Megatron computes the
// layers of a middle-stage chunk as 0 and divides by them.
bool uneven_without_middle_chunks(const casefile::Case& c) {
  return c.model.first_stage_layers && c.model.last_stage_layers && c.topology.pp == 2 && c.topology.vpp > 1;
}

}  // namespace

std::optional<std::string> megatron_core_unsupported(const casefile::Case& c, std::string_view version,
                                                     const FaultPlants& plants) {
  const topologies::ModelSpec& m = c.model;
  const vocab::PathOptions& o = c.path;
  const std::string release = "megatron-core " + std::string(version);
  if (m.kind != topologies::ModelKind::gpt)
    return "model.kind custom: the megatron-core worker builds Megatron's GPTModel; a custom layout has "
           "no Megatron module";
  if (auto why = other_frameworks_section(c, "megatron-core")) return why;
  if (m.mtp_num_layers > 0)
    return "model.mtp_num_layers " + std::to_string(m.mtp_num_layers) +
           ": the worker's local layer spec builds no multi-token-prediction block";
  if (m.softmax_type != topologies::SoftmaxType::vanilla)
    return "model.softmax_type learnable: attention sinks need Transformer Engine's attention, which "
           "the worker does not use";
  if (topologies::uses_gtp(c.topology))
    return "topology.gtp/egtp: generalized TP needs Transformer Engine >= 2.19, which the worker does not use";
  if (!o.p_values.empty())
    return "statistics.p_norms: Megatron reports the L2 norm and the zero count only";
  if (std::string why = unplantable(o.faults, plants); !why.empty())
    return "faults: the worker plants no counterpart of " + why;
  if (c.topology.dist_opt_instances > 1 && o.optimizer != vocab::OptimizerModel::distributed)
    return "topology.dist_opt_instances " + std::to_string(c.topology.dist_opt_instances) +
           ": several instances belong to the distributed optimizer (optimizer.model distributed)";
  if (uneven_without_middle_chunks(c))
    return "model.decoder_first_pipeline_num_layers and decoder_last_pipeline_num_layers with pp 2 and vpp " +
           std::to_string(c.topology.vpp) +
           ": megatron-core's get_transformer_layer_offset divides by the layers of the middle stages' "
           "chunks, which are none (ZeroDivisionError)";
  if (o.optimizer == vocab::OptimizerModel::muon && m.num_experts > 0 && muon_refuses_experts(version))
    return "optimizer.model muon with experts: " + release +
           "'s Muon without LayerWise fails on expert params (get_megatron_muon_optimizer's "
           "list.remove compares param groups that hold tensors); 0.19 builds it";
  return std::nullopt;
}

casefile::Case within_megatron_core(casefile::Case c, std::string_view version, const FaultPlants& plants) {
  topologies::ModelSpec& m = c.model;
  vocab::PathOptions& o = c.path;
  if (m.kind != topologies::ModelKind::gpt) return c;
  c.deepspeed.reset();
  c.torchtitan.reset();
  m.mtp_num_layers = 0;
  m.mtp_detach_heads = false;
  m.softmax_type = topologies::SoftmaxType::vanilla;
  c.topology.gtp = 1;
  c.topology.egtp = 1;
  o.p_values.clear();
  if (!unplantable(o.faults, plants).empty()) o.faults = {};
  if (o.optimizer != vocab::OptimizerModel::distributed) c.topology.dist_opt_instances = 1;
  if (uneven_without_middle_chunks(c)) {
    // The last stage keeps its layers, now as "the rest" (a multiple of vpp, as it was).
    m.last_stage_layers.reset();
  }
  if (o.optimizer == vocab::OptimizerModel::muon && m.num_experts > 0 && muon_refuses_experts(version))
    o.optimizer = vocab::OptimizerModel::layerwise;
  casefile::drop_stated_gradients_without_a_param(c, c.topology);
  return c;
}

}  // namespace tally::run
