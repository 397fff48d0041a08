#include "gradnorm/reduction.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "kernels/shares.h"
#include "topologies/sharding.h"

namespace tally::gradnorm {

namespace {

using topologies::Family;

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

bool qk_layernorm(const topologies::LogicalParam& param) {
  return param.name.find(".q_layernorm.") != std::string::npos || param.name.find(".k_layernorm.") != std::string::npos;
}

// The families a rank issues its all-reduces on, in this order in every phase: every member of a group
// then issues the same collectives in the same order.
constexpr Family kReductionFamilies[] = {Family::dp_cp, Family::expt_dp, Family::embedding, Family::tp};

int position_in(std::span<const int> group, int rank) {
  return static_cast<int>(std::find(group.begin(), group.end(), rank) - group.begin());
}

// The logical row-major index of each element of `slice`, in the slice's own row-major order.
std::vector<std::int64_t> element_indices(const topologies::LogicalParam& logical, const topologies::Slice& slice) {
  const int ndim = logical.shape.rank;
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(slice.numel()));
  std::array<std::int64_t, topologies::kMaxDims> at{};
  const std::int64_t n = slice.numel();
  for (std::int64_t v = 0; v < n; ++v) {
    std::int64_t index = 0;
    for (int d = 0; d < ndim; ++d) index = index * logical.shape.dims[d] + slice.offset[d] + at[d];
    out.push_back(index);
    for (int d = ndim - 1; d >= 0; --d) {
      if (++at[d] < slice.extent[d]) break;
      at[d] = 0;
    }
  }
  return out;
}

// The shares every rank of a deal gives of one box's elements, each element dealt once however many
// ranks hold the box: [element * ranks + rank's index in the deal].
class ShareMemo {
 public:
  const std::vector<double>& of(const topologies::LogicalParam& logical, const topologies::Slice& slice,
                                const std::vector<std::int64_t>& elements, const kernels::GeneratorSpec& gen,
                                int deal_ranks, int divisor) {
    auto [it, fresh] = memo_.try_emplace(std::make_tuple(logical.id, slice.offset, slice.extent, deal_ranks));
    if (!fresh) return it->second;
    std::vector<double>& shares = it->second;
    shares.reserve(elements.size() * static_cast<std::size_t>(deal_ranks));
    const std::uint64_t id = static_cast<std::uint64_t>(logical.id);
    for (std::int64_t e : elements) {
      const double total = static_cast<double>(kernels::gradient_value(gen, id, static_cast<std::uint64_t>(e))) * divisor;
      if (deal_ranks == 1) {  // a group of one gives the whole
        shares.push_back(total);
        continue;
      }
      const kernels::GroupShares dealt = kernels::deal_group_shares(total, deal_ranks, gen.dtype);
      shares.insert(shares.end(), dealt.shares.begin(), dealt.shares.end());
    }
    return shares;
  }

 private:
  using Key = std::tuple<int, std::array<std::int64_t, topologies::kMaxDims>,
                         std::array<std::int64_t, topologies::kMaxDims>, int>;
  std::map<Key, std::vector<double>> memo_;
};

// What a rank holds, with each param's elements: a function of its TP, ETP, EP, PP and GTP
// positions (topologies/sharding.h), so computed once per position.
struct HeldParams {
  std::vector<topologies::LocalParam> local;
  std::vector<std::vector<std::int64_t>> elements;
};

class HeldByPosition {
 public:
  HeldByPosition(const topologies::LogicalModel& model, const topologies::RankLayout& layout)
      : model_(model), layout_(layout) {}
  const HeldParams& of(int rank) {
    const topologies::Coordinates at = layout_.coordinates(rank);
    auto [it, fresh] = memo_.try_emplace({at.tp, at.etp, at.ep, at.pp, at.gtp, at.egtp});
    if (fresh) {
      topologies::local_params(model_, layout_, rank, it->second.local);
      for (const topologies::LocalParam& param : it->second.local)
        it->second.elements.push_back(element_indices(model_.param(param.logical_id), param.slice));
    }
    return it->second;
  }

 private:
  const topologies::LogicalModel& model_;
  const topologies::RankLayout& layout_;
  std::map<std::array<int, 6>, HeldParams> memo_;
};

// One param of one rank on its way through the reduction.
struct Reducing {
  int logical_id = 0;
  const std::vector<std::int64_t>* elements = nullptr;
  std::vector<Family> steps;
  std::vector<double> values;
};

// `allreduce`: the param is reduced over DP x CP (Megatron's attribute), else over its expert-DP group.
std::vector<Family> steps_of(bool allreduce, const topologies::LogicalParam& logical,
                             const topologies::ParallelConfig& config, const vocab::FaultSet& faults) {
  using vocab::Fault;
  std::vector<Family> steps = {allreduce ? Family::dp_cp : Family::expt_dp};
  if (logical.tied && config.pp > 1) {
    if (!faults.has(Fault::tied_embedding_not_synced)) steps.push_back(Family::embedding);
    if (faults.has(Fault::tied_embedding_synced_twice)) steps.push_back(Family::embedding);
  } else if (qk_layernorm(logical) && config.tp > 1) {
    if (!faults.has(Fault::tp_replicated_grads_not_summed)) steps.push_back(Family::tp);
    if (faults.has(Fault::tp_replicated_grads_summed_twice)) steps.push_back(Family::tp);
  }
  return steps;
}

}  // namespace

std::optional<std::string> reduction_refusal(const topologies::ParallelConfig& config) {
  if (topologies::uses_gtp(config))
    return "gradients.enter before_reduction with topology.gtp/egtp: tally's model of the reduction has no "
           "generalized-TP groups";
  const int dp_cp = config.world / (std::max(1, config.tp) * std::max(1, config.pp));
  if (!power_of_two(dp_cp))
    return "gradients.enter before_reduction at DP x CP " + std::to_string(dp_cp) +
           ": megatron-core multiplies each rank's share by 1/" + std::to_string(dp_cp) +
           " before it sums them (distributed_data_parallel.py:206-213, param_and_grad_buffer.py:656-661 at "
           "0.19.2), which rounds, so exact shares exist only where DP x CP is a power of two";
  return std::nullopt;
}

std::vector<Family> reduction_steps(const topologies::LogicalParam& param, const topologies::ParallelConfig& config,
                                    const vocab::FaultSet& faults) {
  const bool allreduce = !topologies::is_expert_class(param.param_class) ||
                         !topologies::expert_topology({config.tp, config.etp, config.ep, config.pp, config.vpp,
                                                       config.gtp, config.egtp});
  return steps_of(allreduce, param, config, faults);
}

std::vector<Family> families_of_reduction(const vocab::PathOptions& options) {
  if (!options.gradients.before_reduction) return {};
  return {std::begin(kReductionFamilies), std::end(kReductionFamilies)};
}

ReducedGradients reduce_gradients(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
                                  const vocab::PathOptions& options,
                                  std::span<const kernels::GeneratorSpec> generators,
                                  comm::Communicator& communicator, std::span<const int> ranks) {
  using vocab::Fault;
  const topologies::ParallelConfig& config = layout.config();
  const vocab::FaultSet& faults = options.faults;
  ShareMemo memo;
  HeldByPosition held_by_position(model, layout);
  std::vector<std::vector<Reducing>> reducing(ranks.size());
  std::size_t phases = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int rank = ranks[i];
    const int dp_cp = static_cast<int>(layout.group_ranks(Family::dp_cp, rank).size());
    const int edp = static_cast<int>(layout.group_ranks(Family::expt_dp, rank).size());
    const HeldParams& held = held_by_position.of(rank);
    for (std::size_t p = 0; p < held.local.size(); ++p) {
      const topologies::LocalParam& param = held.local[p];
      const topologies::LogicalParam& logical = model.param(param.logical_id);
      Reducing r;
      r.logical_id = param.logical_id;
      r.elements = &held.elements[p];
      r.steps = steps_of(param.allreduce, logical, config, faults);
      // The deal is the right reduction's: its groups, in its order, make each rank's index. An expert's
      // right group is its expert-DP group even where Megatron's size rule treats it as dense (EP 1,
      // ETP = TP): there the two groups hold the same ranks in Megatron-LM's orders, and only a release
      // that reduces it over the dense group in another order mixes shards, as it does on the real run,
      // whose worker deals by the param's class too (tally_adapters/megatron/reduction.py placement).
      int deal_ranks = 1, index = 0;
      for (Family family : steps_of(!topologies::is_expert_class(logical.param_class), logical, config, {})) {
        const std::span<const int> group = layout.group_ranks(family, rank);
        index += position_in(group, rank) * deal_ranks;
        deal_ranks *= static_cast<int>(group.size());
      }
      const std::vector<double>& shares =
          memo.of(logical, param.slice, *r.elements, generators[static_cast<std::size_t>(logical.id)], deal_ranks, dp_cp);
      // megatron-core scales every share by 1/|DP x CP| before the sum, experts' too.
      double scale = 1.0 / dp_cp;
      if (faults.has(Fault::grads_not_averaged)) scale = 1.0;
      if (faults.has(Fault::expert_grads_averaged_over_edp) && !param.allreduce) scale = 1.0 / edp;
      r.values.reserve(r.elements->size());
      for (std::size_t e = 0; e < r.elements->size(); ++e)
        r.values.push_back(shares[e * static_cast<std::size_t>(deal_ranks) + static_cast<std::size_t>(index)] * scale);
      phases = std::max(phases, r.steps.size());
      reducing[i].push_back(std::move(r));
    }
  }
  // Phase k: each rank sums, over each family, every param whose k-th step it is, in one buffer.
  std::vector<std::vector<std::vector<double>>> buffers(ranks.size());
  for (std::size_t k = 0; k < phases; ++k) {
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      buffers[i].assign(std::size(kReductionFamilies), {});
      for (std::size_t f = 0; f < std::size(kReductionFamilies); ++f) {
        std::vector<double>& buffer = buffers[i][f];
        for (const Reducing& r : reducing[i])
          if (k < r.steps.size() && r.steps[k] == kReductionFamilies[f])
            buffer.insert(buffer.end(), r.values.begin(), r.values.end());
        if (buffer.empty()) continue;
        communicator.all_reduce(ranks[i], comm::group_of(layout, kReductionFamilies[f], ranks[i]), buffer,
                                comm::ReduceOp::sum, "gradient reduction");
      }
    }
    communicator.end_phase();
    for (std::size_t i = 0; i < ranks.size(); ++i)
      for (std::size_t f = 0; f < std::size(kReductionFamilies); ++f) {
        std::size_t at = 0;
        for (Reducing& r : reducing[i])
          if (k < r.steps.size() && r.steps[k] == kReductionFamilies[f]) {
            std::copy_n(buffers[i][f].begin() + static_cast<std::ptrdiff_t>(at), r.values.size(), r.values.begin());
            at += r.values.size();
          }
      }
  }
  // What each rank holds: the case's own values where the reduction gave them back exactly.
  ReducedGradients out;
  out.held.assign(ranks.size(), std::vector<int>(static_cast<std::size_t>(model.size()), -1));
  std::map<std::vector<double>, int> interned;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int dp_cp = static_cast<int>(layout.group_ranks(Family::dp_cp, ranks[i]).size());
    for (Reducing& r : reducing[i]) {
      const kernels::GeneratorSpec& gen = generators[static_cast<std::size_t>(r.logical_id)];
      const std::uint64_t id = static_cast<std::uint64_t>(r.logical_id);
      const std::vector<std::int64_t>& elements = *r.elements;
      bool same = true;
      for (std::size_t e = 0; e < elements.size(); ++e) {
        if (faults.has(Fault::grads_averaged_twice)) r.values[e] /= dp_cp;
        same = same && kernels::round_to(r.values[e], gen.dtype) ==
                           kernels::gradient_value(gen, id, static_cast<std::uint64_t>(elements[e]));
      }
      if (same) continue;
      std::vector<double> list(static_cast<std::size_t>(model.param(r.logical_id).numel), 0.0);
      for (std::size_t e = 0; e < elements.size(); ++e) list[static_cast<std::size_t>(elements[e])] = r.values[e];
      auto [it, fresh] = interned.try_emplace(std::move(list), static_cast<int>(out.lists.size()));
      if (fresh) out.lists.push_back(it->first);
      out.held[i][static_cast<std::size_t>(r.logical_id)] = it->second;
    }
  }
  return out;
}

}  // namespace tally::gradnorm
