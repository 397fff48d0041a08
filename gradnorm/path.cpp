#include "gradnorm/path.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numeric>
#include <unordered_map>

#include "topologies/sharding.h"

namespace tally::gradnorm {

namespace {

using topologies::Family;
using topologies::GradNormGroup;

// Payload of one reduction unit (one child, or every child when they share a group).
enum SumSlot : int { kSquares = 0, kSquaresMtp, kSqrtOfLocal, kZerosAsFloat, kFirstPSum };
enum MaxSlot : int { kAbsMax = 0, kAbsMaxMtp, kMaxSlots };

struct Unit {
  std::vector<int> children;  // plan children reduced together
  Family family = Family::world;
};

std::vector<Unit> reduction_units(const OptimizerPlan& plan) {
  std::vector<Unit> units;
  if (plan.shared_stats) {
    Unit unit;
    unit.family = plan.children[0].stats_family;
    for (int c = 0; c < static_cast<int>(plan.children.size()); ++c) unit.children.push_back(c);
    units.push_back(unit);
  } else {
    for (int c = 0; c < static_cast<int>(plan.children.size()); ++c)
      units.push_back(Unit{{c}, plan.children[c].stats_family});
  }
  return units;
}

struct UnitState {
  comm::Group group;
  bool joined = false;
  std::vector<double> sums;
  std::vector<double> maxima;
  std::vector<std::int64_t> counts;  // [zeros, ledger of each child in unit order...]
};

// Local statistics are a pure function of (shards, generator, options): the data-parallel
// replicas of a rank hold identical shards, so the in-process backend computes them once.
class StatsMemo {
 public:
  const kernels::Stats& get(std::span<const kernels::ShardDesc> shards,
                            const kernels::GeneratorSpec& gen, const kernels::StatsOptions& options,
                            kernels::LocalStatsFn local_stats) {
    key_.clear();
    key_.push_back(static_cast<std::int64_t>(gen.mode));
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
    if (fresh) entry->second = local_stats(shards, gen, options).total;
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

struct RankState {
  int rank = 0;
  std::vector<UnitState> units;
};

// Offsets of each child's ledger inside its unit's counts (after the zero count).
std::vector<int> ledger_offsets(const OptimizerPlan& plan, const std::vector<Unit>& units) {
  std::vector<int> offset(plan.children.size());
  for (const Unit& unit : units) {
    int at = 1;
    for (int c : unit.children) {
      offset[c] = at;
      at += plan.params_per_child[c];
    }
  }
  return offset;
}

void run_local_phase(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
                     const PathOptions& options, const OptimizerPlan& plan,
                     const std::vector<Unit>& units, const std::vector<int>& ledger_offset,
                     comm::Communicator& communicator, kernels::LocalStatsFn local_stats,
                     StatsMemo& memo, RankState& state, std::vector<topologies::LocalParam>& local,
                     std::vector<MainParam>& main, Ownership& ownership) {
  const FaultSet& faults = options.faults;
  const int rank = state.rank;
  topologies::local_params(model, layout, rank, local);
  make_main_params(local, plan, faults, main);
  own_elements(options.optimizer, main, layout, rank, {options.bucket_elements}, faults,
               ownership);

  const int unit_of_child_count = static_cast<int>(plan.children.size());
  std::vector<int> unit_of_child(unit_of_child_count);
  for (int u = 0; u < static_cast<int>(units.size()); ++u)
    for (int c : units[u].children) unit_of_child[c] = u;

  const std::size_t p_count = options.p_values.size();
  // Per unit and per statistic group: shards whose class has generated gradients, and shards
  // whose gradients are all zero.
  enum Bin : int { kMain = 0, kMtp, kUncounted, kBins };
  std::vector<std::array<std::array<std::vector<kernels::ShardDesc>, 2>, kBins>> shards(units.size());
  state.units.resize(units.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    UnitState& unit = state.units[u];
    int length = 1;
    for (int c : units[u].children) length += plan.params_per_child[c];
    unit.counts.assign(static_cast<std::size_t>(length), 0);
    unit.sums.assign(kFirstPSum + p_count, 0.0);
    unit.maxima.assign(kMaxSlots, 0.0);
    unit.group = comm::group_of(layout, units[u].family, rank);
  }

  for (const OwnedPiece& piece : ownership.pieces) {
    const MainParam& param = main[piece.local_index];
    if (!rule_keeps(filter_rule(param, layout, rank, faults))) continue;
    const topologies::LogicalParam& logical = model.param(param.attrs.logical_id);
    const int u = unit_of_child[param.child];
    const kernels::ShardDesc shard = shard_desc(logical, param.attrs, piece.range);
    const int generated = (options.gradients.class_mask & class_bit(logical.param_class)) ? 0 : 1;
    const NormShare share = norm_share(plan, param, logical, faults);
    if (share == NormShare::zeros_only) {
      shards[u][kUncounted][generated].push_back(shard);  // still in the zero count
      continue;
    }
    shards[u][share == NormShare::mtp ? kMtp : kMain][generated].push_back(shard);
    state.units[u].counts[ledger_offset[param.child] + plan.slot_of_param[logical.id]] +=
        piece.range.end - piece.range.begin;
  }

  kernels::StatsOptions stats_options;
  stats_options.accumulation = options.accumulation;
  stats_options.p_values = options.p_values;
  kernels::StatsOptions mtp_options;
  mtp_options.accumulation = options.accumulation;
  kernels::GeneratorSpec zero = options.gradients.generator;
  zero.mode = kernels::GradientMode::zeros;
  const kernels::GeneratorSpec gens[2] = {options.gradients.generator, zero};
  // Local statistics of one bin: the generated shards, then the all-zero ones.
  auto stats_of = [&](const std::array<std::vector<kernels::ShardDesc>, 2>& bin,
                      const kernels::StatsOptions& bin_options) {
    kernels::Stats total = memo.get(bin[0], gens[0], bin_options, local_stats);
    if (!bin[1].empty()) {
      const kernels::Stats& zeros = memo.get(bin[1], gens[1], bin_options, local_stats);
      total.zeros += zeros.zeros;
      total.elements += zeros.elements;
    }
    return total;
  };
  for (std::size_t u = 0; u < units.size(); ++u) {
    UnitState& unit = state.units[u];
    const kernels::Stats main_stats = stats_of(shards[u][kMain], stats_options);
    const kernels::Stats mtp_stats = stats_of(shards[u][kMtp], mtp_options);
    const kernels::Stats uncounted = stats_of(shards[u][kUncounted], mtp_options);
    std::int64_t zeros = main_stats.zeros + mtp_stats.zeros + uncounted.zeros;
    if (faults.has(Fault::distopt_padding_counted) && u == 0) zeros += ownership.padding;
    unit.sums[kSquares] = main_stats.sum_squares;
    unit.sums[kSquaresMtp] = mtp_stats.sum_squares;
    unit.sums[kSqrtOfLocal] = std::sqrt(main_stats.sum_squares);
    unit.sums[kZerosAsFloat] = static_cast<float>(zeros);
    for (std::size_t i = 0; i < p_count; ++i) unit.sums[kFirstPSum + i] = main_stats.p_sums[i];
    unit.maxima[kAbsMax] = main_stats.abs_max;
    unit.maxima[kAbsMaxMtp] = mtp_stats.abs_max;
    unit.counts[0] = zeros;

    // #5530: a rank with no gradients returned before the collective.
    bool empty = true;
    for (const auto& bin : shards[u]) empty = empty && bin[0].empty() && bin[1].empty();
    if (faults.has(Fault::empty_rank_skips_collective) && empty) continue;
    unit.joined = true;
    communicator.all_reduce(rank, unit.group, unit.sums, comm::ReduceOp::sum, "grad-norm sums");
    communicator.all_reduce(rank, unit.group, unit.maxima, comm::ReduceOp::max, "grad-norm max");
    communicator.all_reduce(rank, unit.group, unit.counts, comm::ReduceOp::sum,
                            "zero count and ledger");
  }
}

double clip_coefficient(double max_norm, double norm) {
  if (max_norm <= 0.0) return 1.0;
  const double coefficient = max_norm / (norm + 1e-6);
  return coefficient < 1.0 ? coefficient : 1.0;
}

RankResult combine(const OptimizerPlan& plan, const std::vector<Unit>& units,
                   const std::vector<int>& ledger_offset, const PathOptions& options,
                   const topologies::LogicalModel& model, const RankState& state,
                   std::map<std::vector<std::int64_t>, std::shared_ptr<const std::vector<std::int64_t>>>&
                       ledgers) {
  const FaultSet& faults = options.faults;
  RankResult result;
  result.rank = state.rank;
  result.children.resize(plan.children.size());
  double squares = 0.0, squares_mtp = 0.0, inf = 0.0, inf_l2 = 0.0;
  float zeros_float = 0.0f;
  std::vector<double> p_sums(options.p_values.size(), 0.0);
  std::vector<double> unit_norm(units.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    const UnitState& unit = state.units[u];
    const double size = static_cast<double>(unit.group.ranks.size());
    // DeepSpeed #8475: the mean of per-rank norms, not the root of the summed squares.
    const double own = faults.has(Fault::average_rank_norms) ? unit.sums[kSqrtOfLocal] / size
                                                             : std::sqrt(unit.sums[kSquares]);
    unit_norm[u] = own;
    squares += faults.has(Fault::average_rank_norms) ? own * own : unit.sums[kSquares];
    squares_mtp += unit.sums[kSquaresMtp];
    inf = std::max(inf, unit.maxima[kAbsMax]);
    inf_l2 += unit.maxima[kAbsMax] * unit.maxima[kAbsMax];
    result.zeros += unit.counts[0];
    zeros_float += static_cast<float>(unit.sums[kZerosAsFloat]);
    for (std::size_t i = 0; i < p_sums.size(); ++i) p_sums[i] += unit.sums[kFirstPSum + i];
  }
  result.norm = std::sqrt(squares);
  result.mtp_norm = std::sqrt(squares_mtp);
  result.inf_norm = faults.has(Fault::inf_norm_combined_by_l2) && units.size() > 1
                        ? std::sqrt(inf_l2)
                        : inf;
  if (faults.has(Fault::zero_count_in_float32))
    result.zeros = static_cast<std::int64_t>(zeros_float);
  for (std::size_t i = 0; i < p_sums.size(); ++i)
    result.p_norms.push_back(std::pow(p_sums[i], 1.0 / options.p_values[i]));
  result.clip_coefficient = clip_coefficient(options.max_norm, result.norm);
  result.mtp_clip_coefficient = plan.has_mtp ? clip_coefficient(options.max_norm, result.mtp_norm) : 1.0;

  std::vector<std::int64_t> key;
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (int c : units[u].children) {
      ChildOutcome& child = result.children[c];
      child.group = state.units[u].group.id;
      child.norm = unit_norm[u];
      // #785: each child clipped with its own norm.
      child.clip_coefficient = faults.has(Fault::clip_per_child_norm)
                                   ? clip_coefficient(options.max_norm, unit_norm[u])
                                   : result.clip_coefficient;
    }
    key.push_back(static_cast<std::int64_t>(state.units[u].group.id.family));
    key.push_back(state.units[u].group.id.index);
  }
  std::shared_ptr<const std::vector<std::int64_t>>& ledger = ledgers[key];
  if (!ledger) {
    auto combined = std::make_shared<std::vector<std::int64_t>>(model.size(), 0);
    for (const topologies::LogicalParam& p : model.params()) {
      const int c = plan.child_of_param[p.id];
      int u = 0;
      while (std::find(units[u].children.begin(), units[u].children.end(), c) ==
             units[u].children.end())
        ++u;
      (*combined)[p.id] = state.units[u].counts[ledger_offset[c] + plan.slot_of_param[p.id]];
    }
    ledger = std::move(combined);
  }
  result.ledger = ledger;
  return result;
}

}  // namespace

kernels::ShardDesc shard_desc(const topologies::LogicalParam& logical,
                              const topologies::LocalParam& local, kernels::ElementRange range) {
  kernels::ShardDesc shard;
  shard.param_id = static_cast<std::uint64_t>(logical.id);
  shard.ndim = logical.shape.rank;
  for (int d = 0; d < logical.shape.rank; ++d) {
    shard.shape[d] = logical.shape.dims[d];
    shard.offset[d] = local.slice.offset[d];
    shard.extent[d] = local.slice.extent[d];
  }
  if (range.begin != 0 || range.end != local.slice.numel()) shard.range = range;
  return shard;
}

NormShare norm_share(const OptimizerPlan& plan, const MainParam& param,
                     const topologies::LogicalParam& logical, const FaultSet& faults) {
  // DeepSpeed #8613: the expert child's norm is computed, then discarded.
  if (faults.has(Fault::expert_norm_dropped) && plan.children[param.child].expert)
    return NormShare::zeros_only;
  return logical.grad_norm_group == GradNormGroup::mtp ? NormShare::mtp : NormShare::main;
}

std::vector<int> all_ranks(const topologies::RankLayout& layout) {
  std::vector<int> ranks(layout.world());
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

PathResult run_path(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
                    const PathOptions& options, comm::Communicator& communicator,
                    std::span<const int> ranks, kernels::LocalStatsFn local_stats) {
  PathResult result;
  result.plan = plan_optimizer(options.optimizer, model, options.faults);
  const OptimizerPlan& plan = result.plan;
  const std::vector<Unit> units = reduction_units(plan);
  const std::vector<int> ledger_offset = ledger_offsets(plan, units);

  std::vector<RankState> states(ranks.size());
  std::vector<topologies::LocalParam> local;
  std::vector<MainParam> main;
  Ownership ownership;
  StatsMemo memo;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    states[i].rank = ranks[i];
    run_local_phase(model, layout, options, plan, units, ledger_offset, communicator, local_stats,
                    memo, states[i], local, main, ownership);
  }
  communicator.end_phase();

  std::map<std::vector<std::int64_t>, std::shared_ptr<const std::vector<std::int64_t>>> ledgers;
  result.ranks.reserve(ranks.size());
  for (RankState& state : states) {
    result.ranks.push_back(combine(plan, units, ledger_offset, options, model, state, ledgers));
    state = RankState{};  // the reduced buffers are no longer needed
  }
  return result;
}

std::vector<ParamOnRank> explain_param(const topologies::LogicalModel& model,
                                       const topologies::RankLayout& layout,
                                       const PathOptions& options, const OptimizerPlan& plan,
                                       int rank, int logical_id) {
  std::vector<topologies::LocalParam> local;
  std::vector<MainParam> main;
  Ownership ownership;
  topologies::local_params(model, layout, rank, local);
  make_main_params(local, plan, options.faults, main);
  own_elements(options.optimizer, main, layout, rank, {options.bucket_elements}, options.faults,
               ownership);
  std::vector<ParamOnRank> out;
  for (int i = 0; i < static_cast<int>(main.size()); ++i) {
    const MainParam& param = main[i];
    if (param.attrs.logical_id != logical_id) continue;
    ParamOnRank on;
    on.rank = rank;
    on.child = param.child;
    on.held = param.attrs.slice.numel();
    on.rule = filter_rule(param, layout, rank, options.faults);
    on.shared_copy = param.attrs.copy != topologies::SharedCopy::none;
    for (const OwnedPiece& piece : ownership.pieces)
      if (piece.local_index == i) on.owned += piece.range.end - piece.range.begin;
    const bool dropped_child = norm_share(plan, param, model.param(logical_id), options.faults) ==
                               NormShare::zeros_only;
    on.counted = rule_keeps(on.rule) && !dropped_child ? on.owned : 0;
    out.push_back(on);
  }
  return out;
}

double applied_clip(const RankResult& result, const OptimizerPlan& plan,
                    const topologies::LogicalModel& model, int logical_id) {
  if (model.param(logical_id).grad_norm_group == GradNormGroup::mtp)
    return result.mtp_clip_coefficient;
  return result.children[plan.child_of_param[logical_id]].clip_coefficient;
}

}  // namespace tally::gradnorm
