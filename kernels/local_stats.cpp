#include "kernels/local_stats.h"

#include "kernels/detail/shard_runs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace tally::kernels {
namespace {

using detail::Box;
using detail::box_of;
using detail::for_each_run;
using detail::visited_range;

static_assert(kStatsLanes == 8, "the lane tree below is written for 8 lanes");
static_assert(kStatsChunk % kStatsLanes == 0, "chunks must start at lane 0");

// a * b, or nullopt when it does not fit in int64 (both are >= 0).
std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a) return std::nullopt;
  return a * b;
}

template <class A>
A lane_tree(const A (&lanes)[kStatsLanes]) {
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

template <class A>
struct SquareTerm {
  A operator()(A a) const { return a * a; }
};

template <class A>
struct PowerTerm {
  int integer_p = 0;  // 1..8: repeated multiplication; 0: std::pow
  A p = 0;
  A operator()(A a) const {
    a = std::fabs(a);
    if (integer_p == 0) return std::pow(a, p);
    A result = a;
    for (int k = 1; k < integer_p; ++k) result = result * a;
    return result;
  }
};

// Where a pass reads its values: the generator with the mode and dtype fixed at compile time,
// or the values a case states for the param (one switch per element: they are hand-written).
template <GradientMode M, Dtype D>
struct Generated {
  std::uint64_t key;
  float operator()(std::uint64_t element) const { return stored_value<M, D>(key, element); }
};
struct Stated {
  const GeneratorSpec* spec;
  std::uint64_t key;
  float operator()(std::uint64_t element) const { return stated_value(*spec, key, element); }
};

// One additive statistic over one shard in the documented order; with kExtras it also keeps the
// abs-max and the zero count (exact, per lane only so that the loop vectorises).
template <class Source, class A, class Term, bool kExtras>
class ShardPass {
 public:
  ShardPass(Source source, Term term) : source_(source), term_(term) {}

  void run(std::uint64_t first, std::int64_t count) {
    while (count > 0) {
      const std::int64_t take = std::min(count, kStatsChunk - chunk_pos_);
      segment(first, take);
      first += static_cast<std::uint64_t>(take);
      count -= take;
      chunk_pos_ += take;
      if (chunk_pos_ == kStatsChunk) fold();
    }
  }

  // The shard's sum; folds the last, partial chunk.
  A finish() {
    if (chunk_pos_ > 0) fold();
    return sum_;
  }
  float abs_max() const {
    float m = 0.0f;
    for (float lane : abs_max_) m = lane > m ? lane : m;
    return m;
  }
  std::int64_t zeros() const {
    std::int64_t z = 0;
    for (std::int64_t lane : zeros_) z += lane;
    return z;
  }

 private:
  void add(int lane, std::uint64_t element) {
    const float g = source_(element);
    lanes_[lane] += term_(static_cast<A>(g));
    if constexpr (kExtras) {
      const float magnitude = std::fabs(g);
      abs_max_[lane] = magnitude > abs_max_[lane] ? magnitude : abs_max_[lane];
      zeros_[lane] += g == 0.0f ? 1 : 0;
    }
  }

  // `count` elements from logical index `first`, all inside the current chunk.
  void segment(std::uint64_t first, std::int64_t count) {
    std::int64_t j = 0;
    int lane = static_cast<int>(chunk_pos_ % kStatsLanes);
    for (; j < count && lane != 0; ++j, lane = (lane + 1) % kStatsLanes)
      add(lane, first + static_cast<std::uint64_t>(j));
    for (; j + kStatsLanes <= count; j += kStatsLanes)
      for (int l = 0; l < kStatsLanes; ++l) add(l, first + static_cast<std::uint64_t>(j + l));
    for (; j < count; ++j, ++lane) add(lane, first + static_cast<std::uint64_t>(j));
  }

  void fold() {
    sum_ += lane_tree(lanes_);
    for (A& lane : lanes_) lane = A(0);
    chunk_pos_ = 0;
  }

  Source source_;
  Term term_;
  A lanes_[kStatsLanes] = {};
  A sum_ = A(0);
  std::int64_t chunk_pos_ = 0;
  float abs_max_[kStatsLanes] = {};
  std::int64_t zeros_[kStatsLanes] = {};
};

// All statistics of one shard; the p-sums are one further pass each.
template <class Source, class A>
void shard_stats(const ShardDesc& shard, Source source, std::span<const double> p_values, Stats& out) {
  ShardPass<Source, A, SquareTerm<A>, true> main_pass(source, SquareTerm<A>{});
  for_each_run(shard,
               [&](std::uint64_t first, std::int64_t count) { main_pass.run(first, count); });
  out.sum_squares = static_cast<double>(main_pass.finish());
  out.abs_max = static_cast<double>(main_pass.abs_max());
  out.zeros = main_pass.zeros();
  out.elements = visited_numel(shard);
  out.p_sums.assign(p_values.size(), 0.0);
  for (std::size_t i = 0; i < p_values.size(); ++i) {
    const double p = p_values[i];
    PowerTerm<A> term;
    term.p = static_cast<A>(p);
    if (p == std::floor(p) && p >= 1.0 && p <= 8.0) term.integer_p = static_cast<int>(p);
    ShardPass<Source, A, PowerTerm<A>, false> pass(source, term);
    for_each_run(shard, [&](std::uint64_t first, std::int64_t count) { pass.run(first, count); });
    out.p_sums[i] = static_cast<double>(pass.finish());
  }
}

using ShardFn = void (*)(const ShardDesc&, const GeneratorSpec&, std::uint64_t,
                        std::span<const double>, Stats&);

template <GradientMode M, Dtype D, class A>
void generated_shard_stats(const ShardDesc& shard, const GeneratorSpec&, std::uint64_t key,
                           std::span<const double> p_values, Stats& out) {
  shard_stats<Generated<M, D>, A>(shard, Generated<M, D>{key}, p_values, out);
}

template <class A>
void stated_shard_stats(const ShardDesc& shard, const GeneratorSpec& gen, std::uint64_t key,
                        std::span<const double> p_values, Stats& out) {
  shard_stats<Stated, A>(shard, Stated{&gen, key}, p_values, out);
}

template <GradientMode M, class A>
ShardFn pick(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp32: return &generated_shard_stats<M, Dtype::fp32, A>;
    case Dtype::bf16: return &generated_shard_stats<M, Dtype::bf16, A>;
    case Dtype::fp16: return &generated_shard_stats<M, Dtype::fp16, A>;
  }
  throw std::invalid_argument("local_stats_cpu: unknown dtype");
}

template <class A>
ShardFn pick(const GeneratorSpec& gen) {
  if (states_values(gen)) return &stated_shard_stats<A>;
  const Dtype dtype = gen.dtype;
  switch (gen.mode) {
    case GradientMode::ones: return pick<GradientMode::ones, A>(dtype);
    case GradientMode::zeros: return pick<GradientMode::zeros, A>(dtype);
    case GradientMode::dyadic: return pick<GradientMode::dyadic, A>(dtype);
    case GradientMode::uniform: return pick<GradientMode::uniform, A>(dtype);
    case GradientMode::normal: return pick<GradientMode::normal, A>(dtype);
    case GradientMode::sparse: return pick<GradientMode::sparse, A>(dtype);
    case GradientMode::rank_encoded: return pick<GradientMode::rank_encoded, A>(dtype);
  }
  throw std::invalid_argument("local_stats_cpu: unknown gradient mode");
}

// Steps 4 of the contract (shard sums added in input order), in A.
template <class A>
LocalStats combine(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                   const StatsOptions& options) {
  const ShardFn shard_fn = pick<A>(gen);
  const std::size_t np = options.p_values.size();
  A sum_squares = A(0);
  std::vector<A> p_sums(np, A(0));
  LocalStats result;
  result.total.p_sums.assign(np, 0.0);
  if (options.per_tensor) result.per_tensor.reserve(shards.size());
  Stats shard_result;
  for (const ShardDesc& shard : shards) {
    shard_fn(shard, gen, stream_key(gen.seed, shard.param_id), options.p_values, shard_result);
    // The shard sums are values of A widened to double: narrowing them back is exact.
    sum_squares += static_cast<A>(shard_result.sum_squares);
    for (std::size_t i = 0; i < np; ++i) p_sums[i] += static_cast<A>(shard_result.p_sums[i]);
    result.total.abs_max = std::max(result.total.abs_max, shard_result.abs_max);
    result.total.zeros += shard_result.zeros;
    result.total.elements += shard_result.elements;
    if (options.per_tensor) result.per_tensor.push_back(shard_result);
  }
  result.total.sum_squares = static_cast<double>(sum_squares);
  for (std::size_t i = 0; i < np; ++i) result.total.p_sums[i] = static_cast<double>(p_sums[i]);
  return result;
}

}  // namespace

ShardDesc whole_tensor(std::uint64_t param_id, std::span<const std::int64_t> shape) {
  if (shape.size() > static_cast<std::size_t>(kMaxDims))
    throw std::invalid_argument("whole_tensor: " + std::to_string(shape.size()) +
                                " dimensions, at most " + std::to_string(kMaxDims));
  ShardDesc shard;
  shard.param_id = param_id;
  shard.ndim = static_cast<int>(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    shard.shape[d] = shape[d];
    shard.extent[d] = shape[d];
  }
  return shard;
}

std::int64_t box_numel(const ShardDesc& shard) {
  std::int64_t n = 1;
  for (int d = 0; d < shard.ndim; ++d) n *= shard.extent[d];
  return n;
}

std::int64_t visited_numel(const ShardDesc& shard) {
  const ElementRange range = visited_range(shard);
  return range.end - range.begin;
}

std::optional<std::string> check_shard(const ShardDesc& shard) {
  if (shard.ndim < 0 || shard.ndim > kMaxDims)
    return "ndim " + std::to_string(shard.ndim) + " is outside [0, " + std::to_string(kMaxDims) +
           "]";
  std::int64_t logical = 1;
  std::int64_t box = 1;
  for (int d = 0; d < shard.ndim; ++d) {
    auto dim = [d] { return "dimension " + std::to_string(d) + ": "; };
    const std::int64_t size = shard.shape[d], off = shard.offset[d], ext = shard.extent[d];
    if (size < 0) return dim() + "shape " + std::to_string(size) + " is negative";
    if (off < 0) return dim() + "offset " + std::to_string(off) + " is negative";
    if (ext < 0) return dim() + "extent " + std::to_string(ext) + " is negative";
    if (off > size || ext > size - off)
      return dim() + "box [" + std::to_string(off) + ", " + std::to_string(off) + " + " +
             std::to_string(ext) + ") exceeds shape " + std::to_string(size);
    const auto l = checked_mul(logical, size);
    if (!l) return "the logical tensor has more than 2^63 elements";
    logical = *l;
    box *= ext;  // box <= logical
  }
  if (shard.range) {
    const ElementRange r = *shard.range;
    if (r.begin < 0 || r.begin > r.end || r.end > box)
      return "range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
             ") is not within the box's " + std::to_string(box) + " elements";
  }
  return std::nullopt;
}

LocalStats local_stats_cpu(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                           const StatsOptions& options) {
  for (std::size_t i = 0; i < shards.size(); ++i)
    if (auto error = check_shard(shards[i]))
      throw std::invalid_argument("local_stats_cpu: shard " + std::to_string(i) + " (param " +
                                  std::to_string(shards[i].param_id) + "): " + *error);
  for (double p : options.p_values)
    if (!(std::isfinite(p) && p > 0.0))
      throw std::invalid_argument("local_stats_cpu: p = " + std::to_string(p) +
                                  " is not finite and > 0");
  return options.accumulation == Accumulation::fp64 ? combine<double>(shards, gen, options)
                                                    : combine<float>(shards, gen, options);
}

}  // namespace tally::kernels
