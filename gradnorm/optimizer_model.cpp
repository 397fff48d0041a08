#include "gradnorm/optimizer_model.h"

#include "topologies/sharding.h"

namespace tally::gradnorm {

namespace {

using topologies::Family;
using topologies::ParamClass;

bool is_linear_weight(ParamClass c) { return c == ParamClass::column || c == ParamClass::row; }
bool is_expert_linear_weight(ParamClass c) {
  return c == ParamClass::expert_column || c == ParamClass::expert_row;
}

}  // namespace

std::string_view child_role_name(ChildRole role) {
  switch (role) {
    case ChildRole::dense: return "dense";
    case ChildRole::expert: return "expert";
    case ChildRole::dense_muon: return "dense-muon";
    case ChildRole::expert_muon: return "expert-muon";
    case ChildRole::layer_wise: return "layer-wise";
  }
  return "?";
}

std::string child_name(const OptimizerPlan& plan, int c) {
  return std::string(vocab::optimizer_model_name(plan.model)) + ".chained_optimizers[" +
         std::to_string(c) + "] (" + std::string(child_role_name(plan.children[c].role)) + ")";
}

namespace {

// The part of `stats` on one pipeline stage (with several distributed-optimizer instances, the
// instance's part of it, which no Megatron-LM group is).
Family within_stage(Family stats, bool gtp, bool egtp) {
  switch (stats) {
    case Family::tp_pp: return gtp ? Family::tp_gtp : Family::tp;
    case Family::expt_tp_ep_pp: return Family::expt_tp_ep;
    case Family::expt_tp_ep_gtp_pp: return Family::expt_tp_ep_gtp;
    case Family::expt_tp_pp: return Family::expt_tp;
    case Family::expt_tp_gtp_pp: return egtp ? Family::expt_tp_gtp : Family::expt_tp;
    case Family::world: return Family::tp_dp_cp;
    case Family::dist_opt: return Family::dist_opt_stage;  // tp-dp-cp's ranks when k = 1
    case Family::expt_tp_dp_pp: return Family::expt_tp_dp;
    default: return stats;  // already within a stage
  }
}

// `stats` without its EP axis (the dense groups have none).
Family without_ep(Family stats) {
  switch (stats) {
    case Family::expt_tp_ep_pp: return Family::expt_tp_pp;
    case Family::expt_tp_ep_gtp_pp: return Family::expt_tp_gtp_pp;
    case Family::expt_tp_ep: return Family::expt_tp;
    case Family::expt_tp_ep_gtp: return Family::expt_tp_gtp;
    case Family::world: return Family::expt_tp_dp_pp;
    case Family::dist_opt: return Family::dist_opt_without_ep;  // expt-tp-dp-pp's when k = 1
    case Family::dist_opt_stage: return Family::dist_opt_stage_without_ep;  // expt-tp-dp's when k = 1
    case Family::tp_dp_cp: return Family::expt_tp_dp;
    default: return stats;
  }
}

Family clip_family(Family stats, const topologies::ModelPlacement& m, const vocab::FaultSet& faults) {
  Family family = stats;
  if (faults.has(vocab::Fault::clip_per_stage_norm)) family = within_stage(family, m.gtp > 1, m.egtp > 1);
  if (faults.has(vocab::Fault::clip_per_ep_group_norm)) family = without_ep(family);
  return family;
}

}  // namespace

OptimizerPlan plan_optimizer(vocab::OptimizerModel model, const topologies::LogicalModel& logical,
                             const vocab::FaultSet& faults) {
  OptimizerPlan plan;
  plan.model = model;
  const topologies::ModelPlacement& m = logical.placement();
  // Megatron-LM's use_expert_pgs; #5916's uncommon case derived it from EP alone, and
  // megatron-core 0.19.2 has no GTP term (#6080).
  const bool expert_pgs = faults.has(vocab::Fault::expert_label_from_ep_only) ? m.ep > 1
                          : faults.has(vocab::Fault::expert_label_ignores_gtp)
                              ? m.ep > 1 || m.etp != m.tp
                              : topologies::expert_topology(m);

  const int count = logical.size();
  plan.expert_label.resize(count);
  plan.child_of_param.resize(count);

  // Which role each param goes to; children are created in a fixed role order for the roles
  // that have params anywhere in the model (every rank builds the same chain).
  std::vector<ChildRole> role_of(count);
  for (const topologies::LogicalParam& p : logical.params()) {
    const bool expert = topologies::is_expert_class(p.param_class) && expert_pgs;
    plan.expert_label[p.id] = expert;
    plan.has_mtp = plan.has_mtp || p.grad_norm_group == topologies::GradNormGroup::mtp;
    switch (model) {
      case vocab::OptimizerModel::plain:
      case vocab::OptimizerModel::distributed:
        role_of[p.id] = expert ? ChildRole::expert : ChildRole::dense;
        break;
      case vocab::OptimizerModel::layerwise:
        role_of[p.id] = ChildRole::layer_wise;
        break;
      case vocab::OptimizerModel::muon:
        if (expert && is_expert_linear_weight(p.param_class))
          // #3024: expert weights went to the dense Muon optimizer.
          role_of[p.id] = faults.has(vocab::Fault::expert_stats_over_dense_mp) ? ChildRole::dense_muon
                                                                        : ChildRole::expert_muon;
        else if (!expert && (is_linear_weight(p.param_class) ||
                             is_expert_linear_weight(p.param_class)))
          role_of[p.id] = ChildRole::dense_muon;
        else
          role_of[p.id] = expert ? ChildRole::expert : ChildRole::dense;
        break;
    }
  }

  const bool replicas = faults.has(vocab::Fault::stats_over_replicas);
  const bool no_pp = faults.has(vocab::Fault::missing_pp_reduction);
  const bool no_ep = faults.has(vocab::Fault::missing_ep_reduction);
  // With GTP the model-parallel groups span it: tp-gtp_remat-pp (MP, the tp_pp family) and
  // the expert tp-ep-gtp_remat-pp; without it these are 0.16.1's tp-pp and tp-ep-pp.
  const Family dense_stage = m.gtp > 1 ? Family::tp_gtp : Family::tp;
  const bool egtp = m.egtp > 1;
  auto stats_family = [&](ChildRole role) -> Family {
    const bool expert = role == ChildRole::expert || role == ChildRole::expert_muon;
    switch (model) {
      case vocab::OptimizerModel::plain:
      case vocab::OptimizerModel::muon:
        if (replicas) return no_pp ? Family::tp_dp_cp : Family::world;
        if (!expert) return no_pp ? dense_stage : Family::tp_pp;
        // #785: the expert child's model-parallel group was TP x PP.
        if (faults.has(vocab::Fault::clip_per_child_norm)) return no_pp ? dense_stage : Family::tp_pp;
        if (no_ep)
          return no_pp ? (egtp ? Family::expt_tp_gtp : Family::expt_tp)
                       : (egtp ? Family::expt_tp_gtp_pp : Family::expt_tp_pp);
        // 0.19.2's emerging-optimizer path gives expert children tp_ep_pp, which misses EGTP.
        if (egtp && !(model == vocab::OptimizerModel::muon &&
                      faults.has(vocab::Fault::muon_expert_stats_without_egtp)))
          return no_pp ? Family::expt_tp_ep_gtp : Family::expt_tp_ep_gtp_pp;
        return no_pp ? Family::expt_tp_ep : Family::expt_tp_ep_pp;
      case vocab::OptimizerModel::distributed:
        if (expert && no_ep) return Family::expt_tp_dp_pp;
        return no_pp ? Family::tp_dp_cp : Family::dist_opt;
      case vocab::OptimizerModel::layerwise:
        return no_pp ? Family::tp_dp_cp : Family::world;
    }
    return Family::world;
  };

  constexpr std::array<ChildRole, 5> kRoleOrder = {ChildRole::dense, ChildRole::dense_muon,
                                                   ChildRole::expert, ChildRole::expert_muon,
                                                   ChildRole::layer_wise};
  std::array<int, 5> child_index{};
  child_index.fill(-1);
  for (ChildRole role : kRoleOrder) {
    bool used = false;
    for (int id = 0; id < count && !used; ++id) used = role_of[id] == role;
    if (!used) continue;
    child_index[static_cast<int>(role)] = static_cast<int>(plan.children.size());
    const bool expert = role == ChildRole::expert || role == ChildRole::expert_muon;
    const Family stats = stats_family(role);
    plan.children.push_back(Child{role, expert, stats, clip_family(stats, m, faults)});
  }
  for (int id = 0; id < count; ++id) plan.child_of_param[id] = child_index[static_cast<int>(role_of[id])];
  plan.shared_stats = !plan.children.empty();
  for (const Child& child : plan.children)
    plan.shared_stats = plan.shared_stats && child.stats_family == plan.children[0].stats_family;
  // Group identity, not rank equality, decides Megatron-LM's shared path: the plain chain's dense
  // and expert groups are distinct objects even where their ranks coincide. A chain whose
  // children clip alone (#785) never shares.
  if (model == vocab::OptimizerModel::plain) plan.shared_stats = plan.shared_stats && plan.children.size() == 1;
  if (faults.has(vocab::Fault::clip_per_child_norm)) plan.shared_stats = plan.shared_stats && plan.children.size() == 1;
  return plan;
}

}  // namespace tally::gradnorm
