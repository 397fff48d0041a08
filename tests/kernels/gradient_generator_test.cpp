#include "kernels/gradient_generator.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

namespace tally::kernels {
namespace {

std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }
std::uint64_t bits_of(double value) { return std::bit_cast<std::uint64_t>(value); }

// ---- Names -------------------------------------------------------------------------------------

TEST(GradientNames, ModesRoundTrip) {
  const std::array<std::string_view, kGradientModeCount> names = {
      "ones", "zeros", "dyadic", "uniform", "normal", "sparse", "rank-encoded"};
  for (int i = 0; i < kGradientModeCount; ++i) {
    EXPECT_EQ(mode_name(kAllGradientModes[i]), names[i]);
    EXPECT_EQ(mode_from_name(names[i]), kAllGradientModes[i]);
  }
  EXPECT_EQ(mode_from_name("Ones"), std::nullopt);
  EXPECT_EQ(mode_from_name("rank_encoded"), std::nullopt);
  EXPECT_EQ(mode_from_name(""), std::nullopt);
}

TEST(GradientNames, DtypesRoundTrip) {
  const std::array<std::string_view, kDtypeCount> names = {"fp32", "bf16", "fp16"};
  for (int i = 0; i < kDtypeCount; ++i) {
    EXPECT_EQ(dtype_name(kAllDtypes[i]), names[i]);
    EXPECT_EQ(dtype_from_name(names[i]), kAllDtypes[i]);
  }
  EXPECT_EQ(dtype_from_name("float32"), std::nullopt);
  EXPECT_EQ(dtype_from_name("FP16"), std::nullopt);
}

TEST(GradientNames, ExactModes) {
  for (GradientMode mode : kAllGradientModes) {
    const bool expected = mode == GradientMode::ones || mode == GradientMode::zeros ||
                          mode == GradientMode::dyadic || mode == GradientMode::rank_encoded;
    EXPECT_EQ(mode_is_exact(mode), expected) << mode_name(mode);
  }
}

// ---- Stability ---------------------------------------------------------------------------------

// Case files record seeds, so these bits are part of the replay format: a change here breaks the
// replay of every recorded case and needs a case-file version bump.
TEST(GradientGenerator, GoldenValuesPinTheStream) {
  struct Golden {
    GradientMode mode;
    Dtype dtype;
    std::array<std::uint32_t, 4> bits;  // elements 0, 1, 12345, 2^40 of param 17, seed 20240601
  };
  const Golden golden[] = {
      {GradientMode::ones, Dtype::bf16, {0x3f800000u, 0x3f800000u, 0x3f800000u, 0x3f800000u}},
      {GradientMode::zeros, Dtype::fp16, {0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}},
      {GradientMode::dyadic, Dtype::fp32, {0xbec00000u, 0xbf600000u, 0xbec00000u, 0x3ec00000u}},
      {GradientMode::uniform, Dtype::fp32, {0xbec3438bu, 0xbf581feeu, 0xbeae5793u, 0x3eb712d6u}},
      {GradientMode::uniform, Dtype::bf16, {0xbec30000u, 0xbf580000u, 0xbeae0000u, 0x3eb70000u}},
      {GradientMode::uniform, Dtype::fp16, {0xbec34000u, 0xbf582000u, 0xbeae6000u, 0x3eb72000u}},
      {GradientMode::normal, Dtype::fp32, {0xbeb575ecu, 0xbf2dda86u, 0xbfbb79d4u, 0x3f5d5211u}},
      {GradientMode::normal, Dtype::bf16, {0xbeb50000u, 0xbf2e0000u, 0xbfbb0000u, 0x3f5d0000u}},
      {GradientMode::normal, Dtype::fp16, {0xbeb58000u, 0xbf2de000u, 0xbfbb8000u, 0x3f5d6000u}},
      {GradientMode::sparse, Dtype::fp32, {0x00000000u, 0xbf2dda86u, 0x00000000u, 0x3f5d5211u}},
      {GradientMode::rank_encoded, Dtype::fp16,
       {0xbf000000u, 0x3e000000u, 0x3f000000u, 0x40000000u}},
  };
  EXPECT_EQ(stream_key(20240601, 17), 0xe9b4c6c07740e1a7ull);
  const std::array<std::uint64_t, 4> elements = {0, 1, 12345, std::uint64_t{1} << 40};
  for (const Golden& g : golden) {
    const GeneratorSpec spec{20240601, g.mode, g.dtype};
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(bits_of(gradient_value(spec, 17, elements[i])), g.bits[i])
          << mode_name(g.mode) << " " << dtype_name(g.dtype) << " element " << elements[i];
  }
}

template <GradientMode M, Dtype D>
void expect_same_bits_every_way(std::uint64_t seed, std::uint64_t param) {
  const std::uint64_t key = stream_key(seed, param);
  const GeneratorSpec spec{seed, M, D};
  constexpr std::uint64_t n = 4096;
  std::vector<std::uint32_t> forward(n);
  for (std::uint64_t i = 0; i < n; ++i) forward[i] = bits_of(gradient_value(spec, param, i));
  for (std::uint64_t i = n; i-- > 0;) {
    ASSERT_EQ(bits_of(gradient_value(spec, param, i)), forward[i]) << i;
    ASSERT_EQ(bits_of(stored_value<M, D>(key, i)), forward[i]) << i;
    ASSERT_EQ(bits_of(stored_value(M, D, key, i)), forward[i]) << i;
    ASSERT_EQ(bits_of(round_to(generated_value<M>(key, i), D)), forward[i]) << i;
    ASSERT_EQ(bits_of(generated_value<M>(key, i)), bits_of(generated_value(M, key, i))) << i;
  }
}

template <GradientMode M>
void expect_same_bits_every_dtype(std::uint64_t seed, std::uint64_t param) {
  expect_same_bits_every_way<M, Dtype::fp32>(seed, param);
  expect_same_bits_every_way<M, Dtype::bf16>(seed, param);
  expect_same_bits_every_way<M, Dtype::fp16>(seed, param);
}

TEST(GradientGenerator, SameElementSameBitsByEveryPath) {
  for (std::uint64_t seed : {0ull, 1ull, 0xFFFFFFFFFFFFFFFFull}) {
    expect_same_bits_every_dtype<GradientMode::ones>(seed, 3);
    expect_same_bits_every_dtype<GradientMode::zeros>(seed, 3);
    expect_same_bits_every_dtype<GradientMode::dyadic>(seed, 3);
    expect_same_bits_every_dtype<GradientMode::uniform>(seed, 3);
    expect_same_bits_every_dtype<GradientMode::normal>(seed, 3);
    expect_same_bits_every_dtype<GradientMode::sparse>(seed, 3);
    expect_same_bits_every_dtype<GradientMode::rank_encoded>(seed, 3);
  }
}

TEST(GradientGenerator, ParamsAndSeedsGiveDifferentStreams) {
  const GeneratorSpec a{7, GradientMode::uniform, Dtype::fp32};
  const GeneratorSpec b{8, GradientMode::uniform, Dtype::fp32};
  int same_param = 0, same_seed = 0;
  constexpr int n = 100000;
  for (int i = 0; i < n; ++i) {
    const float v = gradient_value(a, 0, i);
    same_param += v == gradient_value(a, 1, i) ? 1 : 0;
    same_seed += v == gradient_value(b, 0, i) ? 1 : 0;
  }
  EXPECT_LT(same_param, 10);  // fp32 uniform values coincide with probability ~2^-24
  EXPECT_LT(same_seed, 10);
}

// ---- Exact modes -------------------------------------------------------------------------------

TEST(GradientGenerator, ExactModesAreExactInEveryDtype) {
  constexpr int n = 200000;
  std::map<double, int> dyadic_values, rank_values;
  for (GradientMode mode : kAllGradientModes) {
    if (!mode_is_exact(mode)) continue;
    const std::uint64_t key = stream_key(99, 5);
    for (int i = 0; i < n; ++i) {
      const double g = generated_value(mode, key, i);
      for (Dtype dtype : kAllDtypes) {
        ASSERT_EQ(bits_of(static_cast<double>(round_to(g, dtype))), bits_of(g))
            << mode_name(mode) << " " << dtype_name(dtype) << " element " << i;
        ASSERT_EQ(bits_of(static_cast<double>(stored_value(mode, dtype, key, i))), bits_of(g));
      }
      switch (mode) {
        case GradientMode::ones: ASSERT_EQ(bits_of(g), bits_of(1.0)); break;
        case GradientMode::zeros: ASSERT_EQ(bits_of(g), 0u); break;  // +0, not -0
        case GradientMode::dyadic: {
          const double k = g * 8;
          ASSERT_EQ(k, std::floor(k));
          ASSERT_LE(std::fabs(k), 8);
          ++dyadic_values[g];
          break;
        }
        default: {  // rank-encoded: +-2^(c-3), c in 0..6
          int exponent = 0;
          const double mantissa = std::frexp(std::fabs(g), &exponent);
          ASSERT_EQ(mantissa, 0.5);
          ASSERT_GE(exponent - 1, -3);
          ASSERT_LE(exponent - 1, 3);
          ++rank_values[g];
        }
      }
    }
  }
  EXPECT_EQ(dyadic_values.size(), 17u);
  EXPECT_EQ(rank_values.size(), 14u);  // 7 magnitudes, 2 signs
  // Each value's frequency within 5 sigma of uniform.
  for (const auto& [value, count] : dyadic_values) {
    const double p = 1.0 / 17, sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(count, n * p, 5 * sigma) << value;
  }
  for (const auto& [value, count] : rank_values) {
    const double p = 1.0 / 14, sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(count, n * p, 5 * sigma) << value;
  }
}

TEST(GradientGenerator, ExactModeSumsAreExactInFp64) {
  constexpr int n = 1 << 18;
  const std::uint64_t key = stream_key(3, 4);
  double dyadic_squares = 0, dyadic_cubes = 0, rank_squares = 0;
  std::int64_t dyadic_units = 0, dyadic_cube_units = 0, rank_units = 0;
  for (int i = 0; i < n; ++i) {
    const double d = generated_value<GradientMode::dyadic>(key, i);
    dyadic_squares += d * d;
    dyadic_cubes += std::fabs(d) * d * d;
    const auto k = static_cast<std::int64_t>(d * 8);
    dyadic_units += k * k;                       // units of 2^-6
    dyadic_cube_units += std::abs(k) * k * k;    // units of 2^-9
    const double r = generated_value<GradientMode::rank_encoded>(key, i);
    rank_squares += r * r;
    rank_units += static_cast<std::int64_t>(r * r * 64);  // units of 4^-3
  }
  EXPECT_EQ(dyadic_squares, std::ldexp(static_cast<double>(dyadic_units), -6));
  EXPECT_EQ(dyadic_cubes, std::ldexp(static_cast<double>(dyadic_cube_units), -9));
  EXPECT_EQ(rank_squares, std::ldexp(static_cast<double>(rank_units), -6));
}

// One element counted twice shows up as exactly +4^(c-3) in the rank-encoded sum of squares.
TEST(GradientGenerator, RankEncodedDuplicateNamesItsClass) {
  const std::uint64_t key = stream_key(11, 2);
  double once = 0;
  for (int i = 0; i < 1000; ++i) {
    const double r = generated_value<GradientMode::rank_encoded>(key, i);
    once += r * r;
  }
  const double extra = generated_value<GradientMode::rank_encoded>(key, 417);
  const double twice = once + extra * extra;
  EXPECT_EQ(twice - once, extra * extra);
}

// ---- Storage rounding --------------------------------------------------------------------------

double from_bits(std::uint64_t bits) { return std::bit_cast<double>(bits); }
double f32(std::uint32_t bits) { return static_cast<double>(std::bit_cast<float>(bits)); }

TEST(StorageRounding, Bf16KnownPatterns) {
  struct Case {
    double in;
    std::uint16_t out;
  };
  const Case cases[] = {
      {1.0, 0x3F80},
      {-2.0, 0xC000},
      {0.0, 0x0000},
      {-0.0, 0x8000},
      {f32(0x3F808000), 0x3F80},  // 1 + 2^-8: tie, lower is even
      {f32(0x3F818000), 0x3F82},  // tie, lower is odd: up
      {f32(0x3F808001), 0x3F81},  // just above the tie
      {f32(0x3F807FFF), 0x3F80},  // just below the tie
      {f32(0xBF818000), 0xBF82},  // negative tie: away from zero to the even neighbour
      {f32(0x7F7F7FFF), 0x7F7F},  // below the half-way point to 2^128: max finite
      {f32(0x7F7F8000), 0x7F80},  // tie between max finite (odd) and 2^128: overflow to inf
      {f32(0x7F7FFFFF), 0x7F80},  // FLT_MAX rounds to inf
      {1e300, 0x7F80},
      {-1e300, 0xFF80},
      {std::numeric_limits<double>::infinity(), 0x7F80},
      {-std::numeric_limits<double>::infinity(), 0xFF80},
      {std::numeric_limits<double>::quiet_NaN(), 0x7FC0},
      {-std::numeric_limits<double>::quiet_NaN(), 0xFFC0},
      {from_bits(0x7FF0000000000001ull), 0x7FC0},  // signalling NaN becomes quiet
      {f32(0x00010000), 0x0001},                   // 2^-133: smallest subnormal
      {f32(0x00008000), 0x0000},                   // 2^-134: tie with 0, 0 is even
      {f32(0x00008001), 0x0001},                   // above that tie
      {f32(0x00018000), 0x0002},                   // 1.5 * 2^-133: tie, up to even
      {f32(0x007F8000), 0x0080},                   // largest subnormals round up to 2^-126
      {f32(0x007F7FFF), 0x007F},
      {f32(0x00800000), 0x0080},  // 2^-126: smallest normal
      {f32(0x00000001), 0x0000},  // 2^-149
      {-f32(0x00000001), 0x8000},
      {1e-300, 0x0000},
      {from_bits(1), 0x0000},  // a double subnormal
      {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), 0x3F81},  // rounded once, from double
  };
  for (const Case& c : cases)
    EXPECT_EQ(round_to_bf16_bits(c.in), c.out) << std::hexfloat << c.in;
}

TEST(StorageRounding, Fp16KnownPatterns) {
  struct Case {
    double in;
    std::uint16_t out;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {1.0, 0x3C00},
      {-1.0, 0xBC00},
      {0.5, 0x3800},
      {-0.0, 0x8000},
      {65504.0, 0x7BFF},              // max finite
      {65519.99, 0x7BFF},             // below the half-way point to 65536
      {65520.0, 0x7C00},              // tie between 65504 (odd) and 65536: inf
      {-65520.0, 0xFC00},
      {1e6, 0x7C00},
      {inf, 0x7C00},
      {-inf, 0xFC00},
      {std::numeric_limits<double>::quiet_NaN(), 0x7E00},
      {std::ldexp(1.0, -14), 0x0400},           // smallest normal
      {std::ldexp(1.0, -24), 0x0001},           // smallest subnormal
      {std::ldexp(1.0, -25), 0x0000},           // tie with 0: even
      {std::ldexp(1.0, -25) * 1.0000001, 0x0001},
      {-std::ldexp(1.0, -25) * 1.0000001, 0x8001},
      {std::ldexp(3.0, -25), 0x0002},           // 1.5 * 2^-24: tie, up to even
      {std::ldexp(5.0, -25), 0x0002},           // 2.5 * 2^-24: tie, down to even
      {std::ldexp(1023.5, -24), 0x0400},        // tie above the largest subnormal: to 2^-14
      {std::ldexp(1022.5, -24), 0x03FE},        // tie: down to even
      {1.0 + std::ldexp(1.0, -11), 0x3C00},     // tie, lower is even
      {1.0 + std::ldexp(3.0, -11), 0x3C02},     // tie, lower is odd
      {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -50), 0x3C01},
      {0.1, 0x2E66},
      {1e-10, 0x0000},
      {-1e-10, 0x8000},
  };
  for (const Case& c : cases)
    EXPECT_EQ(round_to_fp16_bits(c.in), c.out) << std::hexfloat << c.in;
}

TEST(StorageRounding, Fp32KnownPatterns) {
  struct Case {
    double in;
    std::uint32_t out;
  };
  const Case cases[] = {
      {1.0, 0x3F800000u},
      {1.0 + std::ldexp(1.0, -24), 0x3F800000u},  // tie, even
      {1.0 + std::ldexp(3.0, -24), 0x3F800002u},  // tie, odd: up
      {std::ldexp(1.0, -149), 0x00000001u},
      {std::ldexp(1.0, -150), 0x00000000u},         // tie with 0
      {std::ldexp(3.0, -150), 0x00000002u},
      {-std::ldexp(1.0, -151), 0x80000000u},
      {3.4028234663852886e38, 0x7F7FFFFFu},
      {std::ldexp(2.0 - std::ldexp(1.0, -24), 127), 0x7F800000u},  // tie with 2^128: inf
      {std::numeric_limits<double>::max(), 0x7F800000u},
      {-std::numeric_limits<double>::max(), 0xFF800000u},
      {std::numeric_limits<double>::quiet_NaN(), 0x7FC00000u},
      {0.1, 0x3DCCCCCDu},
  };
  for (const Case& c : cases)
    EXPECT_EQ(round_to_fp32_bits(c.in), c.out) << std::hexfloat << c.in;
}

// An independent reference: scale onto the format's integer grid, round with std::nearbyint (ties
// to even in the default rounding mode), scale back, overflow past the largest finite to inf.
double reference_round(double x, int precision, int emin, int emax) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const int quantum = std::max(std::ilogb(x), emin) - (precision - 1);
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -quantum)), quantum);
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, 1 - precision), emax);
  if (std::fabs(r) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return std::copysign(r, x);
}

void expect_matches_reference(double x) {
  struct Format {
    Dtype dtype;
    int precision, emin, emax;
  };
  for (const Format& f : {Format{Dtype::fp32, 24, -126, 127}, Format{Dtype::bf16, 8, -126, 127},
                          Format{Dtype::fp16, 11, -14, 15}}) {
    const double got = round_to(x, f.dtype);
    const double want = reference_round(x, f.precision, f.emin, f.emax);
    if (std::isnan(want)) {
      RC_ASSERT(std::isnan(got));
      RC_ASSERT(std::signbit(got) == std::signbit(want));
    } else {
      RC_ASSERT(bits_of(got) == bits_of(want));
    }
  }
}

// Doubles spread over every exponent that matters to the three formats, with the low bits often
// cut to make ties and near-ties common.
double interesting_double(std::uint64_t r) {
  const std::uint64_t sign = r >> 63;
  const std::uint64_t exponent = 1023 - 160 + (r >> 40) % 300;  // 2^-160 .. 2^139
  std::uint64_t mantissa = r & 0x000FFFFFFFFFFFFFull;
  const int cut = static_cast<int>((r >> 56) % 64);
  if (cut < 52) mantissa &= ~((std::uint64_t{1} << cut) - 1);
  return std::bit_cast<double>((sign << 63) | (exponent << 52) | mantissa);
}

RC_GTEST_PROP(StorageRounding, MatchesTheNearbyintReference, (std::uint64_t r)) {
  expect_matches_reference(interesting_double(r));
  expect_matches_reference(std::bit_cast<double>(r));  // anything, NaNs and subnormals included
}

TEST(StorageRounding, MatchesHardwareConversionsOnManyDoubles) {
  std::uint64_t state = 12345;
  for (int i = 0; i < 1000000; ++i) {
    state = detail::mix64(state + detail::kGolden);
    const double x = interesting_double(state);
    ASSERT_EQ(round_to_fp32_bits(x), bits_of(static_cast<float>(x))) << std::hexfloat << x;
#if defined(__FLT16_MANT_DIG__)
    ASSERT_EQ(round_to_fp16_bits(x), std::bit_cast<std::uint16_t>(static_cast<_Float16>(x)))
        << std::hexfloat << x;
#endif
  }
}

TEST(StorageRounding, WideningRoundTripsEveryPattern) {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float bf = bf16_to_float(bits);
    const float hf = fp16_to_float(bits);
    const bool bf_nan = (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0;
    const bool hf_nan = (b & 0x7C00) == 0x7C00 && (b & 0x3FF) != 0;
    ASSERT_EQ(std::isnan(bf), bf_nan) << b;
    ASSERT_EQ(std::isnan(hf), hf_nan) << b;
    ASSERT_EQ(round_to_bf16_bits(bf), bf_nan ? ((b & 0x8000) | 0x7FC0) : b) << b;
    ASSERT_EQ(round_to_fp16_bits(hf), hf_nan ? ((b & 0x8000) | 0x7E00) : b) << b;
    ASSERT_EQ(round_to_fp32_bits(bf),
              bf_nan ? ((bits_of(bf) & 0x80000000u) | 0x7FC00000u) : bits_of(bf));
#if defined(__FLT16_MANT_DIG__)
    if (!hf_nan) {
      ASSERT_EQ(bits_of(hf), bits_of(static_cast<float>(std::bit_cast<_Float16>(bits)))) << b;
    }
#endif
  }
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));
}

// ---- The elementary functions of the normal mode ------------------------------------------------

TEST(GradientGenerator, LnAndCosKernelsAreAccurate) {
  const long double two_pi = 6.283185307179586476925286766559005768L;
  double ln_error = 0, cos_error = 0;
  std::uint64_t state = 7;
  for (int i = 0; i < 200000; ++i) {
    state = detail::mix64(state + detail::kGolden);
    const double v = static_cast<double>((state >> (11 + i % 53)) + 1);
    const long double ln_exact = std::log(static_cast<long double>(v)) - 53 * std::log(2.0L);
    ln_error = std::max(ln_error, static_cast<double>(std::fabs(detail::ln_scaled(v) - ln_exact)));
    const std::uint64_t t = detail::mix64(state);
    const long double angle = two_pi * std::ldexp(static_cast<long double>(t), -64);
    cos_error =
        std::max(cos_error, static_cast<double>(std::fabs(detail::cos_turns(t) - std::cos(angle))));
  }
  EXPECT_LT(ln_error, 4e-15);  // |ln| <= 36.8: a few ulp
  EXPECT_LT(cos_error, 1e-15);
  EXPECT_EQ(detail::ln_scaled(std::ldexp(1.0, 53)), 0.0);
  EXPECT_EQ(detail::cos_turns(0), 1.0);
  EXPECT_EQ(detail::cos_turns(std::uint64_t{1} << 63), -1.0);
  EXPECT_EQ(detail::cos_turns(std::uint64_t{3} << 62), 0.0);
}

// ---- Distributions -----------------------------------------------------------------------------

struct Moments {
  double mean = 0, m2 = 0, m4 = 0, min = 1e300, max = -1e300, zero_fraction = 0,
         within_one = 0;
};

Moments moments(const GeneratorSpec& spec, int n) {
  Moments m;
  const std::uint64_t key = stream_key(spec.seed, 42);
  for (int i = 0; i < n; ++i) {
    const double g = stored_value(spec.mode, spec.dtype, key, i);
    m.mean += g;
    m.m2 += g * g;
    m.m4 += g * g * g * g;
    m.min = std::min(m.min, g);
    m.max = std::max(m.max, g);
    m.zero_fraction += g == 0 ? 1 : 0;
    m.within_one += std::fabs(g) < 1 ? 1 : 0;
  }
  m.mean /= n;
  m.m2 /= n;
  m.m4 /= n;
  m.zero_fraction /= n;
  m.within_one /= n;
  return m;
}

constexpr int kDraws = 1000000;

TEST(GradientDistribution, UniformOnMinusOneOne) {
  const Moments m = moments({5, GradientMode::uniform, Dtype::fp32}, kDraws);
  EXPECT_NEAR(m.mean, 0.0, 5 * std::sqrt(1.0 / 3 / kDraws));
  EXPECT_NEAR(m.m2, 1.0 / 3, 5 * std::sqrt(4.0 / 45 / kDraws));
  EXPECT_GE(m.min, -1.0);
  EXPECT_LE(m.max, 1.0);
  EXPECT_LT(m.min, -0.999);
  EXPECT_GT(m.max, 0.999);
  const std::uint64_t key = stream_key(5, 42);
  for (int i = 0; i < 100000; ++i) {
    const double g = generated_value<GradientMode::uniform>(key, i);
    ASSERT_GE(g, -1.0);
    ASSERT_LT(g, 1.0);
  }
}

TEST(GradientDistribution, NormalIsStandardNormal) {
  for (Dtype dtype : {Dtype::fp32, Dtype::bf16}) {
    const Moments m = moments({6, GradientMode::normal, dtype}, kDraws);
    EXPECT_NEAR(m.mean, 0.0, 5 * std::sqrt(1.0 / kDraws));
    EXPECT_NEAR(m.m2, 1.0, 5 * std::sqrt(2.0 / kDraws) + 1e-3);      // bf16 rounding adds ~1e-5
    EXPECT_NEAR(m.m4, 3.0, 5 * std::sqrt(96.0 / kDraws) + 1e-2);
    const double p = 0.6826894921370859;  // P(|z| < 1)
    EXPECT_NEAR(m.within_one, p, 5 * std::sqrt(p * (1 - p) / kDraws) + 1e-3);
    EXPECT_LE(std::max(-m.min, m.max), 8.58);
    EXPECT_GT(std::max(-m.min, m.max), 4.0);
  }
}

TEST(GradientDistribution, SparseIsMostlyExactZeros) {
  const GeneratorSpec sparse{8, GradientMode::sparse, Dtype::fp16};
  const Moments m = moments(sparse, kDraws);
  const double p = 1 - kSparseNonzeroFraction;
  EXPECT_NEAR(m.zero_fraction, p, 5 * std::sqrt(p * (1 - p) / kDraws));
  // The nonzero elements are the normal mode's values of the same elements.
  const GeneratorSpec normal{8, GradientMode::normal, Dtype::fp16};
  for (int i = 0; i < 100000; ++i) {
    const float g = gradient_value(sparse, 42, i);
    const float expected = g != 0 ? gradient_value(normal, 42, i) : 0.0f;
    ASSERT_EQ(bits_of(g), bits_of(expected)) << i;  // zeros are +0
  }
}

// ---- Properties --------------------------------------------------------------------------------

RC_GTEST_PROP(GradientGenerator, StoredValuesAreFiniteRepresentableAndStable,
              (std::uint64_t seed, std::uint64_t param, std::uint64_t element)) {
  for (GradientMode mode : kAllGradientModes) {
    for (Dtype dtype : kAllDtypes) {
      const GeneratorSpec spec{seed, mode, dtype};
      const float g = gradient_value(spec, param, element);
      RC_ASSERT(std::isfinite(g));
      RC_ASSERT(bits_of(round_to(g, dtype)) == bits_of(g));
      RC_ASSERT(bits_of(gradient_value(spec, param, element)) == bits_of(g));
      const double generated = generated_value(mode, stream_key(seed, param), element);
      if (mode_is_exact(mode)) RC_ASSERT(bits_of(static_cast<double>(g)) == bits_of(generated));
      if (mode == GradientMode::uniform) RC_ASSERT(std::fabs(g) <= 1.0f);
    }
  }
}

}  // namespace
}  // namespace tally::kernels
