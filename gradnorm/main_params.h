// The optimizer's main copies of a rank's parameters and the duplicate filter that decides
// which of them enter the norm (docs/megatron-reference.md §1 and §2).
#pragma once

#include <string_view>
#include <vector>

#include "vocab/faults.h"
#include "gradnorm/optimizer_model.h"
#include "topologies/sharding.h"

namespace tally::gradnorm {

// A main copy: the model param's attributes as the optimizer sees them (faults that lose or
// mislabel attributes act here), and the child optimizer that holds it.
struct MainParam {
  topologies::LocalParam attrs;
  int child = 0;
  // The model param's label (allreduce = false): it decides the buffer and data-parallel domain
  // even when the main copy lost the attribute.
  bool expert_label = false;
  // The filter has no expert TP group for this param and falls back to the dense TP group.
  bool dedup_on_dense_tp = false;
};

// Whether the duplicate filter has no expert TP group for a param of class `c` and falls back
// to the dense TP group: every param under expert-dedup-on-dense-tp (#6099: the children never
// received the groups), the TE expert layers' weights and column biases under
// expert-weights-not-tp-marked. Decides MainParam::dedup_on_dense_tp.
bool filter_lacks_expert_tp_group(topologies::ParamClass c, const vocab::FaultSet& faults);

// Whether the children's duplicate filters receive an expert TP group at all: not under
// expert-dedup-on-dense-tp (#6099: the layer-wise optimizer's children got no groups). Under
// expert-weights-not-tp-marked they have one, and only the TE expert weights ignore it.
bool children_receive_expert_tp_group(const vocab::FaultSet& faults);

// The rank's main copies in local order. Faults that change attributes: tied-copy-not-shared,
// tp-sharded-param-unmarked, replicated-marked-tp, expert-weights-not-tp-marked,
// allreduce-flag-lost-on-main-params, expert-label-from-ep-only, expert-dedup-on-dense-tp.
void make_main_params(const std::vector<topologies::LocalParam>& local, const OptimizerPlan& plan,
                      const vocab::FaultSet& faults, std::vector<MainParam>& out);

// Why the filter kept or dropped a param on a rank.
enum class Rule : std::uint8_t {
  kept_tensor_parallel,      // a distinct shard: tensor_model_parallel
  kept_first_of_tp,          // replicated, rank 0 of its dense TP group
  kept_first_of_etp,         // replicated within ETP, rank 0 of its expert TP group
  kept_without_filter,       // no-dedup-filter
  dropped_shared,            // a `shared` duplicate copy
  dropped_not_first_of_tp,   // replicated, not rank 0 of its dense TP group
  dropped_not_first_of_etp,  // replicated within ETP, not rank 0 of its expert TP group
};
inline bool rule_keeps(Rule rule) { return rule <= Rule::kept_without_filter; }

// Megatron-LM's keep test for the main copy on `rank`: not shared, and tensor_model_parallel or
// rank 0 of its replication group (ETP for expert-topology params when the expert TP group is
// known, dense TP otherwise). The groups come from `layout`; there is no default.
Rule filter_rule(const MainParam& param, const topologies::RankLayout& layout, int rank,
                 const vocab::FaultSet& faults);

}  // namespace tally::gradnorm
