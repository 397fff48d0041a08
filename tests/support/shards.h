// Shard descriptors for the kernels' tests, written as a tensor's shape and a box of it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/local_stats.h"

namespace tally::testing {

// The box `offset` + `extent` of a tensor of `shape` (one entry per dimension; none: a scalar),
// narrowed to `range` of its row-major elements when given.
inline kernels::ShardDesc box(std::uint64_t param, std::vector<std::int64_t> shape,
                              std::vector<std::int64_t> offset, std::vector<std::int64_t> extent,
                              std::optional<kernels::ElementRange> range = std::nullopt) {
  kernels::ShardDesc shard;
  shard.param_id = param;
  shard.ndim = static_cast<int>(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    shard.shape[d] = shape[d];
    shard.offset[d] = offset[d];
    shard.extent[d] = extent[d];
  }
  shard.range = range;
  return shard;
}

}  // namespace tally::testing
