#include "gradnorm/path.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>

#include "gradnorm/reduction.h"
#include "vocab/gradients.h"
#include "topologies/sharding.h"

namespace tally::gradnorm {

namespace {

using topologies::Family;
using topologies::GradNormGroup;

// The run record's norm groups: the main norm, then the MTP norm when the model has one.
constexpr int kMainNorm = 0;
constexpr int kMtpNorm = 1;

// Payload of one reduction unit (one child, or every child when they share a group).
enum SumSlot : int { kSquares = 0, kSquaresMtp, kSqrtOfLocal, kZerosAsFloat, kFirstPSum };
enum MaxSlot : int { kAbsMax = 0, kAbsMaxMtp, kMaxSlots };

struct Unit {
  std::vector<int> children;  // plan children reduced together
  Family family = Family::world;
  Family clip_family = Family::world;  // the group of the norm its children clip with
};

std::vector<Unit> reduction_units(const OptimizerPlan& plan) {
  std::vector<Unit> units;
  if (plan.shared_stats) {
    Unit unit;
    unit.family = plan.children[0].stats_family;
    unit.clip_family = plan.children[0].clip_family;
    for (int c = 0; c < static_cast<int>(plan.children.size()); ++c) unit.children.push_back(c);
    units.push_back(unit);
  } else {
    for (int c = 0; c < static_cast<int>(plan.children.size()); ++c)
      units.push_back(Unit{{c}, plan.children[c].stats_family, plan.children[c].clip_family});
  }
  return units;
}

// What the kernels read of `box` of a logical tensor: its `range` (the whole box needs none).
kernels::ShardDesc shard_desc(const topologies::LogicalParam& logical, const record::Box& box,
                              kernels::ElementRange range) {
  kernels::ShardDesc shard;
  shard.param_id = static_cast<std::uint64_t>(logical.id);
  shard.ndim = logical.shape.rank;
  for (int d = 0; d < logical.shape.rank; ++d) {
    shard.shape[d] = logical.shape.dims[d];
    shard.offset[d] = box.offset[d];
    shard.extent[d] = box.extent.size[d];
  }
  if (range.begin != 0 || range.end != box.numel()) shard.range = range;
  return shard;
}

// Where the statistics of an owned piece that the duplicate filter kept go: the main norm, the
// MTP norm (its own grad_norm_group), or only the zero count (its child's norm is discarded:
// expert-norm-dropped). Every kept piece is in the zero count; a dropped piece is nowhere.
enum class NormShare : std::uint8_t { main, mtp, zeros_only };
NormShare norm_share(const OptimizerPlan& plan, const MainParam& param,
                     const topologies::LogicalParam& logical, const vocab::FaultSet& faults) {
  // DeepSpeed #8613: the expert child's norm is computed, then discarded.
  if (faults.has(vocab::Fault::expert_norm_dropped) && plan.children[param.child].expert)
    return NormShare::zeros_only;
  return logical.grad_norm_group == GradNormGroup::mtp ? NormShare::mtp : NormShare::main;
}

struct UnitState {
  comm::Group group;
  std::vector<double> sums;
  std::vector<double> maxima;
  std::vector<std::int64_t> zeros{0};
  // The main sum of squares over the clip group, where a fault makes it differ from `group`.
  std::vector<double> clip_squares;
};

// Each logical param's generator, and which of the run's distinct generators it is: shards of
// one generator go to the kernels in one call.
struct ParamGradients {
  std::vector<kernels::GeneratorSpec> spec;  // by logical param id
  std::vector<int> kind;                     // by logical param id: index into `distinct`
  std::vector<kernels::GeneratorSpec> distinct;
};

ParamGradients param_gradients(const vocab::GradientSpec& gradients, const topologies::LogicalModel& model) {
  ParamGradients out;
  out.spec = vocab::param_generators(gradients, model);
  out.kind.reserve(out.spec.size());
  for (const kernels::GeneratorSpec& spec : out.spec) {
    const auto found = std::find(out.distinct.begin(), out.distinct.end(), spec);
    out.kind.push_back(static_cast<int>(found - out.distinct.begin()));
    if (found == out.distinct.end()) out.distinct.push_back(spec);
  }
  return out;
}

// Stated values are hand-written and small: the CPU computes them whatever the backend's kernels.
kernels::LocalStatsFn stats_fn_for(const kernels::GeneratorSpec& gen, kernels::LocalStatsFn local_stats) {
  return kernels::states_values(gen) ? kernels::local_stats_cpu : local_stats;
}

// Local statistics are a pure function of (shards, generator, options): the data-parallel
// replicas of a rank hold identical shards, so the in-process backend computes them once.
class StatsMemo {
 public:
  const kernels::Stats& get(std::span<const kernels::ShardDesc> shards,
                            const kernels::GeneratorSpec& gen, const kernels::StatsOptions& options,
                            kernels::LocalStatsFn local_stats) {
    key_.clear();
    key_.push_back(static_cast<std::int64_t>(gen.mode));
    key_.push_back(static_cast<std::int64_t>(gen.stated.kind));
    key_.push_back(std::bit_cast<std::int64_t>(gen.stated.number));
    key_.push_back(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(gen.stated.list)));
    key_.push_back(static_cast<std::int64_t>(options.p_values.size()));
    for (const kernels::ShardDesc& shard : shards) {
      key_.push_back(static_cast<std::int64_t>(shard.param_id));
      key_.push_back(shard.ndim);
      for (int d = 0; d < shard.ndim; ++d) {
        key_.push_back(shard.offset[d]);
        key_.push_back(shard.extent[d]);
      }
      key_.push_back(shard.range ? shard.range->begin : -1);
      key_.push_back(shard.range ? shard.range->end : -1);
    }
    auto [entry, fresh] = memo_.try_emplace(key_);
    if (fresh) entry->second = stats_fn_for(gen, local_stats)(shards, gen, options).total;
    return entry->second;
  }

 private:
  struct Hash {
    std::size_t operator()(const std::vector<std::int64_t>& key) const {
      std::uint64_t h = 0xcbf29ce484222325ull;
      for (std::int64_t v : key) h = (h ^ static_cast<std::uint64_t>(v)) * 0x100000001b3ull;
      return static_cast<std::size_t>(h);
    }
  };
  std::vector<std::int64_t> key_;
  std::unordered_map<std::vector<std::int64_t>, kernels::Stats, Hash> memo_;
};

// The run record's group table, each group of the layout interned once however many ranks use it.
class GroupRefs {
 public:
  GroupRefs(const topologies::RankLayout& layout, std::vector<std::vector<int>>& groups)
      : layout_(layout), table_(groups) {}
  int of(topologies::GroupId id) {
    const std::uint64_t key =
        (std::uint64_t{static_cast<std::uint8_t>(id.family)} << 32) | static_cast<std::uint32_t>(id.index);
    auto [it, fresh] = cache_.try_emplace(key, 0);
    if (fresh) {
      const std::span<const int> ranks = layout_.ranks(id);
      it->second = table_.intern({ranks.begin(), ranks.end()});
    }
    return it->second;
  }
  int of(Family family, int rank) { return of(*layout_.group_of(family, rank)); }

 private:
  const topologies::RankLayout& layout_;
  record::GroupTable table_;
  std::unordered_map<std::uint64_t, int> cache_;
};

struct RankState {
  int rank = 0;
  // Which of the run's distinct generators each logical param's values on this rank come from: the
  // case's, or what the reduction left on it (shared by ranks that hold the same).
  const std::vector<int>* kinds = nullptr;
  std::shared_ptr<const record::LocalRecord> local;
  std::vector<UnitState> units;
  // average-local-norms-over-dp: the rank's main squares over the model-parallel group, then
  // over the data-parallel group the sum of the roots of those and their extremes {max, -min}.
  std::vector<double> mp_squares;
  std::vector<double> dp_norm_sum;
  std::vector<double> dp_norm_extremes;
};

record::Attributes attributes_of(const topologies::LocalParam& a) {
  return {a.tensor_model_parallel, a.partition_dim, a.allreduce, a.shared, a.gtp_weight_remat};
}

record::Box box_of(const topologies::Slice& slice, int ndim) {
  record::Box box;
  box.extent.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    box.offset[d] = slice.offset[d];
    box.extent.size[d] = slice.extent[d];
  }
  return box;
}

// The rule behind the filter's decision, as the record states it.
record::Rule record_rule(Rule rule, const topologies::GtpCheck& gtp, bool child_norm_discarded) {
  record::Rule out;
  out.child_norm_discarded = child_norm_discarded;
  if (gtp.applies && rule != Rule::dropped_shared && rule != Rule::kept_without_filter)
    out.gtp_dedup = gtp.family == Family::gtp ? record::GtpDedup::gtp : record::GtpDedup::expert_gtp;
  switch (rule) {
    case Rule::kept_tensor_parallel: out.basis = record::Basis::tensor_parallel_shard; break;
    case Rule::kept_without_filter: out.basis = record::Basis::no_filter; break;
    case Rule::dropped_shared: out.basis = record::Basis::shared_copy; break;
    case Rule::kept_first_of_tp:
    case Rule::dropped_not_first_of_tp:
      out.basis = record::Basis::replicated;
      out.dedup = record::DedupGroup::tp;
      break;
    case Rule::kept_first_of_etp:
    case Rule::dropped_not_first_of_etp:
      out.basis = record::Basis::replicated;
      out.dedup = record::DedupGroup::expert_tp;
      break;
  }
  return out;
}

// What a rank holds: its local params, their main copies and their record. It depends only on
// the rank's TP, ETP, EP, PP, GTP and EGTP coordinates (topologies/sharding.cpp), so the data-parallel
// replicas of one position share it, computed once: a world of 10^6 ranks has a few thousand.
struct Held {
  std::vector<topologies::LocalParam> local;
  std::vector<MainParam> main;
  record::LocalParams params;
};

class HeldMemo {
 public:
  HeldMemo(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
           const OptimizerPlan& plan, const vocab::FaultSet& faults)
      : model_(model), layout_(layout), plan_(plan), faults_(faults) {}

  const Held& of(int rank) {
    const topologies::Coordinates at = layout_.coordinates(rank);
    auto [it, fresh] = by_position_.try_emplace({at.tp, at.etp, at.ep, at.pp, at.gtp, at.egtp});
    Held& held = it->second;
    if (!fresh) return held;
    topologies::local_params(model_, layout_, rank, held.local);
    make_main_params(held.local, plan_, faults_, held.main);
    std::vector<record::LocalParam> params;
    params.reserve(held.local.size());
    for (const topologies::LocalParam& param : held.local) {
      // The model param carries the model's expert label (main copies may lose it).
      topologies::LocalParam labelled = param;
      labelled.allreduce = !plan_.expert_label[param.logical_id];
      params.push_back({param.logical_id, box_of(param.slice, model_.param(param.logical_id).shape.rank),
                        attributes_of(labelled), std::nullopt});
    }
    held.params = std::move(params);
    return held;
  }

 private:
  const topologies::LogicalModel& model_;
  const topologies::RankLayout& layout_;
  const OptimizerPlan& plan_;
  const vocab::FaultSet& faults_;
  std::map<std::array<int, 6>, Held> by_position_;
};

void run_local_phase(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
                     const vocab::PathOptions& options, const OptimizerPlan& plan,
                     const std::vector<Unit>& units, const ParamGradients& gradients,
                     comm::Communicator& communicator, kernels::LocalStatsFn local_stats, StatsMemo& memo,
                     record::LocalRecordPool& pool, RankState& state, HeldMemo& held_memo,
                     Ownership& ownership, record::LocalRecord& decisions) {
  const vocab::FaultSet& faults = options.faults;
  const int rank = state.rank;
  const Held& held = held_memo.of(rank);
  const std::vector<MainParam>& main = held.main;
  own_elements(options.optimizer, main, layout, rank, {options.bucket_elements}, faults,
               ownership);

  decisions.params = held.params;
  decisions.pieces.clear();

  std::vector<int> unit_of_child(plan.children.size());
  for (int u = 0; u < static_cast<int>(units.size()); ++u)
    for (int c : units[u].children) unit_of_child[c] = u;

  const std::size_t p_count = options.p_values.size();
  // Per unit and per statistic group, the shards of each of the run's distinct generators.
  enum Bin : int { kMain = 0, kMtp, kUncounted, kBins };
  const std::size_t generator_count = gradients.distinct.size();
  std::vector<std::array<std::vector<std::vector<kernels::ShardDesc>>, kBins>> shards(units.size());
  for (auto& unit_bins : shards)
    for (auto& bin : unit_bins) bin.resize(generator_count);
  state.units.resize(units.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    UnitState& unit = state.units[u];
    unit.sums.assign(kFirstPSum + p_count, 0.0);
    unit.maxima.assign(kMaxSlots, 0.0);
    unit.group = comm::group_of(layout, units[u].family, rank);
  }

  for (const OwnedPiece& piece : ownership.pieces) {
    const MainParam& param = main[piece.local_index];
    const topologies::LogicalParam& logical = model.param(param.attrs.logical_id);
    const Rule rule = filter_rule(param, layout, rank, faults);
    const topologies::GtpCheck gtp = topologies::gtp_check(param.attrs, layout, rank);
    const bool kept = rule_keeps(rule) && (rule == Rule::kept_without_filter || gtp.keeps);
    const NormShare share = kept ? norm_share(plan, param, logical, faults) : NormShare::zeros_only;
    record::Piece& decided = decisions.pieces.emplace_back();
    decided.param = piece.local_index;
    decided.child = param.child;
    decided.range = {piece.range.begin, piece.range.end};
    decided.main_attributes = attributes_of(param.attrs);
    decided.in_zero_count = kept;
    decided.counted_in = !kept || share == NormShare::zeros_only ? -1
                         : share == NormShare::mtp               ? kMtpNorm
                                                                 : kMainNorm;
    decided.rule = record_rule(rule, gtp, kept && share == NormShare::zeros_only);
    if (!kept) continue;

    const int u = unit_of_child[param.child];
    const kernels::ShardDesc shard =
        shard_desc(logical, decisions.params[static_cast<std::size_t>(piece.local_index)].box, piece.range);
    const int kind = (*state.kinds)[static_cast<std::size_t>(logical.id)];
    const Bin bin = share == NormShare::zeros_only ? kUncounted  // still in the zero count
                    : share == NormShare::mtp      ? kMtp
                                                   : kMain;
    shards[u][bin][static_cast<std::size_t>(kind)].push_back(shard);
  }
  state.local = pool.intern(decisions);

  kernels::StatsOptions stats_options;
  stats_options.accumulation = options.accumulation;
  stats_options.p_values = options.p_values;
  kernels::StatsOptions mtp_options;
  mtp_options.accumulation = options.accumulation;
  // Local statistics of one bin: one kernel call per generator, in the order of the run's first
  // use of each (the case's generator first for a model without stated gradients).
  auto stats_of = [&](const std::vector<std::vector<kernels::ShardDesc>>& bin,
                      const kernels::StatsOptions& bin_options) {
    kernels::Stats total;
    total.p_sums.assign(bin_options.p_values.size(), 0.0);
    bool first = true;
    for (std::size_t k = 0; k < bin.size(); ++k) {
      if (bin[k].empty() && !first) continue;
      const kernels::Stats& part = memo.get(bin[k], gradients.distinct[k], bin_options, local_stats);
      if (first) {
        total = part;
        first = false;
        continue;
      }
      total.sum_squares += part.sum_squares;
      total.abs_max = std::max(total.abs_max, part.abs_max);
      total.zeros += part.zeros;
      total.elements += part.elements;
      for (std::size_t i = 0; i < total.p_sums.size(); ++i) total.p_sums[i] += part.p_sums[i];
    }
    return total;
  };
  if (faults.has(vocab::Fault::average_local_norms_over_dp)) state.mp_squares.assign(1, 0.0);
  for (std::size_t u = 0; u < units.size(); ++u) {
    UnitState& unit = state.units[u];
    const kernels::Stats main_stats = stats_of(shards[u][kMain], stats_options);
    const kernels::Stats mtp_stats = stats_of(shards[u][kMtp], mtp_options);
    const kernels::Stats uncounted = stats_of(shards[u][kUncounted], mtp_options);
    std::int64_t zeros = main_stats.zeros + mtp_stats.zeros + uncounted.zeros;
    if (faults.has(vocab::Fault::distopt_padding_counted) && u == 0) zeros += ownership.padding;
    unit.sums[kSquares] = main_stats.sum_squares;
    unit.sums[kSquaresMtp] = mtp_stats.sum_squares;
    unit.sums[kSqrtOfLocal] = std::sqrt(main_stats.sum_squares);
    unit.sums[kZerosAsFloat] = static_cast<float>(zeros);
    for (std::size_t i = 0; i < p_count; ++i) unit.sums[kFirstPSum + i] = main_stats.p_sums[i];
    unit.maxima[kAbsMax] = main_stats.abs_max;
    unit.maxima[kAbsMaxMtp] = mtp_stats.abs_max;
    unit.zeros[0] = zeros;
    if (units[u].clip_family != units[u].family) unit.clip_squares = {main_stats.sum_squares};
    if (faults.has(vocab::Fault::average_local_norms_over_dp)) state.mp_squares[0] += main_stats.sum_squares;

    // #5530: a rank with no gradients returned before the collective.
    bool empty = true;
    for (const auto& bin : shards[u])
      for (const auto& kind_shards : bin) empty = empty && kind_shards.empty();
    if (faults.has(vocab::Fault::empty_rank_skips_collective) && empty) continue;
    communicator.all_reduce(rank, unit.group, unit.sums, comm::ReduceOp::sum, "grad-norm sums");
    communicator.all_reduce(rank, unit.group, unit.maxima, comm::ReduceOp::max, "grad-norm max");
    communicator.all_reduce(rank, unit.group, unit.zeros, comm::ReduceOp::sum, "zero count");
    if (!unit.clip_squares.empty())
      communicator.all_reduce(rank, comm::group_of(layout, units[u].clip_family, rank),
                              unit.clip_squares, comm::ReduceOp::sum, "clip-norm squares");
  }
  // DeepSpeed #8475: each rank's whole norm, over the model-parallel group only.
  if (faults.has(vocab::Fault::average_local_norms_over_dp))
    communicator.all_reduce(rank, comm::group_of(layout, Family::tp_pp, rank), state.mp_squares,
                            comm::ReduceOp::sum, "model-parallel squares");
}

// average-local-norms-over-dp's second round: the data-parallel sum of the model-parallel norms.
void run_average_phase(const topologies::RankLayout& layout, comm::Communicator& communicator,
                       RankState& state) {
  const double norm = std::sqrt(state.mp_squares[0]);
  const comm::Group dp = comm::group_of(layout, Family::dp_cp, state.rank);
  state.dp_norm_sum = {norm};
  state.dp_norm_extremes = {norm, -norm};
  communicator.all_reduce(state.rank, dp, state.dp_norm_sum, comm::ReduceOp::sum, "data-parallel norm sum");
  communicator.all_reduce(state.rank, dp, state.dp_norm_extremes, comm::ReduceOp::max,
                          "data-parallel norm extremes");
}

// The mean of the data-parallel norms. Where they are all equal it is that value exactly: the
// fault changes nothing there, and a rounded sum must not make it look as if it did.
double averaged_norm(const topologies::RankLayout& layout, const RankState& state) {
  if (state.dp_norm_extremes[0] == -state.dp_norm_extremes[1]) return state.dp_norm_extremes[0];
  return state.dp_norm_sum[0] / static_cast<double>(layout.group_ranks(Family::dp_cp, state.rank).size());
}

double clip_coefficient(double max_norm, double norm) {
  if (max_norm <= 0.0) return 1.0;
  const double coefficient = max_norm / (norm + 1e-6);
  return coefficient < 1.0 ? coefficient : 1.0;
}

// The clipped gradients of every local param of a rank, as the clip kernel produced them. Ranks
// that hold the same boxes and apply the same coefficients (data-parallel replicas) share them;
// each distinct (tensor, box, coefficient) is clipped once.
class ClipMemo {
 public:
  ClipMemo(const topologies::LogicalModel& model, const OptimizerPlan& plan,
           const ParamGradients& gradients, kernels::ClipScaleFn clip_scale)
      : model_(model), plan_(plan), gradients_(gradients), clip_scale_(clip_scale) {}

  // `child_clip`: each child's coefficient; `mtp_clip`: the MTP norm's.
  // `kinds`: the rank's generator of each logical param (RankState::kinds).
  std::shared_ptr<const record::ClippedValues> clip(const std::shared_ptr<const record::LocalRecord>& local,
                                                    const std::vector<int>& kinds,
                                                    const std::vector<double>& child_clip,
                                                    double mtp_clip) {
    auto& entry = by_rank_[RankKey{local->params.identity(), &kinds, child_clip, mtp_clip}];
    if (entry) return entry;
    auto out = std::make_shared<record::ClippedValues>(local->params.size());
    // One kernel call per (generator, coefficient) for the boxes not clipped yet.
    std::map<std::pair<int, double>, std::vector<std::size_t>> missing;
    for (std::size_t i = 0; i < local->params.size(); ++i) {
      const record::LocalParam& param = local->params[i];
      const topologies::LogicalParam& logical = model_.param(param.tensor);
      // Each gradient is scaled by its norm group's coefficient: its child's for the main norm,
      // the MTP norm's for MTP params.
      const double coefficient = logical.grad_norm_group == GradNormGroup::mtp
                                     ? mtp_clip
                                     : child_clip[static_cast<std::size_t>(plan_.child_of_param[param.tensor])];
      (*out)[i].coefficient = coefficient;
      (*out)[i].size = static_cast<std::size_t>(param.box.numel());
      if (coefficient >= 1.0) continue;  // Megatron-LM scales only below 1: left as stored
      const int kind = kinds[static_cast<std::size_t>(logical.id)];
      auto found = values_.find(BoxKey{param.tensor, param.box.offset, kind, coefficient});
      if (found != values_.end()) {
        (*out)[i].data = found->second;
      } else {
        missing[{kind, coefficient}].push_back(i);
      }
    }
    for (const auto& [what, indices] : missing) {
      std::vector<kernels::ShardDesc> shards;
      for (std::size_t i : indices) shards.push_back(shard_of(local->params[i]));
      const kernels::GeneratorSpec& gen = gradients_.distinct[static_cast<std::size_t>(what.first)];
      // One buffer per kernel call; each param's values alias their part of it. Stated values
      // are clipped on the CPU, as their statistics are computed.
      const kernels::ClipScaleFn clip_scale = kernels::states_values(gen) ? kernels::clip_scale_cpu : clip_scale_;
      const auto all = std::make_shared<const std::vector<float>>(
          clip_scale(shards, gen, kernels::ClipSpec{static_cast<float>(what.second), {}}));
      std::size_t at = 0;
      for (std::size_t k = 0; k < indices.size(); ++k) {
        const std::size_t n = static_cast<std::size_t>(kernels::visited_numel(shards[k]));
        const std::shared_ptr<const float> values(all, all->data() + at);
        at += n;
        const std::size_t i = indices[k];
        values_.emplace(BoxKey{local->params[i].tensor, local->params[i].box.offset, what.first, what.second}, values);
        (*out)[i].data = values;
      }
    }
    entry = std::move(out);
    return entry;
  }

 private:
  // A box is named by its tensor and offset: a tensor's distinct boxes never share an offset.
  struct BoxKey {
    int tensor;
    std::array<std::int64_t, record::kMaxDims> offset;
    int kind;  // the generator of its values
    double coefficient;
    friend auto operator<=>(const BoxKey&, const BoxKey&) = default;
  };
  // Clipped values belong to a rank's params, not its pieces: ranks of equal params share them.
  struct RankKey {
    const void* params;
    const std::vector<int>* kinds;
    std::vector<double> child_clip;
    double mtp_clip;
    friend auto operator<=>(const RankKey&, const RankKey&) = default;
  };
  kernels::ShardDesc shard_of(const record::LocalParam& param) const {
    return shard_desc(model_.param(param.tensor), param.box, {0, param.box.numel()});
  }

  const topologies::LogicalModel& model_;
  const OptimizerPlan& plan_;
  const ParamGradients& gradients_;
  kernels::ClipScaleFn clip_scale_;
  std::map<RankKey, std::shared_ptr<const record::ClippedValues>> by_rank_;
  std::map<BoxKey, std::shared_ptr<const float>> values_;
};

record::RankRecord combine(const topologies::RankLayout& layout, const OptimizerPlan& plan,
                           const std::vector<Unit>& units, const vocab::PathOptions& options,
                           const RankState& state, GroupRefs& groups, ClipMemo& clip_memo) {
  const vocab::FaultSet& faults = options.faults;
  record::RankRecord result;
  result.rank = state.rank;
  result.local = state.local;
  result.tp_group = groups.of(Family::tp, state.rank);
  result.expert_tp_group = groups.of(Family::expt_tp, state.rank);
  if (topologies::uses_gtp(layout.config())) {
    result.gtp_group = groups.of(Family::gtp, state.rank);
    result.expert_gtp_group = groups.of(Family::expt_gtp, state.rank);
  }
  result.children.resize(plan.children.size());
  record::Reported& reported = result.reported;
  double squares = 0.0, squares_mtp = 0.0, inf = 0.0, inf_l2 = 0.0, clip_squares = 0.0;
  bool clip_norm_differs = false;
  float zeros_float = 0.0f;
  std::int64_t zeros = 0;
  std::vector<double> p_sums(options.p_values.size(), 0.0);
  std::vector<double> unit_norm(units.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    const UnitState& unit = state.units[u];
    const double size = static_cast<double>(unit.group.ranks.size());
    // DeepSpeed #8475: the mean of per-rank norms, not the root of the summed squares.
    const double own = faults.has(vocab::Fault::average_rank_norms) ? unit.sums[kSqrtOfLocal] / size
                                                             : std::sqrt(unit.sums[kSquares]);
    unit_norm[u] = own;
    squares += faults.has(vocab::Fault::average_rank_norms) ? own * own : unit.sums[kSquares];
    squares_mtp += unit.sums[kSquaresMtp];
    clip_norm_differs = clip_norm_differs || !unit.clip_squares.empty();
    clip_squares += unit.clip_squares.empty() ? unit.sums[kSquares] : unit.clip_squares[0];
    inf = std::max(inf, unit.maxima[kAbsMax]);
    inf_l2 += unit.maxima[kAbsMax] * unit.maxima[kAbsMax];
    zeros += unit.zeros[0];
    zeros_float += static_cast<float>(unit.sums[kZerosAsFloat]);
    for (std::size_t i = 0; i < p_sums.size(); ++i) p_sums[i] += unit.sums[kFirstPSum + i];
  }
  const double norm =
      faults.has(vocab::Fault::average_local_norms_over_dp) ? averaged_norm(layout, state) : std::sqrt(squares);
  // norm-of-scaled-gradients: only the reported value; the clip below unscales (DeepSpeed #8588).
  reported.norm = faults.has(vocab::Fault::norm_of_scaled_gradients) ? norm * vocab::kFaultLossScale : norm;
  reported.inf_norm = faults.has(vocab::Fault::inf_norm_combined_by_l2) && units.size() > 1
                          ? std::sqrt(inf_l2)
                          : inf;
  reported.zeros = faults.has(vocab::Fault::zero_count_in_float32) ? static_cast<std::int64_t>(zeros_float)
                                                            : zeros;
  for (std::size_t i = 0; i < p_sums.size(); ++i)
    reported.p_norms.push_back(std::pow(p_sums[i], 1.0 / options.p_values[i]));
  // clip-per-stage-norm, clip-per-ep-group-norm: the logged norm is right, the clip norm is not.
  const double clip = clip_coefficient(options.max_norm, clip_norm_differs ? std::sqrt(clip_squares) : norm);
  reported.clip_coefficient = clip;
  double mtp_clip = 1.0;
  if (plan.has_mtp) {
    const double mtp_norm = std::sqrt(squares_mtp);
    mtp_clip = clip_coefficient(options.max_norm, mtp_norm);
    reported.group_norms.push_back({kMtpNorm, mtp_norm, mtp_clip});
  }

  std::vector<double> child_clip(plan.children.size(), clip);
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (int c : units[u].children) {
      record::ChildRecord& child = result.children[c];
      child.stats_group = groups.of(state.units[u].group.id);
      child.tp_group = result.tp_group;
      child.expert_tp_group =
          children_receive_expert_tp_group(faults) ? result.expert_tp_group : -1;
      child.norm = unit_norm[u];
      // #785: each child clipped with its own norm.
      if (faults.has(vocab::Fault::clip_per_child_norm))
        child_clip[c] = clip_coefficient(options.max_norm, unit_norm[u]);
      if (options.max_norm > 0.0) child.clip = record::Clip{options.max_norm, child_clip[c]};
    }
  }

  if (options.max_norm > 0.0) result.clipped = clip_memo.clip(state.local, *state.kinds, child_clip, mtp_clip);
  return result;
}

// The run-wide part of the record: tensors, norm groups, p-values, child names.
void describe_run(const topologies::LogicalModel& model, const vocab::PathOptions& options,
                  const OptimizerPlan& plan, record::RunRecord& run) {
  run.tensors.reserve(static_cast<std::size_t>(model.size()));
  for (const topologies::LogicalParam& p : model.params()) {
    record::Tensor& t = run.tensors.emplace_back();
    t.name = p.name;
    t.shape.ndim = p.shape.rank;
    for (int d = 0; d < p.shape.rank; ++d) t.shape.size[d] = p.shape.dims[d];
    t.kind = std::string(topologies::class_name(p.param_class));
    t.norm_group = p.grad_norm_group == GradNormGroup::mtp ? kMtpNorm : kMainNorm;
  }
  run.norm_groups = {record::NormGroup{"", true}};
  if (plan.has_mtp)
    run.norm_groups.push_back(
        {std::string(topologies::grad_norm_group_name(GradNormGroup::mtp)), true});
  run.p_values = options.p_values;
  for (int c = 0; c < static_cast<int>(plan.children.size()); ++c)
    run.children.push_back(child_name(plan, c));
}

}  // namespace

std::vector<Family> families_reduced_over(const OptimizerPlan& plan, const vocab::PathOptions& options) {
  const vocab::FaultSet& faults = options.faults;
  std::vector<Family> families;
  auto add = [&](Family family) {
    if (std::find(families.begin(), families.end(), family) == families.end()) families.push_back(family);
  };
  for (Family family : families_of_reduction(options)) add(family);
  for (const Child& child : plan.children) {
    add(child.stats_family);
    add(child.clip_family);
  }
  if (faults.has(vocab::Fault::average_local_norms_over_dp)) {
    add(Family::tp_pp);
    add(Family::dp_cp);
  }
  return families;
}

std::vector<int> all_ranks(const topologies::RankLayout& layout) {
  std::vector<int> ranks(layout.world());
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

PathResult run_path(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
                    const vocab::PathOptions& options, comm::Communicator& communicator,
                    std::span<const int> ranks, kernels::LocalStatsFn local_stats,
                    kernels::ClipScaleFn clip_scale) {
  PathResult result;
  result.plan = plan_optimizer(options.optimizer, model, options.faults);
  const OptimizerPlan& plan = result.plan;
  const std::vector<Unit> units = reduction_units(plan);
  record::RunRecord& run = result.record;
  run.world = layout.world();
  describe_run(model, options, plan, run);

  ParamGradients gradients = param_gradients(options.gradients, model);
  std::vector<RankState> states(ranks.size());
  // Where the gradients enter before Megatron's reduction, it runs first (its own phases), and each
  // rank reads what it left there; ranks left alike share one table of generators.
  std::set<std::vector<int>> rank_kinds{gradients.kind};
  std::vector<const std::vector<int>*> kinds_of(ranks.size(), &*rank_kinds.begin());
  ReducedGradients reduced;
  if (options.gradients.before_reduction) {
    reduced = reduce_gradients(model, layout, options, gradients.spec, communicator, ranks);
    const std::size_t first_list = gradients.distinct.size();
    for (const std::vector<double>& list : reduced.lists) {
      kernels::GeneratorSpec spec = options.gradients.generator;
      spec.stated = {kernels::StatedValues::Kind::listed, 0.0, list.data(), static_cast<std::int64_t>(list.size())};
      gradients.distinct.push_back(spec);
    }
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      std::vector<int> kinds = gradients.kind;
      for (std::size_t id = 0; id < kinds.size(); ++id)
        if (const int list = reduced.held[i][id]; list >= 0) kinds[id] = static_cast<int>(first_list) + list;
      kinds_of[i] = &*rank_kinds.insert(std::move(kinds)).first;
    }
  }
  HeldMemo held(model, layout, plan, options.faults);
  Ownership ownership;
  StatsMemo memo;
  record::LocalRecordPool pool;
  record::LocalRecord decisions;  // one rank's, before the pool shares it
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    states[i].rank = ranks[i];
    states[i].kinds = kinds_of[i];
    run_local_phase(model, layout, options, plan, units, gradients, communicator, local_stats, memo, pool,
                    states[i], held, ownership, decisions);
  }
  communicator.end_phase();
  if (options.faults.has(vocab::Fault::average_local_norms_over_dp)) {
    for (RankState& state : states) run_average_phase(layout, communicator, state);
    communicator.end_phase();
  }

  GroupRefs groups(layout, run.groups);
  ClipMemo clip_memo(model, plan, gradients, clip_scale);
  run.ranks.reserve(ranks.size());
  for (RankState& state : states) {
    run.ranks.push_back(
        combine(layout, plan, units, options, state, groups, clip_memo));
    state = RankState{};  // the reduced buffers are no longer needed
  }
  return result;
}

}  // namespace tally::gradnorm
