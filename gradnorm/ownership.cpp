#include "gradnorm/ownership.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace tally::gradnorm {

namespace {

using topologies::Family;

// The rank's index and the size of its intra-instance data-parallel group for one buffer.
struct DataParallelSlot {
  int index = 0;
  int size = 1;
};

DataParallelSlot data_parallel_slot(const topologies::RankLayout& layout, int rank, bool expert) {
  const Family family = expert ? Family::expt_dp : Family::dp_cp;
  const int full = static_cast<int>(layout.group_ranks(family, rank).size());
  const int size = full / layout.config().dist_opt_instances;
  return {layout.index_in(family, rank) % size, size};
}

void own_distributed(const std::vector<MainParam>& params, const topologies::RankLayout& layout,
                     int rank, const OwnershipOptions& options, const vocab::FaultSet& faults,
                     Ownership& out) {
  const bool overlap = faults.has(vocab::Fault::distopt_overlapping_shards);
  for (bool expert : {false, true}) {
    const DataParallelSlot slot = data_parallel_slot(layout, rank, expert);
    // Backward order: the buffer holds the last param first.
    std::vector<int> order;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i)
      if (params[i].expert_label == expert) order.push_back(i);
    std::size_t next = 0;
    while (next < order.size()) {
      // One bucket: params [next, end) at offsets within the bucket.
      std::vector<std::int64_t> starts;
      std::int64_t filled = 0;
      std::size_t end = next;
      while (end < order.size()) {
        starts.push_back(filled);
        filled += params[order[end]].attrs.slice.numel();
        ++end;
        if (options.bucket_elements > 0 && filled >= options.bucket_elements) break;
      }
      const std::int64_t padded = (filled + slot.size - 1) / slot.size * slot.size;
      const std::int64_t share = padded / slot.size;
      const std::int64_t lo = share * slot.index;
      std::int64_t hi = lo + share;
      if (overlap && hi < padded) ++hi;  // also the first element of the next rank's range
      for (std::size_t k = next; k < end; ++k) {
        const std::int64_t start = starts[k - next];
        const std::int64_t numel = params[order[k]].attrs.slice.numel();
        const std::int64_t begin = std::max(lo, start), stop = std::min(hi, start + numel);
        if (begin < stop)
          out.pieces.push_back({order[k], {begin - start, stop - start}});
      }
      out.padding += std::max<std::int64_t>(0, hi - std::max(lo, filled));
      next = end;
    }
  }
  std::sort(out.pieces.begin(), out.pieces.end(),
            [](const OwnedPiece& a, const OwnedPiece& b) { return a.local_index < b.local_index; });
}

// Where a param stands in the param groups the layer-wise optimizer deals from: its children's
// groups in order, Muon's (the 2-D weights but embeddings and output layer), then Adam's with weight
// decay (those), then Adam's without (1-D params: biases, norms). megatron-core 0.16.1 and 0.19.2
// route params so (_is_nonlinear_or_embedding; the standard overrides' wd_mult 0) and order groups
// so (_get_param_groups: no override first).
int layer_wise_group(const MainParam& p) {
  if (p.attrs.slice.rank == 2) return p.attrs.embedding_or_output ? 1 : 0;
  return p.attrs.slice.rank == 1 ? 2 : 1;
}

// LayerWiseDistributedOptimizer._shard_params_ping_pong: the params of the groups in order, sorted
// by local size, smallest first (stable), dealt to the data-parallel ranks along 0..n-1, n-1..0,
// 0..n-1, ...; dense and expert params each over their own group (DP x CP, EDP).
void own_layer_wise(const std::vector<MainParam>& params, const topologies::RankLayout& layout,
                    int rank, const vocab::FaultSet& faults, Ownership& out) {
  // layer-wise-unsharded-at-dp-cp-1: the releases return before sharding, experts included.
  if (faults.has(vocab::Fault::layer_wise_unsharded_at_dp_cp_1) && layout.group_ranks(Family::dp_cp, rank).size() == 1) {
    for (int i = 0; i < static_cast<int>(params.size()); ++i)
      out.pieces.push_back({i, {0, params[i].attrs.slice.numel()}});
    return;
  }
  for (bool expert : {false, true}) {
    const DataParallelSlot slot = [&] {
      // Layer-wise ownership spans the full data-parallel group.
      const Family family = expert ? Family::expt_dp : Family::dp_cp;
      return DataParallelSlot{layout.index_in(family, rank),
                              static_cast<int>(layout.group_ranks(family, rank).size())};
    }();
    std::vector<int> order;
    for (int i = 0; i < static_cast<int>(params.size()); ++i)
      if (params[i].expert_label == expert) order.push_back(i);
    // By size, then by group; model order among equals (a stable sort).
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return std::pair(params[a].attrs.slice.numel(), layer_wise_group(params[a])) <
             std::pair(params[b].attrs.slice.numel(), layer_wise_group(params[b]));
    });
    for (std::size_t k = 0; k < order.size(); ++k) {
      const std::size_t round = k / slot.size, within = k % slot.size;
      const std::size_t owner = round % 2 == 0 ? within : slot.size - 1 - within;
      if (static_cast<int>(owner) == slot.index)
        out.pieces.push_back({order[k], {0, params[order[k]].attrs.slice.numel()}});
    }
  }
  std::sort(out.pieces.begin(), out.pieces.end(),
            [](const OwnedPiece& a, const OwnedPiece& b) { return a.local_index < b.local_index; });
}

}  // namespace

void own_elements(vocab::OptimizerModel model, const std::vector<MainParam>& params,
                  const topologies::RankLayout& layout, int rank, const OwnershipOptions& options,
                  const vocab::FaultSet& faults, Ownership& out) {
  out.pieces.clear();
  out.padding = 0;
  switch (model) {
    case vocab::OptimizerModel::plain:
    case vocab::OptimizerModel::muon:
      for (int i = 0; i < static_cast<int>(params.size()); ++i)
        out.pieces.push_back({i, {0, params[i].attrs.slice.numel()}});
      return;
    case vocab::OptimizerModel::distributed:
      own_distributed(params, layout, rank, options, faults, out);
      return;
    case vocab::OptimizerModel::layerwise:
      own_layer_wise(params, layout, rank, faults, out);
      return;
  }
}

}  // namespace tally::gradnorm
