#include "gradnorm/main_params.h"

namespace tally::gradnorm {

using topologies::Family;
using topologies::ParamClass;

void make_main_params(const std::vector<topologies::LocalParam>& local, const OptimizerPlan& plan,
                      const vocab::FaultSet& faults, std::vector<MainParam>& out) {
  out.clear();
  out.reserve(local.size());
  for (const topologies::LocalParam& param : local) {
    MainParam main{param, plan.child_of_param[param.logical_id],
                   plan.expert_label[param.logical_id], false};
    topologies::LocalParam& a = main.attrs;
    const ParamClass c = a.param_class;
    const bool expert_class = topologies::is_expert_class(c);
    // The model's label decides the child, the stats group and the data-parallel domain.
    a.allreduce = !plan.expert_label[param.logical_id];
    if (faults.has(vocab::Fault::tied_copy_not_shared) && a.copy != topologies::SharedCopy::none)
      a.shared = false;
    if (faults.has(vocab::Fault::tp_sharded_param_unmarked) && c == ParamClass::head_sharded)
      a.tensor_model_parallel = false;
    if (faults.has(vocab::Fault::replicated_marked_tp) && c == ParamClass::replicated)
      a.tensor_model_parallel = true;
    if (faults.has(vocab::Fault::expert_weights_not_tp_marked) && expert_class &&
        c != ParamClass::expert_row_bias) {
      // Pre-#5916 TE expert layers: no TP marking, and a filter with no expert TP group.
      a.tensor_model_parallel = false;
    }
    if (faults.has(vocab::Fault::allreduce_flag_lost_on_main_params)) a.allreduce = true;
    main.dedup_on_dense_tp = filter_lacks_expert_tp_group(c, faults);
    out.push_back(main);
  }
}

bool filter_lacks_expert_tp_group(ParamClass c, const vocab::FaultSet& faults) {
  if (faults.has(vocab::Fault::expert_dedup_on_dense_tp)) return true;
  return faults.has(vocab::Fault::expert_weights_not_tp_marked) && topologies::is_expert_class(c) &&
         c != ParamClass::expert_row_bias;
}

bool children_receive_expert_tp_group(const vocab::FaultSet& faults) {
  return !faults.has(vocab::Fault::expert_dedup_on_dense_tp);
}

Rule filter_rule(const MainParam& param, const topologies::RankLayout& layout, int rank,
                 const vocab::FaultSet& faults) {
  const topologies::LocalParam& a = param.attrs;
  if (a.shared) return Rule::dropped_shared;
  if (faults.has(vocab::Fault::no_dedup_filter)) return Rule::kept_without_filter;
  if (a.tensor_model_parallel && !faults.has(vocab::Fault::tp_marking_unseen_by_filter)) return Rule::kept_tensor_parallel;
  const bool expert_group = !a.allreduce && !param.dedup_on_dense_tp;
  const int index = layout.index_in(expert_group ? Family::expt_tp : Family::tp, rank);
  if (expert_group) return index == 0 ? Rule::kept_first_of_etp : Rule::dropped_not_first_of_etp;
  return index == 0 ? Rule::kept_first_of_tp : Rule::dropped_not_first_of_tp;
}

}  // namespace tally::gradnorm
