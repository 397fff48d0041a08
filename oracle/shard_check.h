// Shard consistency: what a rank reads for its shard is the matching block of the logical
// tensor. The rank's reads are computed with the rank's own index arithmetic (box element v ->
// multi-index -> offset + index -> row-major flat index with the strides of the shape the rank
// believes in -> kernels::gradient_value); the expectation is an independent Eigen view: the
// logical tensor materialised row-major, mapped as an Eigen::Tensor of its rank (1..4 dims) and
// cut with .slice(offset, extent). Any difference is an index-arithmetic bug in the sharding (or
// in the descriptor handed to the kernels).
//
// What it cannot see: a box that is in bounds but is the wrong block for the rank (the ledger
// and the norms catch that), and, in modes whose values repeat (ones, zeros; dyadic and
// rank-encoded rarely), a wrong stride that happens to read an equal value. Use a mode with
// distinct values (normal, uniform) to check arithmetic.
//
// Memory: one batch of whole logical rows (dim 0) at a time, about kTruthBlock floats (at least
// one row); only the rows the box touches are materialised.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>

#include "kernels/gradient_generator.h"
#include "kernels/local_stats.h"  // the ShardDesc type only
#include "topologies/logical_model.h"
#include "topologies/sharding.h"

namespace tally::oracle {

// The first element a rank reads wrongly. Structural problems (an unknown param, a dimension
// count that differs from the logical tensor's, negative offsets or extents, a range outside the
// box, a box element outside the logical tensor) are reported before any value comparison.
struct ShardMismatch {
  int param = 0;                   // logical param id
  std::int64_t rank_element = 0;   // box element, row-major in the box (not range-relative)
  std::uint64_t read_element = 0;  // the logical element the rank's arithmetic read
  float expected = 0.0f;  // the Eigen block's value; NaN when the element has none (out of bounds)
  float got = 0.0f;       // gradient_value at read_element
  std::string reason;
  friend bool operator==(const ShardMismatch&, const ShardMismatch&) = default;
};
std::string describe(const ShardMismatch& mismatch);
std::ostream& operator<<(std::ostream& out, const ShardMismatch& mismatch);

// nullopt: every element the rank reads is the matching element of the logical tensor.
// The LocalParam forms read the whole slice with the logical param's own shape (what a rank
// materialising its shard from the sharding does); a shared copy reads the param it copies.
std::optional<ShardMismatch> verify_shard(const topologies::LogicalModel& model,
                                          const kernels::GeneratorSpec& spec,
                                          const topologies::LocalParam& param);
std::optional<ShardMismatch> verify_shards(const topologies::LogicalModel& model,
                                           const kernels::GeneratorSpec& spec,
                                           std::span<const topologies::LocalParam> params);

// The ShardDesc forms read what the kernels would: the box with the descriptor's own shape for
// the strides and only the elements of its range, so a descriptor built with the wrong shape,
// param id or range is caught too.
std::optional<ShardMismatch> verify_shard(const topologies::LogicalModel& model,
                                          const kernels::GeneratorSpec& spec,
                                          const kernels::ShardDesc& shard);
std::optional<ShardMismatch> verify_shards(const topologies::LogicalModel& model,
                                           const kernels::GeneratorSpec& spec,
                                           std::span<const kernels::ShardDesc> shards);

}  // namespace tally::oracle
