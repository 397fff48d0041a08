// Optimizer models: which child optimizers a model's parameters go to, which data-parallel
// ranks own which gradient elements, and over which group each child reduces its statistics
// (docs/megatron-reference.md §5).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vocab/faults.h"
#include "vocab/optimizer_models.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::gradnorm {

// A child optimizer of the chain.
enum class ChildRole : std::uint8_t {
  dense,        // dense params (plain, distributed), or the dense non-linear params (muon)
  expert,       // expert-topology params, or the expert non-linear params (muon)
  dense_muon,   // muon: dense linear weights
  expert_muon,  // muon: expert linear weights
  layer_wise,   // layerwise: every param, one reduction over the world
};
std::string_view child_role_name(ChildRole role);

struct Child {
  ChildRole role = ChildRole::dense;
  bool expert = false;  // holds expert-topology params (dropped by expert-norm-dropped)
  topologies::Family stats_family = topologies::Family::tp_pp;
  // The group of the norm its gradients are clipped with: the stats group, except under
  // clip-per-stage-norm (its stage only) and clip-per-ep-group-norm (without the EP axis).
  topologies::Family clip_family = topologies::Family::tp_pp;
};

// Everything about a case's optimizer that depends on the model and not on the rank:
// computed once per case, shared by every rank.
struct OptimizerPlan {
  vocab::OptimizerModel model = vocab::OptimizerModel::plain;
  std::vector<Child> children;
  // Children reduce together (one reduction) when they all share one stats group object.
  bool shared_stats = false;
  std::vector<int> child_of_param;     // by logical param id
  bool has_mtp = false;
  // Whether each logical param is labelled expert-topology (Megatron-LM's allreduce = false on
  // the model param, which decides the child and the data-parallel domain).
  std::vector<bool> expert_label;
};

// "plain.chained_optimizers[0] (dense)": how a run names child `c` of `plan`.
std::string child_name(const OptimizerPlan& plan, int c);

OptimizerPlan plan_optimizer(vocab::OptimizerModel model, const topologies::LogicalModel& logical,
                             const vocab::FaultSet& faults);

}  // namespace tally::gradnorm
