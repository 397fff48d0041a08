// local_stats_cuda and clip_scale_cuda (kernels/local_stats_cuda.h) against their CPU twins, on
// fresh random shard lists each run (empty tensors, scalars, odd sizes, sub-ranges with misaligned
// starts, 1 to 4 dimensions, every mode and dtype, fp32 and fp64 accumulation, integer and
// non-integer p). Bit for bit wherever local_stats_cuda.h promises it; non-integer p-sums within
// the bound derived below.
//
// Without a usable CUDA device every test skips with the reason (GTEST_SKIP), unless the
// environment sets TALLY_REQUIRE_GPU=1 (ci/gpu-test does), which turns the skip into a failure.
// TALLY_GPU_TEST_SEED=N replays one run's inputs (the seed is printed by every failure);
// TALLY_GPU_TEST_QUICK=1 runs fewer and smaller cases (for compute-sanitizer).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/clip_scale.h"
#include "kernels/local_stats.h"
#include "kernels/local_stats_cuda.h"
#include "tests/support/shards.h"

namespace tally::kernels {
namespace {

std::uint64_t bits_of(double value) { return std::bit_cast<std::uint64_t>(value); }
std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }

bool quick() {
  const char* value = std::getenv("TALLY_GPU_TEST_QUICK");
  return value != nullptr && std::string(value) == "1";
}

std::uint64_t run_seed() {
  static const std::uint64_t seed = [] {
    if (const char* value = std::getenv("TALLY_GPU_TEST_SEED"))
      return static_cast<std::uint64_t>(std::stoull(value));
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }();
  return seed;
}

class LocalStatsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_available(&why)) {
      RecordProperty("seed", std::to_string(run_seed()));
      return;
    }
    const char* require = std::getenv("TALLY_REQUIRE_GPU");
    if (require != nullptr && std::string(require) == "1")
      FAIL() << "TALLY_REQUIRE_GPU=1 but there is no usable CUDA device: " << why;
    GTEST_SKIP() << "no CUDA device: " << why;
  }
};

using testing::box;

std::string describe(const ShardDesc& s) {
  std::ostringstream out;
  out << "param " << s.param_id << " shape [";
  for (int d = 0; d < s.ndim; ++d) out << (d ? "," : "") << s.shape[d];
  out << "] offset [";
  for (int d = 0; d < s.ndim; ++d) out << (d ? "," : "") << s.offset[d];
  out << "] extent [";
  for (int d = 0; d < s.ndim; ++d) out << (d ? "," : "") << s.extent[d];
  out << "]";
  if (s.range) out << " range [" << s.range->begin << ", " << s.range->end << ")";
  return out.str();
}

std::string describe(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                     const StatsOptions& options) {
  std::ostringstream out;
  out << "seed " << gen.seed << " mode " << mode_name(gen.mode) << " dtype "
      << dtype_name(gen.dtype) << " acc " << accumulation_name(options.accumulation) << " p {";
  for (double p : options.p_values) out << " " << p;
  out << " } " << shards.size() << " shards";
  for (const ShardDesc& s : shards) out << "\n  " << describe(s);
  return out.str();
}

// ---- Random inputs
// -------------------------------------------------------------------------------

class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(engine_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(engine_); }
  template <class T>
  const T& pick(const std::vector<T>& values) {
    return values[static_cast<std::size_t>(
        uniform(0, static_cast<std::int64_t>(values.size()) - 1))];
  }
  std::uint64_t bits() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

// A dimension of a logical tensor whose size is at most about `budget`: odd sizes, sizes around
// the chunk and lane widths, sometimes 0 or 1.
std::int64_t random_dim(Random& rng, std::int64_t budget) {
  if (rng.chance(0.03)) return 0;
  if (rng.chance(0.1)) return 1;
  const std::vector<std::int64_t> special = {2, 3, 7, 8, 9, 15, 17, 255, 257, 2047, 2048, 2049};
  std::int64_t size =
      rng.chance(0.3) ? rng.pick(special) : rng.uniform(1, std::max<std::int64_t>(budget, 1));
  return std::min(size, std::max<std::int64_t>(budget, 1));
}

ShardDesc random_shard(Random& rng, std::uint64_t param, std::int64_t max_logical) {
  const int ndim = static_cast<int>(rng.uniform(0, kMaxDims));
  ShardDesc s;
  s.param_id = param;
  s.ndim = ndim;
  std::int64_t left = max_logical;
  for (int d = 0; d < ndim; ++d) {
    const int dims_left = ndim - d;
    const auto budget = static_cast<std::int64_t>(
        std::pow(static_cast<double>(std::max<std::int64_t>(left, 1)), 1.0 / dims_left));
    s.shape[d] = random_dim(rng, rng.chance(0.5) ? budget : std::max<std::int64_t>(budget / 4, 1));
    left = s.shape[d] > 0 ? left / s.shape[d] : left;
    // Mostly large boxes (the whole dimension, or most of it), sometimes thin or empty ones.
    if (s.shape[d] == 0 || rng.chance(0.35)) {
      s.offset[d] = 0;
      s.extent[d] = s.shape[d];
    } else {
      s.offset[d] = rng.uniform(0, s.shape[d] - 1);
      s.extent[d] = rng.chance(0.05) ? 0 : rng.uniform(1, s.shape[d] - s.offset[d]);
    }
  }
  if (rng.chance(0.4)) {
    const std::int64_t n = box_numel(s);
    const std::int64_t begin = rng.uniform(0, n);
    s.range = ElementRange{begin, rng.uniform(begin, n)};
  }
  return s;
}

std::vector<ShardDesc> random_shards(Random& rng, std::int64_t max_logical) {
  const int count = static_cast<int>(rng.uniform(0, 12));
  std::vector<ShardDesc> shards;
  for (int i = 0; i < count; ++i) {
    // Now and then two shards of one param (a range split, or a repeat).
    const std::uint64_t param =
        (!shards.empty() && rng.chance(0.1)) ? shards.back().param_id : rng.bits() % 100000;
    shards.push_back(random_shard(rng, param, max_logical));
  }
  return shards;
}

std::vector<double> random_p_values(Random& rng) {
  const std::vector<double> integer = {1, 2, 3, 4, 5, 8};
  const std::vector<double> other = {0.5, 1.5, 2.5, 3.25, 0.75, 9, 12};
  std::vector<double> ps;
  const int count = static_cast<int>(rng.uniform(0, 3));
  for (int i = 0; i < count; ++i)
    ps.push_back(rng.chance(0.5) ? rng.pick(integer) : rng.pick(other));
  return ps;
}

// ---- Comparison
// ----------------------------------------------------------------------------------

bool integer_p(double p) { return p == std::floor(p) && p >= 1.0 && p <= 8.0; }

// |cuda - cpu| for a sum of pow(|g|, p) terms. Both add the same terms in the same order (the
// chain of k roundings of local_stats.h: lane additions, 3 tree levels, chunk and shard additions);
// only the terms differ. With T the exact sum of the exact terms, the CPU's terms within e_c of
// exact (glibc pow/powf: under 1 ulp, e_c = 2u) and the device's within e_g (fp64: CUDA pow, 2 ulp,
// e_g = 4u; fp32: the double pow rounded once to float, e_g = u + 2^-51), each computed sum is
// within ((1 + e)(1 + u)^k - 1) T of T, and T <= cpu / ((1 - e_c)(1 - u)^k). A term that
// underflows adds an absolute error of at most 2 subnormal ulps per implementation.
double pow_sum_bound(double cpu, std::int64_t longest, std::int64_t shards, Accumulation acc,
                     std::int64_t elements) {
  const bool fp32 = acc == Accumulation::fp32;
  const double u = fp32 ? 0x1p-24 : 0x1p-53;
  const double lanes =
      std::ceil(static_cast<double>(std::min<std::int64_t>(longest, kStatsChunk)) / kStatsLanes) -
      1;
  const double chunks = std::ceil(static_cast<double>(longest) / kStatsChunk) - 1;
  const double k = std::max(0.0, lanes) + 3 + std::max(0.0, chunks) +
                   static_cast<double>(std::max<std::int64_t>(shards - 1, 0));
  const double e_c = 2 * u;
  const double e_g = fp32 ? u + 0x1p-51 : 4 * u;
  const double grow = std::pow(1 + u, k);
  const double exact = cpu / ((1 - e_c) * std::pow(1 - u, k));
  const double subnormal = fp32 ? 0x1p-149 : 0x1p-1074;
  return ((1 + e_c) * grow - 1 + (1 + e_g) * grow - 1) * exact +
         4.0 * subnormal * static_cast<double>(elements);
}

// Compares one Stats: exact fields bit for bit, non-integer p-sums within the bound.
std::optional<std::string> compare(const Stats& got, const Stats& want,
                                   const std::vector<double>& ps, std::int64_t longest,
                                   std::int64_t shards, Accumulation acc) {
  std::ostringstream out;
  out.precision(17);
  if (bits_of(got.sum_squares) != bits_of(want.sum_squares))
    out << " sum_squares " << got.sum_squares << " vs " << want.sum_squares;
  if (bits_of(got.abs_max) != bits_of(want.abs_max))
    out << " abs_max " << got.abs_max << " vs " << want.abs_max;
  if (got.zeros != want.zeros) out << " zeros " << got.zeros << " vs " << want.zeros;
  if (got.elements != want.elements) out << " elements " << got.elements << " vs " << want.elements;
  if (got.p_sums.size() != ps.size() || want.p_sums.size() != ps.size()) {
    out << " p_sums sizes " << got.p_sums.size() << " vs " << want.p_sums.size();
  } else {
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (integer_p(ps[i])) {
        if (bits_of(got.p_sums[i]) != bits_of(want.p_sums[i]))
          out << " p=" << ps[i] << " sum " << got.p_sums[i] << " vs " << want.p_sums[i];
      } else {
        const double bound = pow_sum_bound(want.p_sums[i], longest, shards, acc, want.elements);
        const double error = std::fabs(got.p_sums[i] - want.p_sums[i]);
        if (!(error <= bound))
          out << " p=" << ps[i] << " sum " << got.p_sums[i] << " vs " << want.p_sums[i] << " error "
              << error << " > bound " << bound;
      }
    }
  }
  const std::string text = out.str();
  if (text.empty()) return std::nullopt;
  return text;
}

bool same_bits(const Stats& a, const Stats& b) {
  if (bits_of(a.sum_squares) != bits_of(b.sum_squares) ||
      bits_of(a.abs_max) != bits_of(b.abs_max) || a.zeros != b.zeros || a.elements != b.elements ||
      a.p_sums.size() != b.p_sums.size())
    return false;
  for (std::size_t i = 0; i < a.p_sums.size(); ++i)
    if (bits_of(a.p_sums[i]) != bits_of(b.p_sums[i])) return false;
  return true;
}

::testing::AssertionResult matches_cpu(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                                       StatsOptions options) {
  options.per_tensor = true;
  const LocalStats got = local_stats_cuda(shards, gen, options);
  const LocalStats want = local_stats_cpu(shards, gen, options);
  if (got.per_tensor.size() != shards.size())
    return ::testing::AssertionFailure() << "per_tensor has " << got.per_tensor.size()
                                         << " entries for " << shards.size() << " shards\n"
                                         << describe(shards, gen, options);
  std::int64_t longest = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::int64_t n = visited_numel(shards[i]);
    longest = std::max(longest, n);
    if (auto diff = compare(got.per_tensor[i], want.per_tensor[i], options.p_values, n, 1,
                            options.accumulation))
      return ::testing::AssertionFailure() << "shard " << i << ":" << *diff << "\n"
                                           << describe(shards, gen, options);
  }
  if (auto diff = compare(got.total, want.total, options.p_values, longest,
                          static_cast<std::int64_t>(shards.size()), options.accumulation))
    return ::testing::AssertionFailure() << "total:" << *diff << "\n"
                                         << describe(shards, gen, options);
  return ::testing::AssertionSuccess();
}

// ---- Statistics
// ----------------------------------------------------------------------------------

TEST_F(LocalStatsGpu, RandomShardListsMatchTheCpu) {
  Random rng(run_seed());
  const int cases = quick() ? 10 : 300;
  const std::int64_t max_logical = quick() ? (1 << 13) : (1 << 17);
  for (int c = 0; c < cases; ++c) {
    const std::vector<ShardDesc> shards = random_shards(rng, max_logical);
    const GeneratorSpec gen{
        rng.bits(),
        rng.pick(std::vector<GradientMode>(kAllGradientModes.begin(), kAllGradientModes.end())),
        rng.pick(std::vector<Dtype>(kAllDtypes.begin(), kAllDtypes.end()))};
    StatsOptions options;
    options.accumulation = rng.chance(0.5) ? Accumulation::fp32 : Accumulation::fp64;
    options.p_values = random_p_values(rng);
    ASSERT_TRUE(matches_cpu(shards, gen, options)) << "run seed " << run_seed() << ", case " << c;
  }
}

// Every mode x dtype x accumulation on one fixed-shape list, with fresh values each run.
TEST_F(LocalStatsGpu, EveryModeDtypeAndAccumulation) {
  Random rng(run_seed() ^ 0x5151);
  const std::vector<ShardDesc> shards = {
      box(0, {64, 48}, {0, 0}, {64, 48}),                      // a whole matrix
      box(1, {64, 48}, {32, 0}, {32, 48}),                     // row-parallel half
      box(2, {64, 48}, {0, 12}, {64, 12}),                     // column shard: 64 runs of 12
      box(3, {5, 7, 9, 11}, {1, 2, 3, 4}, {3, 4, 5, 6}),       // a 4-d box
      box(4, {10000}, {100}, {9900}, ElementRange{17, 6613}),  // a misaligned range, 4 chunks
      box(5, {}, {}, {}),                                      // a scalar
      box(6, {4, 0}, {0, 0}, {4, 0}),                          // no elements
      box(7, {300, 7, 3}, {1, 2, 1}, {200, 5, 1}),             // last extent 1: every step carries
  };
  for (GradientMode mode : kAllGradientModes)
    for (Dtype dtype : kAllDtypes)
      for (Accumulation acc : {Accumulation::fp64, Accumulation::fp32}) {
        StatsOptions options;
        options.accumulation = acc;
        options.p_values = {1, 2, 3, 8, 0.5, 2.5};
        const GeneratorSpec gen{rng.bits(), mode, dtype};
        EXPECT_TRUE(matches_cpu(shards, gen, options)) << "run seed " << run_seed();
      }
}

TEST_F(LocalStatsGpu, ChunkBoundariesAndEmptyInputs) {
  const GeneratorSpec gen{run_seed(), GradientMode::normal, Dtype::bf16};
  StatsOptions options;
  options.p_values = {1, 1.5};
  for (Accumulation acc : {Accumulation::fp64, Accumulation::fp32}) {
    options.accumulation = acc;
    EXPECT_TRUE(matches_cpu({}, gen, options));
    const std::vector<ShardDesc> empty = {box(0, {4, 0}, {0, 0}, {4, 0}),
                                          box(1, {4, 5}, {2, 1}, {0, 3}),
                                          box(2, {4, 5}, {1, 1}, {3, 4}, ElementRange{7, 7}),
                                          box(3, {4, 5}, {0, 0}, {4, 5}, ElementRange{20, 20})};
    EXPECT_TRUE(matches_cpu(empty, gen, options));
    const LocalStats none = local_stats_cuda(empty, gen, options);
    EXPECT_EQ(bits_of(none.total.sum_squares), 0u);  // +0
    for (ElementRange r :
         {ElementRange{0, 2048}, ElementRange{2047, 2049}, ElementRange{2048, 4096},
          ElementRange{1, 8193}, ElementRange{4095, 4097}, ElementRange{0, 1},
          ElementRange{9999, 10000}, ElementRange{3, 10000}}) {
      const std::vector<ShardDesc> one = {box(9, {10000}, {0}, {10000}, r)};
      EXPECT_TRUE(matches_cpu(one, gen, options)) << "[" << r.begin << ", " << r.end << ")";
    }
  }
}

// Long shards: thousands of chunks per shard, so the chunk and shard passes are exercised at
// scale (fp32 accumulation, where any change of order would show).
TEST_F(LocalStatsGpu, ManyChunksBitForBit) {
  const std::int64_t n = quick() ? (1 << 16) : (1 << 22);
  const std::vector<ShardDesc> shards = {
      box(1, {n}, {0}, {n}),
      box(2, {n / 1024, 1024}, {3, 0}, {n / 1024 - 5, 1000}),
      box(3, {n}, {0}, {n}, ElementRange{12345, n - 77}),
  };
  StatsOptions options;
  options.accumulation = Accumulation::fp32;
  options.p_values = {1};
  for (GradientMode mode : {GradientMode::normal, GradientMode::uniform})
    EXPECT_TRUE(matches_cpu(shards, {run_seed(), mode, Dtype::bf16}, options));
}

TEST_F(LocalStatsGpu, SameInputsSameBits) {
  Random rng(run_seed() ^ 0xD1CE);
  const std::int64_t max_logical = quick() ? (1 << 13) : (1 << 18);
  for (int c = 0; c < 5; ++c) {
    std::vector<ShardDesc> shards = random_shards(rng, max_logical);
    shards.push_back(box(99, {70000}, {0}, {70000}, ElementRange{3, 69001}));
    for (Accumulation acc : {Accumulation::fp32, Accumulation::fp64}) {
      StatsOptions options;
      options.accumulation = acc;
      options.per_tensor = true;
      options.p_values = {1.5, 3};
      const GeneratorSpec gen{rng.bits(), GradientMode::normal, Dtype::fp16};
      const LocalStats a = local_stats_cuda(shards, gen, options);
      const LocalStats b = local_stats_cuda(shards, gen, options);
      ASSERT_TRUE(same_bits(a.total, b.total)) << describe(shards, gen, options);
      ASSERT_EQ(a.per_tensor.size(), b.per_tensor.size());
      for (std::size_t i = 0; i < a.per_tensor.size(); ++i)
        ASSERT_TRUE(same_bits(a.per_tensor[i], b.per_tensor[i])) << "shard " << i;
    }
  }
}

TEST_F(LocalStatsGpu, InvalidInputsThrowBeforeAnyWork) {
  const GeneratorSpec gen{1, GradientMode::ones, Dtype::fp32};
  const std::vector<ShardDesc> bad = {box(0, {4, 5}, {1, 0}, {4, 5})};
  EXPECT_THROW(local_stats_cuda(bad, gen, StatsOptions{}), std::invalid_argument);
  EXPECT_THROW(clip_scale_cuda(bad, gen, ClipSpec{}), std::invalid_argument);
  StatsOptions options;
  for (double p : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    options.p_values = {p};
    EXPECT_THROW(local_stats_cuda({}, gen, options), std::invalid_argument) << p;
  }
}

// ---- Clip scale
// ----------------------------------------------------------------------------------

// The visited logical indices of a shard, by plain nested loops over the padded box.
std::vector<std::int64_t> visited_indices(const ShardDesc& s) {
  std::array<std::int64_t, 4> shape{1, 1, 1, 1}, offset{0, 0, 0, 0}, extent{1, 1, 1, 1};
  const int pad = 4 - s.ndim;
  for (int d = 0; d < s.ndim; ++d) {
    shape[pad + d] = s.shape[d];
    offset[pad + d] = s.offset[d];
    extent[pad + d] = s.extent[d];
  }
  std::vector<std::int64_t> all;
  for (std::int64_t i0 = 0; i0 < extent[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < extent[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < extent[2]; ++i2)
        for (std::int64_t i3 = 0; i3 < extent[3]; ++i3)
          all.push_back(
              (((offset[0] + i0) * shape[1] + offset[1] + i1) * shape[2] + offset[2] + i2) *
                  shape[3] +
              offset[3] + i3);
  if (!s.range) return all;
  return {all.begin() + s.range->begin, all.begin() + s.range->end};
}

TEST_F(LocalStatsGpu, ClipScaleEqualsApplyClip) {
  Random rng(run_seed() ^ 0xC11F);
  const int cases = quick() ? 6 : 60;
  const std::int64_t max_logical = quick() ? (1 << 12) : (1 << 16);
  for (int c = 0; c < cases; ++c) {
    const std::vector<ShardDesc> shards = random_shards(rng, max_logical);
    const GeneratorSpec gen{
        rng.bits(),
        rng.pick(std::vector<GradientMode>(kAllGradientModes.begin(), kAllGradientModes.end())),
        rng.pick(std::vector<Dtype>(kAllDtypes.begin(), kAllDtypes.end()))};
    ClipSpec clip;
    clip.coefficient = std::ldexp(static_cast<float>(rng.uniform(1, 1 << 24)), -24) * 1.5f;
    const std::vector<std::optional<Dtype>> stores = {std::nullopt, Dtype::fp32, Dtype::bf16,
                                                      Dtype::fp16};
    clip.store_as = rng.pick(stores);
    const std::vector<float> got = clip_scale_cuda(shards, gen, clip);
    std::vector<float> want;
    for (const ShardDesc& s : shards)
      for (std::int64_t i : visited_indices(s)) {
        const float g = gradient_value(gen, s.param_id, static_cast<std::uint64_t>(i));
        want.push_back(clip.store_as ? apply_clip(g, clip.coefficient, *clip.store_as)
                                     : apply_clip(g, clip.coefficient));
      }
    ASSERT_EQ(got.size(), want.size()) << "run seed " << run_seed() << ", case " << c;
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
          << "element " << i << ": " << got[i] << " vs " << want[i] << ", run seed " << run_seed()
          << ", case " << c << "\n"
          << describe(shards, gen, StatsOptions{});
    EXPECT_EQ(got, clip_scale_cpu(shards, gen, clip));
  }
}

}  // namespace
}  // namespace tally::kernels
