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

// Megatron-LM's distributed-optimizer buffer layout (megatron-core 0.16.1
// param_and_grad_buffer.py, 0.19.2 optimizer/param_layout.py and
// DistributedOptimizer._compute_per_buffer_param_layout): each param starts at a multiple of 64
// elements, a bucket ends at a multiple of lcm(D, 128) (pad_buckets_for_high_nccl_busbw off).
constexpr std::int64_t kParamStartAlignment = 64;
constexpr std::int64_t kBucketEndAlignment = 128;

std::int64_t padded_to(std::int64_t value, std::int64_t divisor) { return (value + divisor - 1) / divisor * divisor; }

// The rank's pieces of one buffer: `order` its params in buffer order (the model chunk's, last
// first), laid out and cut as Megatron-LM does. `bucket_elements` 0: no bucket closes by size.
void own_buffer(const std::vector<MainParam>& params, const std::vector<int>& order, DataParallelSlot slot,
                std::int64_t bucket_elements, bool overlap, Ownership& out) {
  const std::int64_t bucket_alignment = std::lcm(static_cast<std::int64_t>(slot.size), kBucketEndAlignment);
  std::int64_t bucket_start = 0;
  std::int64_t param_start = 0;
  std::vector<std::pair<int, std::int64_t>> bucket;  // (param, start in the buffer)
  auto close_bucket = [&](std::int64_t filled_to) {
    const std::int64_t bucket_end = padded_to(filled_to, bucket_alignment);
    const std::int64_t share = (bucket_end - bucket_start) / slot.size;
    const std::int64_t lo = bucket_start + share * slot.index;
    std::int64_t hi = lo + share;
    if (overlap && hi < bucket_end) ++hi;  // also the first element of the next rank's range
    std::int64_t held = 0;
    for (const auto& [index, start] : bucket) {
      const std::int64_t numel = params[index].attrs.slice.numel();
      const std::int64_t begin = std::max(lo, start), stop = std::min(hi, start + numel);
      if (begin < stop) {
        out.pieces.push_back({index, {begin - start, stop - start}});
        held += stop - begin;
      }
    }
    out.padding += (hi - lo) - held;
    bucket.clear();
    bucket_start = bucket_end;
    return bucket_end;
  };
  for (int index : order) {
    const bool own_bucket = params[index].attrs.shared_embedding;
    param_start = padded_to(param_start, kParamStartAlignment);
    if (own_bucket && !bucket.empty()) param_start = close_bucket(param_start);
    const std::int64_t param_end = param_start + params[index].attrs.slice.numel();
    bucket.emplace_back(index, param_start);
    if ((bucket_elements > 0 && param_end - bucket_start >= bucket_elements) || own_bucket)
      param_start = close_bucket(param_end);
    else
      param_start = param_end;
  }
  if (!bucket.empty()) close_bucket(param_start);
}

// One buffer per model chunk and domain (dense, expert-labelled), as each chunk has a DDP of its
// own. Buckets close by size only in the first chunk of the first stage: DDP gives later chunks
// (disable_bucketing) and later stages no bucket size.
void own_distributed(const std::vector<MainParam>& params, const topologies::RankLayout& layout,
                     int rank, const OwnershipOptions& options, const vocab::FaultSet& faults,
                     Ownership& out) {
  const bool overlap = faults.has(vocab::Fault::distopt_overlapping_shards);
  const bool first_stage = layout.coordinates(rank).pp == 0;
  for (int chunk = 0; chunk < layout.config().vpp; ++chunk) {
    for (bool expert : {false, true}) {
      std::vector<int> order;
      for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i)
        if (params[i].expert_label == expert && params[i].attrs.vpp_chunk == chunk) order.push_back(i);
      if (order.empty()) continue;
      const std::int64_t bucket_elements = first_stage && chunk == 0 ? options.bucket_elements : 0;
      own_buffer(params, order, data_parallel_slot(layout, rank, expert), bucket_elements, overlap, out);
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
