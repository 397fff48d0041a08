// How the CPU kernels walk a shard: its visited elements as runs of contiguous logical indices,
// in the box's row-major order (kernels/local_stats.h, "What is visited"). Shared by
// local_stats.cpp and clip_scale.cpp; internal to kernels/.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "kernels/local_stats.h"

namespace tally::kernels::detail {

// The descriptor with a scalar seen as a 1-D tensor of one element.
struct Box {
  int ndim = 1;
  std::array<std::int64_t, kMaxDims> shape{1, 1, 1, 1};
  std::array<std::int64_t, kMaxDims> offset{};
  std::array<std::int64_t, kMaxDims> extent{1, 1, 1, 1};
};

inline Box box_of(const ShardDesc& shard) {
  Box box;
  if (shard.ndim == 0) return box;
  box.ndim = shard.ndim;
  for (int d = 0; d < shard.ndim; ++d) {
    box.shape[d] = shard.shape[d];
    box.offset[d] = shard.offset[d];
    box.extent[d] = shard.extent[d];
  }
  return box;
}

inline ElementRange visited_range(const ShardDesc& shard) {
  return shard.range ? *shard.range : ElementRange{0, box_numel(shard)};
}

// Calls visit(first logical index, count) for each contiguous run of visited elements, in the
// box's row-major order. The shard must be valid.
template <class Visit>
void for_each_run(const ShardDesc& shard, Visit&& visit) {
  const Box box = box_of(shard);
  const int nd = box.ndim;
  const ElementRange range = visited_range(shard);
  if (range.begin >= range.end) return;
  std::array<std::int64_t, kMaxDims> stride{}, box_stride{}, index{};
  stride[nd - 1] = 1;
  box_stride[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; --d) {
    stride[d] = stride[d + 1] * box.shape[d + 1];
    box_stride[d] = box_stride[d + 1] * box.extent[d + 1];
  }
  for (int d = 0; d < nd; ++d) index[d] = (range.begin / box_stride[d]) % box.extent[d];
  std::int64_t remaining = range.end - range.begin;
  while (remaining > 0) {
    std::int64_t first = 0;
    for (int d = 0; d < nd; ++d) first += (box.offset[d] + index[d]) * stride[d];
    const std::int64_t count = std::min(box.extent[nd - 1] - index[nd - 1], remaining);
    visit(static_cast<std::uint64_t>(first), count);
    remaining -= count;
    index[nd - 1] += count;
    for (int d = nd - 1; d > 0 && index[d] == box.extent[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
    }
  }
}

// Calls fn.template operator()<M, D>() with the mode and dtype as template arguments, so an
// element loop is compiled once per (mode, dtype) and never switches per element.
template <class Fn>
void with_mode_and_dtype(GradientMode mode, Dtype dtype, Fn&& fn) {
  auto with_dtype = [&]<GradientMode M>() {
    switch (dtype) {
      case Dtype::fp32: return fn.template operator()<M, Dtype::fp32>();
      case Dtype::bf16: return fn.template operator()<M, Dtype::bf16>();
      case Dtype::fp16: return fn.template operator()<M, Dtype::fp16>();
    }
  };
  switch (mode) {
    case GradientMode::ones: return with_dtype.template operator()<GradientMode::ones>();
    case GradientMode::zeros: return with_dtype.template operator()<GradientMode::zeros>();
    case GradientMode::dyadic: return with_dtype.template operator()<GradientMode::dyadic>();
    case GradientMode::uniform: return with_dtype.template operator()<GradientMode::uniform>();
    case GradientMode::normal: return with_dtype.template operator()<GradientMode::normal>();
    case GradientMode::sparse: return with_dtype.template operator()<GradientMode::sparse>();
    case GradientMode::rank_encoded: return with_dtype.template operator()<GradientMode::rank_encoded>();
  }
}

}  // namespace tally::kernels::detail
