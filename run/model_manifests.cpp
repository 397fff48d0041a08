#include "run/model_manifests.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <map>
#include <stdexcept>
#include <string>

#include "vocab/gradients.h"
#include "vocab/path_options.h"
#include "oracle/ground_truth.h"
#include "topologies/logical_model.h"
#include "topologies/sharding.h"

namespace tally::run {

namespace {

using topologies::Family;

manifest::Attributes attributes_of(const record::Attributes& a, const record::RunRecord& run,
                                   const record::Tensor& tensor) {
  manifest::Attributes out;
  out.tensor_model_parallel = a.tensor_model_parallel;
  out.partition_dim = a.partition_dim;
  out.allreduce = a.allreduce;
  out.shared = a.shared;
  out.is_gtp_weight_remat = a.gtp_weight_remat;
  if (tensor.norm_group != 0)
    out.grad_norm_group = run.norm_groups[static_cast<std::size_t>(tensor.norm_group)].name;
  return out;
}

// The gradient statistics of (tensor, box, range), each computed once by the oracle.
class StatsOfRanges {
 public:
  StatsOfRanges(const topologies::LogicalModel& model, const vocab::GradientSpec& gradients)
      : model_(model), generators_(vocab::param_generators(gradients, model)) {}
  manifest::GradStats of(int tensor, const record::Box& box, record::ElementRange range) {
    std::vector<std::int64_t> key{tensor, range.begin, range.end};
    for (int d = 0; d < box.extent.ndim; ++d) {
      key.push_back(box.offset[d]);
      key.push_back(box.extent.size[d]);
    }
    auto [it, fresh] = memo_.try_emplace(std::move(key));
    if (fresh) {
      const topologies::LogicalParam& logical = model_.param(tensor);
      it->second = oracle::range_truth(logical, box, range, generators_[static_cast<std::size_t>(tensor)]);
    }
    return it->second;
  }

 private:
  const topologies::LogicalModel& model_;
  std::vector<kernels::GeneratorSpec> generators_;  // by logical param id
  std::map<std::vector<std::int64_t>, manifest::GradStats> memo_;
};

// Whether child `c`'s filter had an expert TP group for every expert piece of the run: not when
// the record shows an expert-topology piece of it de-duplicated on the TP group. A manifest names
// the groups per child, so such a child is written without one, and the check's reading of the
// attributes then explains its decisions.
std::vector<bool> children_with_expert_tp_group(const record::RunRecord& run) {
  std::vector<bool> has(run.children.size(), true);
  for (const record::RankRecord& rank : run.ranks) {
    for (std::size_t c = 0; c < rank.children.size(); ++c)
      if (rank.children[c].expert_tp_group < 0) has[c] = false;
    for (const record::Piece& piece : rank.local->pieces)
      if (!piece.main_attributes.allreduce && piece.rule.basis == record::Basis::replicated &&
          piece.rule.dedup != record::DedupGroup::expert_tp)
        has[static_cast<std::size_t>(piece.child)] = false;
  }
  return has;
}

// The name a manifest gives `ranks`, a group `rank` reduced over: the family of the layout whose
// group of `rank` it is.
std::string name_of_group(const topologies::RankLayout& layout, int rank, const std::vector<int>& ranks) {
  for (Family family : topologies::kAllFamilies) {
    if (!layout.group_of(family, rank)) continue;
    const std::span<const int> g = layout.group_ranks(family, rank);
    if (std::equal(g.begin(), g.end(), ranks.begin(), ranks.end())) return std::string(group_name(family));
  }
  return "stats_group";
}

// The run's group table (each rank list once, sorted) and the ids of the layout's and the
// record's groups in it. Each group is looked up by its family and index, or its record index,
// so a world-sized group costs its size once, not once per member.
class GroupIds {
 public:
  GroupIds(const topologies::RankLayout& layout, const record::RunRecord& run,
           std::vector<std::vector<int>>& table)
      : layout_(layout), run_(run), table_(table) {}

  manifest::GroupId of_family(Family family, int rank) {
    const auto key = std::make_pair(static_cast<int>(family), layout_.group_of(family, rank)->index);
    auto [it, fresh] = by_family_.try_emplace(key, -1);
    if (fresh) it->second = intern(layout_.group_ranks(family, rank));
    return it->second;
  }
  // A group of the record, by its index in RunRecord::groups, and the name the manifest gives it.
  std::pair<manifest::GroupId, const std::string&> of_record(int index, int rank) {
    auto [it, fresh] = by_record_.try_emplace(index);
    if (fresh) {
      const std::vector<int>& ranks = run_.groups[static_cast<std::size_t>(index)];
      it->second = {intern(ranks), name_of_group(layout_, rank, ranks)};
    }
    return {it->second.first, it->second.second};
  }

 private:
  manifest::GroupId intern(std::span<const int> ranks) {
    std::vector<int> sorted(ranks.begin(), ranks.end());
    std::sort(sorted.begin(), sorted.end());
    return table_.intern(sorted);
  }

  const topologies::RankLayout& layout_;
  const record::RunRecord& run_;
  record::GroupTable table_;
  std::map<std::pair<int, int>, manifest::GroupId> by_family_;
  std::map<int, std::pair<manifest::GroupId, std::string>> by_record_;
};

// The statistics of a piece's range after the path's clip, from the values it recorded; a
// param it left as stored (no data) has its held statistics.
record::GradStats clipped_stats(const record::ClippedValues& clipped, const record::Piece& piece,
                                const record::GradStats& held) {
  const record::ClippedParam& param = clipped.at(static_cast<std::size_t>(piece.param));
  if (!param.data) return held;
  record::GradStats out;
  const std::span<const float> values = param.values();
  for (std::int64_t e = piece.range.begin; e < piece.range.end; ++e) {
    const double g = values[static_cast<std::size_t>(e)];
    out.sum_squares += g * g;
    out.abs_max = std::max(out.abs_max, std::abs(g));
    out.zeros += g == 0.0;
  }
  return out;
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
    case Family::gtp: return "gtp_remat";
    case Family::gtp_dp: return "dp_gtp_remat";
    case Family::gtp_dp_cp: return "dp_cp_gtp_remat";
    case Family::expt_gtp: return "expt_gtp_remat";
    case Family::expt_gtp_dp: return "expt_dp_gtp_remat";
    case Family::expt_tp_ep_gtp_pp: return "tp_ep_pp_with_egtp_remat";
    case Family::tp_gtp: return "tp_gtp";
    case Family::expt_tp_ep_gtp: return "expt_tp_ep_gtp";
    case Family::expt_tp_gtp: return "expt_tp_gtp";
    case Family::dist_opt_stage: return "intra_dist_opt_pp_stage";
    case Family::dist_opt_without_ep: return "intra_dist_opt_ep_rank";
    case Family::dist_opt_stage_without_ep: return "intra_dist_opt_pp_stage_ep_rank";
    case Family::expt_tp_gtp_pp: return "expt_tp_gtp_pp";
    case Family::expt_tp_pp: return "expt_tp_pp";
    case Family::expt_tp_dp_pp: return "expt_tp_dp_pp";
    case Family::expt_tp_dp: return "expt_tp_dp";
  }
  return "unknown";
}

manifest::RunManifests model_manifests(const casefile::Case& c, const record::RunRecord& run) {
  if (std::optional<std::string> error = casefile::check_case(c)) throw casefile::InvalidCase(*error);
  const topologies::RankLayout layout(c.topology);
  const topologies::LogicalModel model(c.model, c.topology);
  const int world = layout.world();
  if (run.world != world || static_cast<int>(run.ranks.size()) != world ||
      static_cast<int>(run.tensors.size()) != model.size())
    throw std::invalid_argument("manifests: the record has " + std::to_string(run.ranks.size()) +
                                " of " + std::to_string(run.world) + " ranks and " +
                                std::to_string(run.tensors.size()) + " tensors, the case world " +
                                std::to_string(world) + " and " + std::to_string(model.size()) +
                                " params (a record of every rank of this case is needed)");
  const topologies::ParallelConfig& t = c.topology;
  const manifest::ParallelSizes parallel{t.tp, t.cp, t.pp, topologies::dp(t), t.ep, t.etp};
  const std::vector<bool> has_expert_tp_group = children_with_expert_tp_group(run);
  StatsOfRanges stats(model, c.path.gradients);

  manifest::RunManifests out;
  std::vector<manifest::RankManifest>& manifests = out.ranks;
  manifests.resize(static_cast<std::size_t>(world));
  GroupIds groups(layout, run, out.groups);
  std::vector<topologies::LocalParam> sharded;
  std::map<const void*, record::SharedList<manifest::ModelParam>> params_of;
  for (const record::RankRecord& rank : run.ranks) {
    if (rank.rank < 0 || rank.rank >= world)
      throw std::invalid_argument("manifests: the record's rank " + std::to_string(rank.rank) +
                                  " is outside world " + std::to_string(world));
    manifest::RankManifest& m = manifests[static_cast<std::size_t>(rank.rank)];
    m.producer = run.producer;
    m.rank = rank.rank;
    m.world = world;
    m.parallel = parallel;
    for (Family family : topologies::megatron_families(layout.config()))
      if (layout.group_of(family, rank.rank))
        m.groups[std::string(group_name(family))] = groups.of_family(family, rank.rank);
    // A faulty path may reduce over a group Megatron-LM never creates: it used it all the same.
    for (const record::ChildRecord& child : rank.children) {
      const auto [id, name] = groups.of_record(child.stats_group, rank.rank);
      m.groups.emplace(name, id);
    }

    const record::LocalRecord& local = *rank.local;
    // Ranks of one params list (data-parallel replicas) hold the same boxes by the same local
    // names: their manifests share one list.
    auto [shared, fresh] = params_of.try_emplace(local.params.identity());
    if (fresh) {
      topologies::local_params(model, layout, rank.rank, sharded);  // for the local names only
      if (sharded.size() != local.params.size())
        throw std::invalid_argument("manifests: the record's rank " + std::to_string(rank.rank) +
                                    " holds " + std::to_string(local.params.size()) +
                                    " params, its sharding " + std::to_string(sharded.size()));
      std::vector<manifest::ModelParam> params;
      for (std::size_t k = 0; k < local.params.size(); ++k) {
        const record::LocalParam& param = local.params[k];
        const record::Tensor& tensor = run.tensors[static_cast<std::size_t>(param.tensor)];
        manifest::ModelParam& p = params.emplace_back();
        p.name = topologies::local_name(model, sharded[k]);
        p.logical_name = tensor.name;
        for (int d = 0; d < tensor.shape.ndim; ++d) {
          p.logical_shape.push_back(tensor.shape.size[d]);
          p.offsets.push_back(param.box.offset[d]);
          p.extents.push_back(param.box.extent.size[d]);
        }
        p.attributes = attributes_of(param.attributes, run, tensor);
        p.stats = stats.of(param.tensor, param.box, {0, param.box.numel()});
      }
      shared->second = std::move(params);
    }
    m.params = shared->second;

    m.optimizers.resize(rank.children.size());
    for (std::size_t ci = 0; ci < rank.children.size(); ++ci) {
      const record::ChildRecord& child = rank.children[ci];
      manifest::OptimizerRecord& o = m.optimizers[ci];
      o.name = run.children[ci];
      o.stats_group = groups.of_record(child.stats_group, rank.rank).first;
      if (child.tp_group >= 0) o.tp_group = groups.of_record(child.tp_group, rank.rank).first;
      if (child.expert_tp_group >= 0 && has_expert_tp_group[ci])
        o.expert_tp_group = groups.of_record(child.expert_tp_group, rank.rank).first;
      if (child.clip) o.clip = manifest::Clip{child.clip->max_norm, child.clip->coefficient};
    }
    for (const record::Piece& piece : local.pieces) {
      const record::LocalParam& param = local.params[static_cast<std::size_t>(piece.param)];
      manifest::MainParam& p = m.optimizers[static_cast<std::size_t>(piece.child)].main_params.emplace_back();
      p.param = piece.param;
      p.begin = piece.range.begin;
      p.end = piece.range.end;
      p.attributes = attributes_of(piece.main_attributes, run, run.tensors[static_cast<std::size_t>(param.tensor)]);
      p.kept = piece.counted_in >= 0;  // kept for the norm of its own grad-norm group
      p.kept_zeros = piece.in_zero_count;
      p.stats = stats.of(param.tensor, param.box, piece.range);
      if (rank.clipped) p.clipped_stats = clipped_stats(*rank.clipped, piece, p.stats);
    }
    m.reported.norm = rank.reported.norm;
    m.reported.inf_norm = rank.reported.inf_norm;
    m.reported.zeros = rank.reported.zeros;
    for (const record::GroupNorm& g : rank.reported.group_norms)
      m.reported.group_norms[run.norm_groups[static_cast<std::size_t>(g.norm_group)].name] = g.norm;
  }
  return out;
}

}  // namespace tally::run
