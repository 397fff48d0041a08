// Element `at` of a box (row-major in the box) as its row-major index in the logical tensor: the
// one index arithmetic of the oracle's readers of boxes (the truth of a range, the clipped check,
// a real run's held gradients).
#pragma once

#include <cstdint>

#include "record/run_record.h"

namespace tally::oracle::detail {

// `sizes`: the logical tensor's dims 0 .. ndim-1 (record::Extents::size, topologies::Shape::dims).
template <class Sizes>
std::uint64_t logical_index(int ndim, const Sizes& sizes, const record::Box& box, std::int64_t at) {
  std::uint64_t logical = 0;
  std::int64_t stride = 1;
  for (int d = ndim; d-- > 0;) {
    logical += static_cast<std::uint64_t>((box.offset[d] + at % box.extent.size[d]) * stride);
    at /= box.extent.size[d];
    stride *= sizes[d];
  }
  return logical;
}

}  // namespace tally::oracle::detail
