#include "kernels/local_stats.h"

#include "kernels/clip_scale.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>
#include "tests/support/shards.h"

namespace tally::kernels {
namespace {

std::uint64_t bits_of(double value) { return std::bit_cast<std::uint64_t>(value); }
std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }

using testing::box;

// ---- The naive reference -----------------------------------------------------------------------
// It materialises the whole logical tensor, lists the visited logical indices with plain nested
// loops over the box, and sums in the order local_stats.h documents, one element at a time.

std::vector<std::int64_t> visited_indices(const ShardDesc& s) {
  std::array<std::int64_t, 4> shape{1, 1, 1, 1}, offset{0, 0, 0, 0}, extent{1, 1, 1, 1};
  const int pad = 4 - s.ndim;  // leading dimensions of size 1
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

std::vector<float> materialise(const ShardDesc& s, const GeneratorSpec& gen) {
  std::int64_t numel = 1;
  for (int d = 0; d < s.ndim; ++d) numel *= s.shape[d];
  std::vector<float> tensor(static_cast<std::size_t>(numel));
  for (std::int64_t i = 0; i < numel; ++i) tensor[i] = gradient_value(gen, s.param_id, i);
  return tensor;
}

template <class A, class Term>
A reference_sum(const std::vector<float>& values, Term term) {
  A lanes[8] = {};
  A sum = 0;
  const std::size_t n = values.size();
  for (std::size_t v = 0; v < n; ++v) {
    lanes[v % 8] += term(static_cast<A>(values[v]));
    if ((v + 1) % kStatsChunk == 0 || v + 1 == n) {
      sum += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
             ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
      std::fill(std::begin(lanes), std::end(lanes), A(0));
    }
  }
  return sum;
}

template <class A>
A reference_power(A a, double p) {
  a = std::fabs(a);
  if (p == std::floor(p) && p >= 1 && p <= 8) {
    A r = a;
    for (int k = 1; k < static_cast<int>(p); ++k) r = r * a;
    return r;
  }
  return std::pow(a, static_cast<A>(p));
}

template <class A>
LocalStats reference_stats(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                           const std::vector<double>& ps) {
  LocalStats out;
  A total = 0;
  std::vector<A> p_totals(ps.size(), A(0));
  out.total.p_sums.assign(ps.size(), 0.0);
  for (const ShardDesc& s : shards) {
    const std::vector<float> tensor = materialise(s, gen);
    std::vector<float> values;
    for (std::int64_t i : visited_indices(s)) values.push_back(tensor[i]);
    Stats st;
    const A sq = reference_sum<A>(values, [](A a) { return a * a; });
    st.sum_squares = sq;
    for (float g : values) {
      st.abs_max = std::max(st.abs_max, static_cast<double>(std::fabs(g)));
      st.zeros += g == 0 ? 1 : 0;
    }
    st.elements = static_cast<std::int64_t>(values.size());
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const A ps_sum =
          reference_sum<A>(values, [&](A a) { return reference_power(a, ps[i]); });
      st.p_sums.push_back(ps_sum);
      p_totals[i] += ps_sum;
    }
    total += sq;
    out.total.abs_max = std::max(out.total.abs_max, st.abs_max);
    out.total.zeros += st.zeros;
    out.total.elements += st.elements;
    out.per_tensor.push_back(st);
  }
  out.total.sum_squares = total;
  for (std::size_t i = 0; i < ps.size(); ++i) out.total.p_sums[i] = p_totals[i];
  return out;
}

LocalStats reference_stats(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                           const StatsOptions& options) {
  return options.accumulation == Accumulation::fp64
             ? reference_stats<double>(shards, gen, options.p_values)
             : reference_stats<float>(shards, gen, options.p_values);
}

bool same_bits(const Stats& a, const Stats& b) {
  if (bits_of(a.sum_squares) != bits_of(b.sum_squares) ||
      bits_of(a.abs_max) != bits_of(b.abs_max) || a.zeros != b.zeros ||
      a.elements != b.elements || a.p_sums.size() != b.p_sums.size())
    return false;
  for (std::size_t i = 0; i < a.p_sums.size(); ++i)
    if (bits_of(a.p_sums[i]) != bits_of(b.p_sums[i])) return false;
  return true;
}

std::string describe(const Stats& s) {
  std::string out = "sumsq " + std::to_string(s.sum_squares) + " absmax " +
                    std::to_string(s.abs_max) + " zeros " + std::to_string(s.zeros) +
                    " elements " + std::to_string(s.elements) + " p:";
  for (double p : s.p_sums) out += " " + std::to_string(p);
  return out;
}

// Compares the implementation with the reference bit for bit, per shard and in total.
::testing::AssertionResult matches_reference(std::span<const ShardDesc> shards,
                                             const GeneratorSpec& gen, StatsOptions options) {
  options.per_tensor = true;
  const LocalStats got = local_stats_cpu(shards, gen, options);
  const LocalStats want = reference_stats(shards, gen, options);
  if (got.per_tensor.size() != shards.size())
    return ::testing::AssertionFailure() << "per_tensor has " << got.per_tensor.size();
  for (std::size_t i = 0; i < shards.size(); ++i)
    if (!same_bits(got.per_tensor[i], want.per_tensor[i]))
      return ::testing::AssertionFailure()
             << "shard " << i << ": got " << describe(got.per_tensor[i]) << ", want "
             << describe(want.per_tensor[i]);
  if (!same_bits(got.total, want.total))
    return ::testing::AssertionFailure()
           << "total: got " << describe(got.total) << ", want " << describe(want.total);
  return ::testing::AssertionSuccess();
}

// ---- Exact cases -------------------------------------------------------------------------------

const std::vector<ShardDesc>& sample_boxes() {
  static const std::vector<ShardDesc> boxes = {
      box(0, {64, 48}, {0, 0}, {64, 48}),               // a whole matrix
      box(1, {64, 48}, {32, 0}, {32, 48}),              // row-parallel half
      box(2, {64, 48}, {0, 12}, {64, 12}),              // column shard: 64 runs of 12
      box(3, {5, 7, 9, 11}, {1, 2, 3, 4}, {3, 4, 5, 6}),  // a 4-d box
      box(4, {1000}, {100}, {900}, ElementRange{17, 613}),
      box(5, {}, {}, {}),  // a scalar
  };
  return boxes;
}

TEST(LocalStats, OnesCountTheElements) {
  const auto& shards = sample_boxes();
  const std::int64_t expected = 64 * 48 + 32 * 48 + 64 * 12 + 3 * 4 * 5 * 6 + (613 - 17) + 1;
  for (Dtype dtype : kAllDtypes) {
    for (Accumulation acc : {Accumulation::fp64, Accumulation::fp32}) {
      StatsOptions options;
      options.accumulation = acc;
      options.p_values = {1, 2, 3.5};
      const Stats s = local_stats_cpu(shards, {1, GradientMode::ones, dtype}, options).total;
      EXPECT_EQ(s.elements, expected);
      EXPECT_EQ(s.sum_squares, static_cast<double>(expected));
      EXPECT_EQ(s.abs_max, 1.0);
      EXPECT_EQ(s.zeros, 0);
      EXPECT_EQ(s.p_sums, std::vector<double>(3, static_cast<double>(expected)));
    }
  }
}

TEST(LocalStats, ZerosCountAsZeros) {
  const auto& shards = sample_boxes();
  StatsOptions options;
  options.p_values = {1};
  options.per_tensor = true;
  const LocalStats s = local_stats_cpu(shards, {1, GradientMode::zeros, Dtype::bf16}, options);
  EXPECT_EQ(s.total.zeros, s.total.elements);
  EXPECT_EQ(s.total.sum_squares, 0.0);
  EXPECT_EQ(s.total.abs_max, 0.0);
  EXPECT_EQ(s.total.p_sums, std::vector<double>{0.0});
  for (std::size_t i = 0; i < shards.size(); ++i) {
    EXPECT_EQ(s.per_tensor[i].zeros, visited_numel(shards[i]));
    EXPECT_EQ(s.per_tensor[i].elements, visited_numel(shards[i]));
  }
}

TEST(LocalStats, EmptyInputsGiveZero) {
  StatsOptions options;
  options.p_values = {2, 0.5};
  options.per_tensor = true;
  const GeneratorSpec gen{1, GradientMode::ones, Dtype::fp32};
  const LocalStats none = local_stats_cpu({}, gen, options);
  EXPECT_EQ(none.total, (Stats{0, 0, 0, 0, {0, 0}}));
  EXPECT_TRUE(none.per_tensor.empty());
  EXPECT_EQ(bits_of(none.total.sum_squares), 0u);  // +0, not -0

  const std::vector<ShardDesc> empty = {
      box(0, {4, 0}, {0, 0}, {4, 0}),                        // a tensor with no elements
      box(1, {4, 5}, {2, 1}, {0, 3}),                        // an empty box of a nonempty tensor
      box(2, {4, 5}, {1, 1}, {3, 4}, ElementRange{7, 7}),    // an empty range
      box(3, {4, 5}, {0, 0}, {4, 5}, ElementRange{20, 20}),  // an empty range at the end
  };
  for (Accumulation acc : {Accumulation::fp64, Accumulation::fp32}) {
    options.accumulation = acc;
    const LocalStats s = local_stats_cpu(empty, gen, options);
    EXPECT_EQ(s.total, (Stats{0, 0, 0, 0, {0, 0}}));
    ASSERT_EQ(s.per_tensor.size(), empty.size());
    for (const Stats& t : s.per_tensor) EXPECT_EQ(t, (Stats{0, 0, 0, 0, {0, 0}}));
  }
}

TEST(LocalStats, SubRangeVisitsExactlyItsElements) {
  // Three chunks and a ragged tail: 3 * 2048 < 40 * 83 * 2 < 4 * 2048.
  const ShardDesc whole_box = box(9, {2, 50, 97}, {0, 3, 5}, {2, 40, 83});
  for (ElementRange range : {ElementRange{0, 6640}, ElementRange{17, 3000},
                             ElementRange{82, 84}, ElementRange{2047, 6001},
                             ElementRange{6639, 6640}}) {
    ShardDesc shard = whole_box;
    shard.range = range;
    const std::vector<ShardDesc> one = {shard};
    const LocalStats ones =
        local_stats_cpu(one, {1, GradientMode::ones, Dtype::fp32}, StatsOptions{});
    EXPECT_EQ(ones.total.elements, range.end - range.begin);
    EXPECT_EQ(ones.total.sum_squares, static_cast<double>(range.end - range.begin));
    for (GradientMode mode : {GradientMode::dyadic, GradientMode::rank_encoded,
                              GradientMode::normal, GradientMode::sparse}) {
      for (Accumulation acc : {Accumulation::fp64, Accumulation::fp32}) {
        StatsOptions options;
        options.accumulation = acc;
        options.p_values = {1, 3, 1.5};
        EXPECT_TRUE(matches_reference(one, {77, mode, Dtype::bf16}, options))
            << mode_name(mode) << " " << accumulation_name(acc) << " [" << range.begin << ", "
            << range.end << ")";
      }
    }
  }
}

// Every statistic, per shard and in total, equals the one-element-at-a-time reference bit for bit.
TEST(LocalStats, FollowsTheDocumentedOrderBitForBit) {
  const auto& shards = sample_boxes();
  for (GradientMode mode : kAllGradientModes) {
    for (Dtype dtype : kAllDtypes) {
      for (Accumulation acc : {Accumulation::fp64, Accumulation::fp32}) {
        StatsOptions options;
        options.accumulation = acc;
        options.p_values = {1, 2, 4, 0.5, 2.5};
        EXPECT_TRUE(matches_reference(shards, {123, mode, dtype}, options))
            << mode_name(mode) << " " << dtype_name(dtype) << " " << accumulation_name(acc);
      }
    }
  }
}

TEST(LocalStats, SameInputsSameBitsAndTotalsAreShardSumsInOrder) {
  const auto& shards = sample_boxes();
  for (Accumulation acc : {Accumulation::fp64, Accumulation::fp32}) {
    StatsOptions options;
    options.accumulation = acc;
    options.per_tensor = true;
    options.p_values = {1.5};
    const GeneratorSpec gen{5, GradientMode::normal, Dtype::fp32};
    const LocalStats a = local_stats_cpu(shards, gen, options);
    const LocalStats b = local_stats_cpu(shards, gen, options);
    EXPECT_TRUE(same_bits(a.total, b.total));
    double total64 = 0;
    float total32 = 0;
    for (const Stats& s : a.per_tensor) {
      total64 += s.sum_squares;
      total32 += static_cast<float>(s.sum_squares);
    }
    EXPECT_EQ(bits_of(a.total.sum_squares),
              bits_of(acc == Accumulation::fp64 ? total64 : static_cast<double>(total32)));
    // p = 2 is the sum of squares, bit for bit.
    options.p_values = {2};
    const LocalStats c = local_stats_cpu(shards, gen, options);
    EXPECT_EQ(bits_of(c.total.p_sums[0]), bits_of(c.total.sum_squares));
    if (acc == Accumulation::fp32) {
      EXPECT_EQ(a.total.sum_squares, static_cast<float>(a.total.sum_squares));
    }
  }
}

TEST(LocalStats, ExactModesInFp64AreExact) {
  // Splitting a shard's range in two changes nothing in exact modes with fp64 accumulation.
  const ShardDesc whole = box(3, {300, 41}, {0, 0}, {300, 41});
  ShardDesc left = whole, right = whole;
  left.range = ElementRange{0, 5003};
  right.range = ElementRange{5003, 300 * 41};
  const std::vector<ShardDesc> one = {whole}, two = {right, left};
  for (GradientMode mode : {GradientMode::dyadic, GradientMode::rank_encoded}) {
    StatsOptions options;
    options.p_values = {1, 3};
    const GeneratorSpec gen{8, mode, Dtype::fp16};
    const Stats a = local_stats_cpu(one, gen, options).total;
    const Stats b = local_stats_cpu(two, gen, options).total;
    EXPECT_TRUE(same_bits(a, b)) << describe(a) << " vs " << describe(b);
    // And equal to an exact integer computation.
    std::int64_t units = 0;  // of 2^-6
    for (std::int64_t i = 0; i < 300 * 41; ++i) {
      const double g = gradient_value(gen, 3, i);
      units += static_cast<std::int64_t>(g * g * 64);
    }
    EXPECT_EQ(a.sum_squares, std::ldexp(static_cast<double>(units), -6));
  }
}

// fp32 accumulation stays within the bound its order implies: every term is rounded once when
// squared and then passes through at most `depth` roundings of additions of nonnegative numbers.
TEST(LocalStats, Fp32AndFp64DifferWithinTheOrderBound) {
  const std::vector<ShardDesc> shards = {box(0, {300, 400}, {0, 0}, {300, 400}),
                                         box(1, {1024, 96}, {512, 0}, {512, 96}),
                                         box(2, {70000}, {0}, {70000}, ElementRange{5, 69000})};
  for (GradientMode mode : {GradientMode::normal, GradientMode::uniform}) {
    const GeneratorSpec gen{31, mode, Dtype::fp32};
    StatsOptions f64, f32;
    f32.accumulation = Accumulation::fp32;
    const double s64 = local_stats_cpu(shards, gen, f64).total.sum_squares;
    const double s32 = local_stats_cpu(shards, gen, f32).total.sum_squares;
    std::int64_t longest = 0;
    for (const ShardDesc& s : shards) longest = std::max(longest, visited_numel(s));
    const double depth = kStatsChunk / kStatsLanes - 1 + 3 +
                         static_cast<double>((longest + kStatsChunk - 1) / kStatsChunk) +
                         static_cast<double>(shards.size());
    const double bound = (depth + 1) * std::ldexp(1.0, -24) * s64;
    EXPECT_LE(std::fabs(s32 - s64), bound) << mode_name(mode);
    EXPECT_NE(s32, s64) << "random data should show some fp32 rounding";
  }
}

TEST(LocalStats, ScalarsAndFourDimensionalBoxes) {
  StatsOptions options;
  options.per_tensor = true;
  const GeneratorSpec gen{2, GradientMode::dyadic, Dtype::fp32};
  const std::vector<ShardDesc> shards = {box(7, {}, {}, {}),
                                         box(8, {2, 3, 4, 5}, {1, 1, 1, 1}, {1, 2, 3, 4})};
  const LocalStats s = local_stats_cpu(shards, gen, options);
  EXPECT_EQ(s.per_tensor[0].elements, 1);
  const double g = gradient_value(gen, 7, 0);
  EXPECT_EQ(s.per_tensor[0].sum_squares, g * g);
  EXPECT_EQ(s.per_tensor[1].elements, 24);
  double want = 0;
  for (int a = 1; a < 3; ++a)
    for (int b = 1; b < 4; ++b)
      for (int c = 1; c < 5; ++c) {
        const double v = gradient_value(gen, 8, ((1 * 3 + a) * 4 + b) * 5 + c);
        want += v * v;
      }
  EXPECT_EQ(s.per_tensor[1].sum_squares, want);
}

TEST(LocalStats, InvalidDescriptorsThrow) {
  const GeneratorSpec gen{1, GradientMode::ones, Dtype::fp32};
  const std::vector<ShardDesc> bad = {
      box(0, {4, 5}, {1, 0}, {4, 5}),                        // box beyond the shape
      box(0, {4, 5}, {0, -1}, {4, 1}),                       // negative offset
      box(0, {4, 5}, {0, 0}, {4, -1}),                       // negative extent
      box(0, {-4}, {0}, {0}),                                // negative shape
      box(0, {4, 5}, {0, 0}, {4, 5}, ElementRange{3, 21}),   // range beyond the box
      box(0, {4, 5}, {0, 0}, {4, 5}, ElementRange{5, 4}),    // begin > end
      box(0, {4, 5}, {0, 0}, {4, 5}, ElementRange{-1, 4}),   // negative begin
      box(0, {std::int64_t{1} << 40, std::int64_t{1} << 40}, {0, 0}, {1, 1}),  // > 2^63
  };
  for (const ShardDesc& shard : bad) {
    EXPECT_TRUE(check_shard(shard).has_value());
    const std::vector<ShardDesc> one = {shard};
    EXPECT_THROW(local_stats_cpu(one, gen, StatsOptions{}), std::invalid_argument);
  }
  ShardDesc too_many = box(0, {1}, {0}, {1});
  too_many.ndim = 5;
  EXPECT_TRUE(check_shard(too_many).has_value());
  for (double p : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()}) {
    StatsOptions options;
    options.p_values = {p};
    EXPECT_THROW(local_stats_cpu({}, gen, options), std::invalid_argument);
  }
  const std::int64_t five[] = {1, 2, 3, 4, 5};
  EXPECT_THROW(whole_tensor(0, five), std::invalid_argument);
  EXPECT_EQ(check_shard(whole_tensor(0, std::span(five, 4))), std::nullopt);
}

TEST(LocalStats, WholeTensorAndNames) {
  const std::int64_t shape[] = {3, 4};
  const ShardDesc shard = whole_tensor(6, shape);
  EXPECT_EQ(shard, box(6, {3, 4}, {0, 0}, {3, 4}));
  EXPECT_EQ(box_numel(shard), 12);
  EXPECT_EQ(visited_numel(shard), 12);
  EXPECT_EQ(accumulation_from_name("fp32"), Accumulation::fp32);
  EXPECT_EQ(accumulation_from_name("fp64"), Accumulation::fp64);
  EXPECT_EQ(accumulation_from_name("fp16"), std::nullopt);
  EXPECT_EQ(accumulation_name(Accumulation::fp64), "fp64");
}

// ---- Clipping ----------------------------------------------------------------------------------

TEST(Clip, IsOneFp32MultiplyAsMegatronScales) {
  // The Megatron-LM invariant: all gradients 1, max_norm = sqrt(N) / 2; the coefficient is a
  // Python float narrowed to the kernel's float scale; every clipped gradient equals it.
  const double n = 12345;
  const double coefficient = (std::sqrt(n) / 2) / (std::sqrt(n) + 1e-6);
  const auto scale = static_cast<float>(coefficient);
  EXPECT_EQ(bits_of(apply_clip(1.0f, scale)), bits_of(scale));
  std::uint64_t state = 3;
  for (int i = 0; i < 100000; ++i) {
    state = detail::mix64(state + detail::kGolden);
    const float g = gradient_value({state, GradientMode::normal, Dtype::fp32}, 0, 0);
    const float c = std::ldexp(static_cast<float>(state >> 40), -24);  // [0, 1)
    volatile float product = g * c;  // one fp32 multiply, rounded once
    ASSERT_EQ(bits_of(apply_clip(g, c)), bits_of(static_cast<float>(product)));
    ASSERT_EQ(bits_of(apply_clip(g, c, Dtype::bf16)),
              bits_of(round_to(static_cast<double>(static_cast<float>(product)), Dtype::bf16)));
  }
  // 1.5f * 0.1f = 0.15000000596f, stored as bf16 0.150390625.
  EXPECT_EQ(apply_clip(1.5f, 0.1f, Dtype::bf16), bf16_to_float(0x3E1A));
}

// ---- Properties over random boxes --------------------------------------------------------------

// RapidCheck scales inRange by the test's size; a shard's sizes should span their whole range from
// the first test on, so the shard is generated at the nominal size.
rc::Gen<ShardDesc> arbitrary_shard() {
  return rc::gen::resize(100, rc::gen::exec([] {
    ShardDesc s;
    s.param_id = *rc::gen::inRange<std::uint64_t>(0, 1000);
    s.ndim = *rc::gen::inRange(0, kMaxDims + 1);
    // Small enough that the reference stays fast, large enough to cross chunks in 1 and 2 dims.
    static constexpr std::int64_t kMaxSize[] = {1, 20000, 200, 30, 12};
    std::int64_t numel = 1;
    for (int d = 0; d < s.ndim; ++d) {
      const std::int64_t max = kMaxSize[s.ndim];
      s.shape[d] = *rc::gen::inRange<std::int64_t>(*rc::gen::element(std::int64_t{0}, max / 2),
                                                   max + 1);
      if (*rc::gen::arbitrary<bool>()) {  // often the whole dimension, so boxes cross chunks
        s.offset[d] = 0;
        s.extent[d] = s.shape[d];
      } else {
        s.offset[d] = *rc::gen::inRange<std::int64_t>(0, s.shape[d] + 1);
        s.extent[d] = *rc::gen::inRange<std::int64_t>(0, s.shape[d] - s.offset[d] + 1);
      }
      numel *= s.extent[d];
    }
    if (*rc::gen::arbitrary<bool>()) {
      const auto begin = *rc::gen::inRange<std::int64_t>(0, numel + 1);
      const auto end = *rc::gen::inRange<std::int64_t>(begin, numel + 1);
      s.range = ElementRange{begin, end};
    }
    return s;
  }));
}

RC_GTEST_PROP(LocalStatsProperty, MatchesTheReferenceOnRandomBoxes, ()) {
  const auto shards = *rc::gen::container<std::vector<ShardDesc>>(
      *rc::gen::resize(100, rc::gen::inRange<std::size_t>(0, 4)), arbitrary_shard());
  const GeneratorSpec gen{*rc::gen::arbitrary<std::uint64_t>(),
                          *rc::gen::elementOf(kAllGradientModes), *rc::gen::elementOf(kAllDtypes)};
  StatsOptions options;
  options.accumulation = *rc::gen::element(Accumulation::fp32, Accumulation::fp64);
  options.p_values = *rc::gen::container<std::vector<double>>(
      *rc::gen::inRange<std::size_t>(0, 3), rc::gen::element(1.0, 2.0, 3.0, 0.5, 2.5));
  const auto result = matches_reference(shards, gen, options);
  RC_ASSERT(static_cast<bool>(result));
}

RC_GTEST_PROP(LocalStatsProperty, OnesVisitExactlyTheRange, ()) {
  const ShardDesc shard = *arbitrary_shard();
  const std::vector<ShardDesc> one = {shard};
  StatsOptions options;
  options.accumulation = *rc::gen::element(Accumulation::fp32, Accumulation::fp64);
  const Stats s = local_stats_cpu(one, {1, GradientMode::ones, Dtype::bf16}, options).total;
  const auto n = static_cast<std::int64_t>(visited_indices(shard).size());
  RC_ASSERT(s.elements == n);
  RC_ASSERT(s.sum_squares == static_cast<double>(n));
  RC_ASSERT(s.abs_max == (n > 0 ? 1.0 : 0.0));
  RC_ASSERT(s.zeros == 0);
}

RC_GTEST_PROP(LocalStatsProperty, SplittingTheRangeAddsUp, ()) {
  ShardDesc shard = *arbitrary_shard();
  const std::int64_t numel = box_numel(shard);
  const auto mid = *rc::gen::inRange<std::int64_t>(0, numel + 1);
  ShardDesc left = shard, right = shard;
  left.range = ElementRange{0, mid};
  right.range = ElementRange{mid, numel};
  shard.range.reset();
  const std::vector<ShardDesc> whole = {shard}, halves = {left, right};
  const GeneratorSpec gen{*rc::gen::arbitrary<std::uint64_t>(),
                          *rc::gen::element(GradientMode::dyadic, GradientMode::rank_encoded,
                                            GradientMode::sparse),
                          Dtype::fp16};
  StatsOptions options;
  options.per_tensor = true;
  const LocalStats a = local_stats_cpu(whole, gen, options);
  const LocalStats b = local_stats_cpu(halves, gen, options);
  RC_ASSERT(a.total.elements == b.total.elements);
  RC_ASSERT(a.total.zeros == b.total.zeros);
  RC_ASSERT(a.total.abs_max == b.total.abs_max);
  RC_ASSERT(b.per_tensor[0].elements == mid);
  if (mode_is_exact(gen.mode)) RC_ASSERT(a.total.sum_squares == b.total.sum_squares);
}

}  // namespace
}  // namespace tally::kernels
