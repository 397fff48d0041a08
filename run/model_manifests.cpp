#include "run/model_manifests.h"

#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "gradnorm/main_params.h"
#include "gradnorm/ownership.h"
#include "kernels/local_stats.h"
#include "topologies/sharding.h"

#ifndef TALLY_VERSION
#define TALLY_VERSION "?"
#endif

namespace tally::run {

namespace {

using topologies::Family;

// The statistics a manifest records: fp64, whatever the path accumulated in, of the gradient
// the path generated for the shard.
manifest::GradStats stats_of(const kernels::ShardDesc& shard, const kernels::GeneratorSpec& gen) {
  kernels::StatsOptions options;
  options.accumulation = kernels::Accumulation::fp64;
  const kernels::Stats s = kernels::local_stats_cpu({&shard, 1}, gen, options).total;
  return {s.sum_squares, s.abs_max, s.zeros};
}

manifest::Attributes attributes_of(const topologies::LocalParam& a) {
  manifest::Attributes out;
  out.tensor_model_parallel = a.tensor_model_parallel;
  out.partition_dim = a.partition_dim;
  out.allreduce = a.allreduce;
  out.shared = a.shared;
  if (a.grad_norm_group != topologies::GradNormGroup::main)
    out.grad_norm_group = std::string(topologies::grad_norm_group_name(a.grad_norm_group));
  return out;
}

std::vector<int> ranks_of(std::span<const int> ranks) { return {ranks.begin(), ranks.end()}; }

// Whether child `c`'s duplicate filter has an expert TP group: not when one of its
// expert-labelled params falls back to the dense TP group. Decided from the model, not the
// rank, so every rank of the run describes the child alike.
std::vector<bool> children_with_expert_tp_group(const topologies::LogicalModel& model,
                                                const gradnorm::OptimizerPlan& plan,
                                                const gradnorm::FaultSet& faults) {
  std::vector<bool> has(plan.children.size(), true);
  for (const topologies::LogicalParam& p : model.params())
    if (plan.expert_label[p.id] && gradnorm::filter_lacks_expert_tp_group(p.param_class, faults))
      has[plan.child_of_param[p.id]] = false;
  return has;
}

std::string producer_of(const gradnorm::PathOptions& options) {
  return "tally " TALLY_VERSION " (its model of the grad-norm path: optimizer " +
         std::string(gradnorm::optimizer_model_name(options.optimizer)) + ", faults " +
         gradnorm::fault_list(options.faults) + ")";
}

std::string child_name(const gradnorm::OptimizerPlan& plan, int c) {
  return std::string(gradnorm::optimizer_model_name(plan.model)) + ".chained_optimizers[" +
         std::to_string(c) + "] (" + std::string(gradnorm::child_role_name(plan.children[c].role)) +
         ")";
}

manifest::ParallelSizes parallel_of(const topologies::ParallelConfig& c) {
  return {c.tp, c.cp, c.pp, topologies::dp(c), c.ep, c.etp};
}

}  // namespace

std::string_view group_name(Family family) {
  switch (family) {
    case Family::tp: return "tp";
    case Family::cp: return "cp";
    case Family::dp: return "dp";
    case Family::dp_cp: return "dp_cp";
    case Family::pp: return "pp";
    case Family::tp_pp: return "mp";
    case Family::tp_cp: return "tp_cp";
    case Family::tp_dp_cp: return "tp_dp_cp";
    case Family::tp_dp: return "tp_dp";
    case Family::expt_tp: return "expt_tp";
    case Family::expt_ep: return "ep";
    case Family::expt_dp: return "expt_dp";
    case Family::expt_tp_ep: return "tp_ep";
    case Family::expt_tp_ep_pp: return "tp_ep_pp";
    case Family::embedding: return "embd";
    case Family::world: return "world";
    case Family::dist_opt: return "intra_dist_opt";
    case Family::expt_tp_pp: return "expt_tp_pp";
    case Family::expt_tp_dp_pp: return "expt_tp_dp_pp";
  }
  return "unknown";
}

std::vector<manifest::RankManifest> manifests_from_run(const topologies::LogicalModel& model,
                                             const topologies::RankLayout& layout,
                                             const gradnorm::PathOptions& options,
                                             const gradnorm::PathResult& result) {
  const int world = layout.world();
  const gradnorm::OptimizerPlan& plan = result.plan;
  if (static_cast<int>(plan.child_of_param.size()) != model.size())
    throw std::invalid_argument("manifests: the path result's optimizer plan has " +
                                std::to_string(plan.child_of_param.size()) +
                                " params but the model has " + std::to_string(model.size()));
  std::vector<const gradnorm::RankResult*> by_rank(world, nullptr);
  for (const gradnorm::RankResult& r : result.ranks) {
    if (r.rank < 0 || r.rank >= world || r.children.size() != plan.children.size())
      throw std::invalid_argument("manifests: the path result's rank " + std::to_string(r.rank) +
                                  " does not fit world " + std::to_string(world));
    by_rank[r.rank] = &r;
  }
  for (int rank = 0; rank < world; ++rank)
    if (!by_rank[rank])
      throw std::invalid_argument("manifests: the path result has no rank " +
                                  std::to_string(rank) + " (run the path on every rank)");

  const gradnorm::FaultSet& faults = options.faults;
  const std::vector<bool> has_expert_tp_group = children_with_expert_tp_group(model, plan, faults);
  const std::string producer = producer_of(options);
  const manifest::ParallelSizes parallel = parallel_of(layout.config());

  std::vector<manifest::RankManifest> manifests(world);
  std::vector<topologies::LocalParam> local;
  std::vector<gradnorm::MainParam> main;
  gradnorm::Ownership ownership;
  for (int rank = 0; rank < world; ++rank) {
    const gradnorm::RankResult& outcome = *by_rank[rank];
    manifest::RankManifest& m = manifests[rank];
    m.producer = producer;
    m.rank = rank;
    m.world = world;
    m.parallel = parallel;
    for (Family family : topologies::kMegatronFamilies)
      if (layout.group_of(family, rank))
        m.groups[std::string(group_name(family))] = ranks_of(layout.group_ranks(family, rank));
    // A faulty path may reduce over a group Megatron-LM never creates: it used it all the same.
    for (const gradnorm::ChildOutcome& child : outcome.children)
      m.groups[std::string(group_name(child.group.family))] = ranks_of(layout.ranks(child.group));

    // The path's own decisions for this rank: its main copies and what its optimizer owns.
    topologies::local_params(model, layout, rank, local);
    gradnorm::make_main_params(local, plan, faults, main);
    gradnorm::own_elements(options.optimizer, main, layout, rank, {options.bucket_elements},
                           faults, ownership);

    m.params.reserve(local.size());
    std::vector<kernels::GeneratorSpec> generator(local.size());
    for (std::size_t k = 0; k < local.size(); ++k) {
      const topologies::LocalParam& param = local[k];
      const topologies::LogicalParam& logical = model.param(param.logical_id);
      // The gradient of a shared copy is the tensor it copies: the path reads the logical id.
      generator[k] = gradnorm::generator_for(options.gradients, logical.param_class);
      manifest::ModelParam p;
      p.name = topologies::local_name(model, param);
      p.logical_name = logical.name;
      for (int d = 0; d < logical.shape.rank; ++d) {
        p.logical_shape.push_back(logical.shape.dims[d]);
        p.offsets.push_back(param.slice.offset[d]);
        p.extents.push_back(param.slice.extent[d]);
      }
      // The model param carries the model's expert label (main copies may lose it).
      topologies::LocalParam labelled = param;
      labelled.allreduce = !plan.expert_label[param.logical_id];
      p.attributes = attributes_of(labelled);
      p.stats = stats_of(gradnorm::shard_desc(logical, param, {0, param.slice.numel()}),
                         generator[k]);
      m.params.push_back(std::move(p));
    }

    const std::vector<int> tp_group = ranks_of(layout.group_ranks(Family::tp, rank));
    const std::vector<int> expert_tp_group = ranks_of(layout.group_ranks(Family::expt_tp, rank));
    m.optimizers.resize(plan.children.size());
    for (std::size_t c = 0; c < plan.children.size(); ++c) {
      manifest::OptimizerRecord& o = m.optimizers[c];
      o.name = child_name(plan, static_cast<int>(c));
      o.stats_group = ranks_of(layout.ranks(outcome.children[c].group));
      o.tp_group = tp_group;
      if (has_expert_tp_group[c]) o.expert_tp_group = expert_tp_group;
      if (options.max_norm > 0.0)
        o.clip = manifest::Clip{options.max_norm, outcome.children[c].clip_coefficient};
    }
    for (const gradnorm::OwnedPiece& piece : ownership.pieces) {
      const gradnorm::MainParam& param = main[piece.local_index];
      const topologies::LogicalParam& logical = model.param(param.attrs.logical_id);
      const bool kept_zeros =
          gradnorm::rule_keeps(gradnorm::filter_rule(param, layout, rank, faults));
      manifest::MainParam record;
      record.param = piece.local_index;
      record.begin = piece.range.begin;
      record.end = piece.range.end;
      record.attributes = attributes_of(param.attrs);
      record.kept_zeros = kept_zeros;
      record.kept = kept_zeros && gradnorm::norm_share(plan, param, logical, faults) ==
                                      gradnorm::NormShare::main;
      const bool whole = piece.range.begin == 0 && piece.range.end == param.attrs.slice.numel();
      record.stats = whole ? m.params[piece.local_index].stats
                           : stats_of(gradnorm::shard_desc(logical, param.attrs, piece.range),
                                      generator[piece.local_index]);
      m.optimizers[param.child].main_params.push_back(std::move(record));
    }
    m.reported.norm = outcome.norm;
    m.reported.inf_norm = outcome.inf_norm;
    m.reported.zeros = outcome.zeros;
  }
  return manifests;
}

std::vector<manifest::RankManifest> manifests_from_run(const casefile::Case& c,
                                             const gradnorm::PathResult& result) {
  if (std::optional<std::string> error = casefile::check_case(c)) throw casefile::InvalidCase(*error);
  const topologies::RankLayout layout(c.topology);
  const topologies::LogicalModel model(c.model, c.topology);
  return manifests_from_run(model, layout, c.path, result);
}

}  // namespace tally::run
