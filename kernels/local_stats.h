// Local statistics of one rank's gradient shards, in ONE multi-tensor call: sum of squares,
// abs-max, zero count, sums of |g|^p and the number of elements visited, over generated gradient
// values (kernels/gradient_generator.h). local_stats_cpu is the CPU implementation; the CUDA twin
// local_stats_cuda (kernels/local_stats_cuda.h) has exactly the same signature (LocalStatsFn) and
// contract, and matches it bit for bit (that header says where pow makes the one exception).
//
// What is visited. A shard is a box of its logical tensor (offset and extent per dimension),
// optionally narrowed to the contiguous range [begin, end) of the box's elements in row-major order
// (a distributed optimizer owns such ranges of its flattened local buffer). Each visited element's
// value is gradient_value(gen, param_id, i) where i is the element's row-major index in the full
// logical tensor. Elements are visited in the box's row-major order; v = 0, 1, ... numbers them
// within the shard.
//
// Determinism contract: FIXED ORDER. The same inputs give the same bits, run to run, on every
// build of this file (it is compiled without FMA contraction). With accumulation type A (float or
// double) and for every additive statistic (sum of squares and each p-sum):
//   1. term(g) is computed in A from the stored value g widened to A: the square is g*g rounded to
//      A (exact when A is double), |g|^p is repeated multiplication left to right for integer p in
//      [1, 8] ((|g|*|g|)*|g|...), std::pow(|g|, p) in A otherwise.
//   2. A shard's elements are cut into chunks of kStatsChunk consecutive v (the last may be short).
//      Within a chunk, lane l (of kStatsLanes = 8) sums the terms with v % 8 == l in increasing v,
//      starting from +0; the chunk's sum is ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
//   3. The shard's sum starts at +0 and adds its chunk sums in chunk order.
//   4. The call's sum starts at +0 and adds the shard sums in input order.
// This mirrors a GPU multi-tensor l2norm (strided per-thread partials, a fixed tree per block,
// chunks combined in order). Error bound, for the oracle's tolerance model: an element's term goes
// through at most kStatsChunk/8 - 1 lane additions, 3 tree additions, ceil(n/kStatsChunk) shard
// additions and (number of shards) call additions, each rounded to A; all terms are >= 0.
// abs-max (max of |g|, exact in any order; NaN never wins, 0 when nothing was visited), the zero
// count (int64; g counts iff g == 0, so -0 counts and NaN does not) and the element count are
// exact. In exact modes (ones, zeros, dyadic, rank-encoded) with fp64 accumulation every sum is
// exact, hence independent of the order.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/gradient_generator.h"
#include "kernels/summation_order.h"

namespace tally::kernels {

inline constexpr int kMaxDims = 4;

// [begin, end) of a box's elements in row-major order.
struct ElementRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  friend bool operator==(const ElementRange&, const ElementRange&) = default;
};

// One rank's shard of one logical tensor. ndim = 0 is a scalar (one element). Entries at and
// beyond ndim are ignored.
struct ShardDesc {
  std::uint64_t param_id = 0;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};   // the logical tensor's shape
  std::array<std::int64_t, kMaxDims> offset{};  // the box's first index per dimension
  std::array<std::int64_t, kMaxDims> extent{};  // the box's size per dimension
  std::optional<ElementRange> range;            // absent: the whole box
  friend bool operator==(const ShardDesc&, const ShardDesc&) = default;
};

// The whole logical tensor as one shard (throws std::invalid_argument for more than kMaxDims).
ShardDesc whole_tensor(std::uint64_t param_id, std::span<const std::int64_t> shape);
// Elements of the box, and elements visited (the range's length, or the box's size).
std::int64_t box_numel(const ShardDesc& shard);
std::int64_t visited_numel(const ShardDesc& shard);
// A one-line description of what is wrong with the descriptor, or nullopt when it is valid:
// 0 <= ndim <= kMaxDims, shape >= 0, offset >= 0, extent >= 0, offset + extent <= shape, the
// logical size fits in int64, 0 <= begin <= end <= box_numel.
std::optional<std::string> check_shard(const ShardDesc& shard);

struct StatsOptions {
  Accumulation accumulation = Accumulation::fp64;
  std::vector<double> p_values;  // finite p > 0 for the p-norm sums, in the order wanted back
  bool per_tensor = false;       // also return one Stats per shard
  friend bool operator==(const StatsOptions&, const StatsOptions&) = default;
};

// Sums are in the accumulation type, widened exactly to double.
struct Stats {
  double sum_squares = 0.0;
  double abs_max = 0.0;
  std::int64_t zeros = 0;
  std::int64_t elements = 0;
  std::vector<double> p_sums;  // sum of |g|^p, one per StatsOptions::p_values entry
  friend bool operator==(const Stats&, const Stats&) = default;
};

struct LocalStats {
  Stats total;
  std::vector<Stats> per_tensor;  // empty unless StatsOptions::per_tensor, else one per shard
  friend bool operator==(const LocalStats&, const LocalStats&) = default;
};

using LocalStatsFn = LocalStats (*)(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                                    const StatsOptions& options);

// Throws std::invalid_argument (naming the shard and check_shard's message) for an invalid shard
// or a p that is not finite and > 0; computes nothing in that case.
LocalStats local_stats_cpu(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                           const StatsOptions& options);

}  // namespace tally::kernels
