#include "oracle/shard_check.h"

#include <unsupported/Eigen/CXX11/Tensor>

#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <sstream>
#include <vector>

#include "oracle/ground_truth.h"  // kTruthBlock

namespace tally::oracle {
namespace {

using topologies::kMaxDims;
using topologies::LogicalModel;
using topologies::LogicalParam;
using Dims = std::array<std::int64_t, kMaxDims>;

constexpr float kNoElement = std::numeric_limits<float>::quiet_NaN();

// What one rank reads: box elements [begin, end) of the box (offset, extent), flattened with the
// strides of `shape` (the shape the rank believes the logical tensor has).
struct Reads {
  std::uint64_t param = 0;
  int ndim = 0;
  Dims shape{}, offset{}, extent{};
  bool whole_box = true;  // no explicit range: [0, box size)
  std::int64_t begin = 0, end = 0;
};

std::int64_t saturating_mul(std::int64_t a, std::int64_t b) {
  if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a)
    return std::numeric_limits<std::int64_t>::max();
  return a * b;
}

// Row-major strides of a box (saturating: a bogus box is reported, never overflows).
Dims strides_of(const Dims& extent, int ndim) {
  Dims stride{};
  if (ndim == 0) return stride;
  stride[ndim - 1] = 1;
  for (int d = ndim - 2; d >= 0; --d) stride[d] = saturating_mul(stride[d + 1], extent[d + 1]);
  return stride;
}

Dims unravel(std::int64_t v, const Dims& box_stride, const Dims& extent, int ndim) {
  Dims index{};
  for (int d = 0; d < ndim; ++d) index[d] = extent[d] > 0 ? (v / box_stride[d]) % extent[d] : 0;
  return index;
}

// The rank's arithmetic: offset + index, flattened with the strides of the rank's shape.
// Unsigned, so a bogus descriptor wraps instead of overflowing.
std::uint64_t rank_flat(const Reads& r, const Dims& index) {
  std::uint64_t flat = 0;
  for (int d = 0; d < r.ndim; ++d)
    flat = flat * static_cast<std::uint64_t>(r.shape[d]) +
           static_cast<std::uint64_t>(r.offset[d] + index[d]);
  return flat;
}

float read_value(const kernels::GeneratorSpec& spec, std::uint64_t param, std::uint64_t element) {
  return kernels::gradient_value(spec, param, element);
}

std::string dims_string(const Dims& dims, int ndim) {
  std::string out = "[";
  for (int d = 0; d < ndim; ++d) out += (d ? ", " : "") + std::to_string(dims[d]);
  return out + "]";
}

ShardMismatch structural(const Reads& r, const kernels::GeneratorSpec& spec, std::int64_t v,
                         std::string reason) {
  ShardMismatch m;
  m.param = static_cast<int>(r.param);
  m.rank_element = v;
  if (r.ndim >= 1 && r.ndim <= kMaxDims) {
    const Dims box_stride = strides_of(r.extent, r.ndim);
    m.read_element = rank_flat(r, unravel(v, box_stride, r.extent, r.ndim));
  }
  m.expected = kNoElement;
  m.got = read_value(spec, r.param, m.read_element);
  m.reason = std::move(reason);
  return m;
}

// Everything that can be said without reading a value; `p` is the logical param.
std::optional<ShardMismatch> check_structure(const Reads& r, const LogicalParam& p,
                                             const kernels::GeneratorSpec& spec) {
  const int nd = p.shape.rank;
  if (r.ndim != nd)
    return structural(r, spec, r.begin,
                      "the shard has " + std::to_string(r.ndim) + " dims, logical tensor " +
                          p.name + " " + topologies::shape_string(p.shape) + " has " +
                          std::to_string(nd));
  for (int d = 0; d < nd; ++d)
    if (r.offset[d] < 0 || r.extent[d] < 0)
      return structural(r, spec, 0,
                        "negative offset or extent in box offset " + dims_string(r.offset, nd) +
                            " extent " + dims_string(r.extent, nd));
  std::int64_t box_numel = 1;
  for (int d = 0; d < nd; ++d) box_numel = saturating_mul(box_numel, r.extent[d]);
  if (r.begin < 0 || r.begin > r.end || r.end > box_numel)
    return structural(r, spec, std::max<std::int64_t>(r.begin, 0),
                      "range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                          ") is not inside the box of " + std::to_string(box_numel) + " elements");
  if (r.begin == r.end) return std::nullopt;

  // The first box element in [begin, end) outside the logical tensor: either `begin` itself, or,
  // per dim d that overhangs, the next element whose index on d reaches the limit.
  const Dims box_stride = strides_of(r.extent, nd);
  const Dims at = unravel(r.begin, box_stride, r.extent, nd);
  std::int64_t first_out = std::numeric_limits<std::int64_t>::max();
  for (int d = 0; d < nd; ++d) {
    const std::int64_t limit = std::max<std::int64_t>(0, p.shape[d] - r.offset[d]);
    if (limit >= r.extent[d]) continue;
    if (at[d] >= limit) {
      first_out = r.begin;
      break;
    }
    std::int64_t v = 0;
    for (int e = 0; e < d; ++e) v += at[e] * box_stride[e];
    first_out = std::min(first_out, v + limit * box_stride[d]);
  }
  if (first_out < r.end) {
    const Dims index = unravel(first_out, box_stride, r.extent, nd);
    Dims logical{};
    for (int d = 0; d < nd; ++d) logical[d] = r.offset[d] + index[d];
    return structural(r, spec, first_out,
                      "box element " + dims_string(logical, nd) + " lies outside logical tensor " +
                          p.name + " " + topologies::shape_string(p.shape));
  }

  // A descriptor whose shape differs from the logical one flattens with the wrong strides: name
  // the first element it reads from the wrong place, whatever the values (ones mode included).
  bool same_shape = true;
  for (int d = 0; d < nd; ++d) same_shape = same_shape && r.shape[d] == p.shape[d];
  if (!same_shape) {
    Reads truth = r;
    for (int d = 0; d < nd; ++d) truth.shape[d] = p.shape[d];
    Dims index = at;
    for (std::int64_t v = r.begin; v < r.end; ++v) {
      const std::uint64_t read = rank_flat(r, index), wanted = rank_flat(truth, index);
      if (read != wanted) {
        ShardMismatch m;
        m.param = p.id;
        m.rank_element = v;
        m.read_element = read;
        m.expected = read_value(spec, r.param, wanted);
        m.got = read_value(spec, r.param, read);
        m.reason = "the shard flattens with shape " + dims_string(r.shape, nd) +
                   " but logical tensor " + p.name + " is " + topologies::shape_string(p.shape) +
                   " (logical element " + std::to_string(wanted) + " wanted)";
        return m;
      }
      for (int d = nd - 1; d >= 0; --d) {
        if (++index[d] < r.extent[d]) break;
        index[d] = 0;
      }
    }
  }
  return std::nullopt;
}

// Compares the rank's reads with an Eigen slice of the materialised logical tensor, a batch of
// whole logical rows at a time. The structure has been checked: every element read is inside the
// tensor, though the box may overhang it where a range stops short of the overhang, so the slice
// is the box clipped to the tensor.
template <int R>
std::optional<ShardMismatch> compare_values(const Reads& r, const LogicalParam& p,
                                            const kernels::GeneratorSpec& spec) {
  using Tensor = Eigen::Tensor<float, R, Eigen::RowMajor>;
  using ConstMap = Eigen::TensorMap<const Tensor>;
  std::int64_t inner_logical = 1, inner_box = 1;
  for (int d = 1; d < R; ++d) {
    inner_logical *= p.shape[d];
    inner_box *= r.extent[d];
  }
  if (inner_box == 0) return std::nullopt;
  const std::int64_t rows_per_batch = std::max<std::int64_t>(1, kTruthBlock / inner_logical);
  const std::int64_t first_row = r.begin / inner_box;
  const std::int64_t end_row = (r.end - 1) / inner_box + 1;
  const std::uint64_t key = kernels::stream_key(spec.seed, static_cast<std::uint64_t>(p.id));
  const Dims box_stride = strides_of(r.extent, R);
  Dims inside{};  // the box's extent clipped to the tensor (dims >= 1)
  for (int d = 1; d < R; ++d) inside[d] = std::min(r.extent[d], p.shape[d] - r.offset[d]);

  std::vector<float> rows;
  for (std::int64_t b0 = first_row; b0 < end_row; b0 += rows_per_batch) {
    const std::int64_t b1 = std::min(end_row, b0 + rows_per_batch);
    // Logical rows offset[0] + [b0, b1), materialised row-major.
    const std::int64_t base = (r.offset[0] + b0) * inner_logical;
    rows.resize(static_cast<std::size_t>((b1 - b0) * inner_logical));
    for (std::size_t j = 0; j < rows.size(); ++j)
      rows[j] = kernels::stored_value(spec.mode, spec.dtype, key,
                                      static_cast<std::uint64_t>(base) + j);
    Eigen::array<Eigen::Index, R> dims, offsets, extents;
    dims[0] = b1 - b0;
    offsets[0] = 0;
    extents[0] = b1 - b0;
    for (int d = 1; d < R; ++d) {
      dims[d] = p.shape[d];
      offsets[d] = r.offset[d];
      extents[d] = inside[d];
    }
    const Tensor block = ConstMap(rows.data(), dims).slice(offsets, extents);

    const std::int64_t block_first = b0 * inner_box;  // the box element at block row 0
    const std::int64_t v_begin = std::max(r.begin, block_first);
    const std::int64_t v_end = std::min(r.end, b1 * inner_box);
    Dims index = unravel(v_begin, box_stride, r.extent, R);
    for (std::int64_t v = v_begin; v < v_end; ++v) {
      const std::uint64_t read = rank_flat(r, index);
      const float got = read_value(spec, r.param, read);
      std::int64_t at = index[0] - b0;  // row-major in the clipped block
      for (int d = 1; d < R; ++d) at = at * inside[d] + index[d];
      const float expected = block.data()[at];
      if (std::bit_cast<std::uint32_t>(got) != std::bit_cast<std::uint32_t>(expected)) {
        ShardMismatch m;
        m.param = p.id;
        m.rank_element = v;
        m.read_element = read;
        m.expected = expected;
        m.got = got;
        m.reason = "the value read differs from the Eigen block of " + p.name;
        return m;
      }
      for (int d = R - 1; d >= 0; --d) {  // next box index, row-major
        if (++index[d] < r.extent[d]) break;
        index[d] = 0;
      }
    }
  }
  return std::nullopt;
}

std::optional<ShardMismatch> verify(const LogicalModel& model, const kernels::GeneratorSpec& spec,
                                    Reads r) {
  if (r.whole_box) {
    r.begin = 0;
    r.end = 1;
    for (int d = 0; d < std::clamp(r.ndim, 0, kMaxDims); ++d)
      r.end = saturating_mul(r.end, std::max<std::int64_t>(r.extent[d], 0));
  }
  if (r.param >= static_cast<std::uint64_t>(model.size())) {
    ShardMismatch m;
    m.param = static_cast<int>(std::min<std::uint64_t>(r.param, std::numeric_limits<int>::max()));
    m.rank_element = r.begin;
    m.expected = kNoElement;
    m.got = read_value(spec, r.param, 0);
    m.reason = "no logical param " + std::to_string(r.param) + " (the model has " +
               std::to_string(model.size()) + ")";
    return m;
  }
  const LogicalParam& p = model.param(static_cast<int>(r.param));
  if (std::optional<ShardMismatch> m = check_structure(r, p, spec)) return m;
  if (r.begin == r.end) return std::nullopt;
  switch (r.ndim) {
    case 1: return compare_values<1>(r, p, spec);
    case 2: return compare_values<2>(r, p, spec);
    case 3: return compare_values<3>(r, p, spec);
    default: return compare_values<4>(r, p, spec);
  }
}

}  // namespace

std::string describe(const ShardMismatch& m) {
  std::ostringstream out;
  out << "param " << m.param << ", rank element " << m.rank_element << " (read logical element "
      << m.read_element << "): expected " << m.expected << ", got " << m.got << ": " << m.reason;
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const ShardMismatch& m) { return out << describe(m); }

std::optional<ShardMismatch> verify_shard(const LogicalModel& model,
                                          const kernels::GeneratorSpec& spec,
                                          const topologies::LocalParam& param) {
  Reads r;
  r.param = static_cast<std::uint64_t>(param.logical_id);
  r.ndim = param.slice.rank;
  if (param.logical_id >= 0 && param.logical_id < model.size()) {
    const topologies::Shape& shape = model.param(param.logical_id).shape;
    for (int d = 0; d < shape.rank; ++d) r.shape[d] = shape.dims[d];
  }
  for (int d = 0; d < std::clamp(r.ndim, 0, kMaxDims); ++d) {
    r.offset[d] = param.slice.offset[d];
    r.extent[d] = param.slice.extent[d];
  }
  return verify(model, spec, r);
}

std::optional<ShardMismatch> verify_shards(const LogicalModel& model,
                                           const kernels::GeneratorSpec& spec,
                                           std::span<const topologies::LocalParam> params) {
  for (const topologies::LocalParam& param : params)
    if (std::optional<ShardMismatch> m = verify_shard(model, spec, param)) return m;
  return std::nullopt;
}

std::optional<ShardMismatch> verify_shard(const LogicalModel& model,
                                          const kernels::GeneratorSpec& spec,
                                          const kernels::ShardDesc& shard) {
  Reads r;
  r.param = shard.param_id;
  r.ndim = shard.ndim;
  for (int d = 0; d < std::clamp(r.ndim, 0, kMaxDims); ++d) {
    r.shape[d] = shard.shape[d];
    r.offset[d] = shard.offset[d];
    r.extent[d] = shard.extent[d];
  }
  if (shard.range) {
    r.whole_box = false;
    r.begin = shard.range->begin;
    r.end = shard.range->end;
  }
  return verify(model, spec, r);
}

std::optional<ShardMismatch> verify_shards(const LogicalModel& model,
                                           const kernels::GeneratorSpec& spec,
                                           std::span<const kernels::ShardDesc> shards) {
  for (const kernels::ShardDesc& shard : shards)
    if (std::optional<ShardMismatch> m = verify_shard(model, spec, shard)) return m;
  return std::nullopt;
}

}  // namespace tally::oracle
