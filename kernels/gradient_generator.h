// Gradient values: a pure function of (seed, logical param id, logical element index), computed
// bit for bit identically on the host and in CUDA device code, so every rank materialises its own
// shard without communication and the oracle materialises the whole logical tensor.
//
// Header only. The functions marked TALLY_HOST_DEVICE use plain integer and floating-point
// arithmetic and no std:: facility in device code; nvcc compiles this header as it is.
//
// Generator (the choice, and why). The per-element draw is a 64-bit mixing hash:
//   key   = stream_key(seed, param) = mix64(mix64(seed ^ kSeedSalt) ^ (param * kParamOdd))
//   draw  = mix64(key ^ ((4 * element + lane) * kGolden)),   lane in 0..3 (one per draw needed)
// where mix64 is the splitmix64 finaliser (Steele, Lea & Flood 2014; Stafford's "Mix13"
// constants), a bijection on 64 bits with full avalanche; kGolden = 2^64 / phi (odd). For a fixed
// seed, distinct params get distinct keys (every step is a bijection). Philox4x32-10 is the
// textbook counter-based generator; a single mix64 costs about a fifth of its arithmetic per
// element on a CPU, passes the same statistical batteries as splitmix64's output, and tally needs
// determinism and decorrelation, not cryptographic strength. The key is hoisted per tensor.
//
// Modes (the "generated" value is a double; the stored value is that double rounded once, round
// to nearest even, to the storage dtype, then widened to float):
//   ones          1
//   zeros         +0
//   dyadic        k/8, k uniform on {-8, ..., 8} (17 values, P(0) = 1/17). Squares are multiples
//                 of 2^-6 no larger than 1, so sums of squares of up to 2^47 elements are exact in
//                 fp64 (|g|^3 sums up to 2^44, |g|^4 up to 2^41); every value is exact in fp32,
//                 bf16 and fp16.
//   uniform       m * 2^-52 - 1 with m uniform on [0, 2^53): the generated value is in [-1, 1);
//                 the stored value is in [-1, 1] (values within half an ulp of 1 round up to 1).
//   normal        Box-Muller: sqrt(-2 ln u1) * cos(2 pi u2), u1 = (m + 1) * 2^-53 in (0, 1] from
//                 lane 0, u2 = lane 1 / 2^64; |g| <= 8.58. ln and cos are fdlibm's polynomial
//                 kernels evaluated with correctly rounded +, -, *, / and sqrt only, with every
//                 product kept out of fused multiply-adds (see detail::mul), so host and device
//                 give the same bits; both are within a few ulp of the exact functions.
//   sparse        0 with probability 7/8 (lane 2's top three bits not all zero); otherwise the
//                 normal mode's value of the same element.
//   rank-encoded  s * 2^(c - 3): c in {0, ..., 6} uniform and sign s from the hash of (seed,
//                 param, element). Squares are the powers of four 4^-3 ... 4^3, so the fp64 sum of
//                 squares over any multiset of elements is sum_c n_c * 4^(c-3), exact for up to
//                 2^41 elements: one element missing or counted twice changes it by exactly
//                 +-4^(c-3), naming its class, and two equal-size slices of one tensor almost
//                 never have the same class histogram, so reading the wrong slice changes the norm
//                 even where the element count (ones mode, the ledger) does not. Values are exact
//                 in fp32, bf16 and fp16.
// Exact modes (mode_is_exact): ones, zeros, dyadic, rank-encoded. Their generated values are
// representable in every dtype, so storage never rounds them.
//
// Rounding to the storage dtype (round_to_*_bits) is integer bit manipulation on the double's
// bits: round to nearest, ties to even, gradual underflow to subnormals, overflow to +-inf, NaN to
// the quiet NaN of the same sign (payload dropped). One rounding from the double, never via fp32.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#if !defined(__CUDA_ARCH__)
#include <bit>
#include <cfloat>
#include <cmath>
#endif

#if defined(__CUDACC__)
#define TALLY_HOST_DEVICE __host__ __device__
#else
#define TALLY_HOST_DEVICE
#endif

#if !defined(__CUDA_ARCH__)
#if defined(__FAST_MATH__)
#error "kernels/gradient_generator.h needs IEEE arithmetic: do not build tally with -ffast-math"
#endif
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "kernels/gradient_generator.h needs FLT_EVAL_METHOD == 0 (SSE2 or similar, not x87)"
#endif
#endif

namespace tally::kernels {

enum class GradientMode : std::uint8_t {
  ones,
  zeros,
  dyadic,
  uniform,
  normal,
  sparse,
  rank_encoded,
};
inline constexpr int kGradientModeCount = 7;
inline constexpr std::array<GradientMode, kGradientModeCount> kAllGradientModes = {
    GradientMode::ones,   GradientMode::zeros,  GradientMode::dyadic,      GradientMode::uniform,
    GradientMode::normal, GradientMode::sparse, GradientMode::rank_encoded};

enum class Dtype : std::uint8_t { fp32, bf16, fp16 };
inline constexpr int kDtypeCount = 3;
inline constexpr std::array<Dtype, kDtypeCount> kAllDtypes = {Dtype::fp32, Dtype::bf16,
                                                              Dtype::fp16};

// Exact modes: values (and the fp64 sums the oracle compares bit for bit) are exact.
TALLY_HOST_DEVICE constexpr bool mode_is_exact(GradientMode mode) {
  return mode == GradientMode::ones || mode == GradientMode::zeros ||
         mode == GradientMode::dyadic || mode == GradientMode::rank_encoded;
}

// The probability that a sparse-mode element is nonzero (it is then a normal-mode value).
inline constexpr double kSparseNonzeroFraction = 1.0 / 8.0;

// Names as the CLI and case files spell them (host only).
inline std::string_view mode_name(GradientMode mode) {
  switch (mode) {
    case GradientMode::ones: return "ones";
    case GradientMode::zeros: return "zeros";
    case GradientMode::dyadic: return "dyadic";
    case GradientMode::uniform: return "uniform";
    case GradientMode::normal: return "normal";
    case GradientMode::sparse: return "sparse";
    case GradientMode::rank_encoded: return "rank-encoded";
  }
  return "?";
}
inline std::optional<GradientMode> mode_from_name(std::string_view name) {
  for (GradientMode mode : kAllGradientModes)
    if (mode_name(mode) == name) return mode;
  return std::nullopt;
}
inline std::string_view dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp32: return "fp32";
    case Dtype::bf16: return "bf16";
    case Dtype::fp16: return "fp16";
  }
  return "?";
}
inline std::optional<Dtype> dtype_from_name(std::string_view name) {
  for (Dtype dtype : kAllDtypes)
    if (dtype_name(dtype) == name) return dtype;
  return std::nullopt;
}

// Values a case states for one param instead of generating them, as a bug report gives them
// (vocab::param_generators resolves them per param). The stated double is rounded once to the
// dtype, like a generated one. Host only: the CUDA kernels refuse a spec that states values, and
// the path computes those params on the CPU.
struct StatedValues {
  enum class Kind : std::uint8_t { none, constant, scaled, listed };
  Kind kind = Kind::none;
  double number = 0.0;           // constant: the value; scaled: the factor on the generated value
  const double* list = nullptr;  // listed: one value per element of the logical tensor, row-major;
  std::int64_t count = 0;        // the list belongs to the case, which outlives every spec
  friend bool operator==(const StatedValues&, const StatedValues&) = default;
};

// The generator settings of one case (or, with `stated`, of one param).
struct GeneratorSpec {
  std::uint64_t seed = 0;
  GradientMode mode = GradientMode::normal;
  Dtype dtype = Dtype::fp32;
  StatedValues stated;
  friend bool operator==(const GeneratorSpec&, const GeneratorSpec&) = default;
};
inline bool states_values(const GeneratorSpec& spec) {
  return spec.stated.kind != StatedValues::Kind::none;
}

namespace detail {

inline constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;    // 2^64 / phi, odd
inline constexpr std::uint64_t kSeedSalt = 0x243F6A8885A308D3ull;  // pi's fraction bits
inline constexpr std::uint64_t kParamOdd = 0xD1B54A32D192ED03ull;  // odd

// splitmix64's finaliser: a bijection with full avalanche.
TALLY_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The 64 random bits of one draw; lane < 4 separates the draws one element needs.
TALLY_HOST_DEVICE constexpr std::uint64_t draw(std::uint64_t key, std::uint64_t element,
                                               unsigned lane) {
  return mix64(key ^ ((element * 4u + lane) * kGolden));
}

TALLY_HOST_DEVICE inline double double_from_bits(std::uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  return std::bit_cast<double>(bits);
#endif
}
TALLY_HOST_DEVICE inline std::uint64_t double_bits(double value) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint64_t>(__double_as_longlong(value));
#else
  return std::bit_cast<std::uint64_t>(value);
#endif
}
TALLY_HOST_DEVICE inline float float_from_bits(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}
TALLY_HOST_DEVICE inline std::uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  return std::bit_cast<std::uint32_t>(value);
#endif
}

// A correctly rounded product that the compiler can never fuse with a following addition into
// an FMA (nvcc does so by default, host compilers do with FMA targets and -ffp-contract=fast):
// __dmul_rn is documented never to be merged; on the host an empty asm makes the product opaque.
TALLY_HOST_DEVICE inline double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  double product = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(product));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(product));
#elif defined(__GNUC__)
  __asm__("" : "+m"(product));
#endif
  return product;
#endif
}
TALLY_HOST_DEVICE inline float mulf(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  float product = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(product));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(product));
#elif defined(__GNUC__)
  __asm__("" : "+m"(product));
#endif
  return product;
#endif
}
TALLY_HOST_DEVICE inline double div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
TALLY_HOST_DEVICE inline double sqrt_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// ln(v * 2^-53) for an integer 1 <= v <= 2^53 held exactly in a double. fdlibm's e_log.c:
// v = 2^k (1 + f) with sqrt(2)/2 <= 1 + f < sqrt(2), ln(1 + f) = 2 atanh(s), s = f / (2 + f).
TALLY_HOST_DEVICE inline double ln_scaled(double v) {
  constexpr double ln2_hi = 0x1.62e42feep-1;
  constexpr double ln2_lo = 0x1.a39ef35793c76p-33;
  constexpr double Lg1 = 0x1.5555555555593p-1, Lg2 = 0x1.999999997fa04p-2,
                   Lg3 = 0x1.2492494229359p-2, Lg4 = 0x1.c71c51d8e78afp-3,
                   Lg5 = 0x1.7466496cb03dep-3, Lg6 = 0x1.39a09d078c69fp-3,
                   Lg7 = 0x1.2f112df3e5244p-3;
  constexpr double sqrt2 = 0x1.6a09e667f3bcdp+0;
  const std::uint64_t bits = double_bits(v);
  const std::uint64_t m_bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;  // [1, 2)
  // Above sqrt(2): halve m (exact) and bump k. Integer selects keep the branch predictor out.
  const std::uint64_t fold = m_bits > double_bits(sqrt2) ? 1u : 0u;
  const int k = static_cast<int>(bits >> 52) - 1023 + static_cast<int>(fold);
  const double m = double_from_bits(m_bits - (fold << 52));
  const double f = m - 1.0;  // exact (Sterbenz)
  const double dk = static_cast<double>(k - 53);
  const double hfsq = mul(0.5, mul(f, f));
  const double s = div(f, 2.0 + f);
  const double z = mul(s, s);
  const double w = mul(z, z);
  const double t1 = mul(w, Lg2 + mul(w, Lg4 + mul(w, Lg6)));
  const double t2 = mul(z, Lg1 + mul(w, Lg3 + mul(w, Lg5 + mul(w, Lg7))));
  const double r = t2 + t1;
  return mul(dk, ln2_hi) - ((hfsq - (mul(s, hfsq + r) + mul(dk, ln2_lo))) - f);
}

// fdlibm's k_sin.c and k_cos.c for |x| <= pi/4 (tail y = 0).
TALLY_HOST_DEVICE inline double kernel_sin(double x) {
  constexpr double S1 = -0x1.5555555555549p-3, S2 = 0x1.111111110f8a6p-7,
                   S3 = -0x1.a01a019c161d5p-13, S4 = 0x1.71de357b1fe7dp-19,
                   S5 = -0x1.ae5e68a2b9cebp-26, S6 = 0x1.5d93a5acfd57cp-33;
  const double z = mul(x, x);
  const double v = mul(z, x);
  const double r = S2 + mul(z, S3 + mul(z, S4 + mul(z, S5 + mul(z, S6))));
  return x + mul(v, S1 + mul(z, r));
}
TALLY_HOST_DEVICE inline double kernel_cos(double x) {
  constexpr double C1 = 0x1.555555555554cp-5, C2 = -0x1.6c16c16c15177p-10,
                   C3 = 0x1.a01a019cb159p-16, C4 = -0x1.27e4f809c52adp-22,
                   C5 = 0x1.1ee9ebdb4b1c4p-29, C6 = -0x1.8fae9be8838d4p-37;
  const double z = mul(x, x);
  const double r = mul(z, C1 + mul(z, C2 + mul(z, C3 + mul(z, C4 + mul(z, C5 + mul(z, C6))))));
  // fdlibm splits 1 - z/2 as (1 - q) - (z/2 - q) above |x| = 0.3 to gain under an ulp there; the
  // single form keeps this branch-free and stays within 2 ulp (tested).
  return 1.0 - (mul(0.5, z) - mul(z, r));
}

// cos(2 pi t / 2^64) from the integer t. The quadrant comes from the top two bits; within it the
// angle is folded to [0, pi/4] by integer arithmetic, so only the kernels see a rounded angle.
TALLY_HOST_DEVICE inline double cos_turns(std::uint64_t t) {
  constexpr double half_pi = 0x1.921fb54442d18p+0;
  const unsigned quadrant = static_cast<unsigned>(t >> 62);
  const std::uint64_t within = t << 2;  // fraction of the quadrant, in units of 2^-64
  const bool mirror = (within >> 63) != 0;
  const std::uint64_t a = mirror ? (0 - within) : within;  // in [0, 2^63]
  const double y = mul(mul(static_cast<double>(a >> 11), 0x1p-53), half_pi);  // [0, pi/4]
  // x = the angle within the quadrant: cos x = kernel_cos(y) or, mirrored, kernel_sin(y).
  // cos(q pi/2 + x) is cos x, -sin x, -cos x, sin x for q = 0, 1, 2, 3. Selected without branches.
  const double c = kernel_cos(y), s = kernel_sin(y);
  const bool use_sin = mirror != ((quadrant & 1u) != 0);
  const std::uint64_t negate = static_cast<std::uint64_t>(((quadrant + 1u) >> 1) & 1u) << 63;
  return double_from_bits(double_bits(use_sin ? s : c) ^ negate);
}

// Bits of `value` rounded (nearest, ties to even) to a binary format with `precision` significand
// bits (implicit bit included), normal exponents in [emin, emax] and `exponent_bits` exponent
// bits; the sign is the top bit of the (precision + exponent_bits)-bit pattern.
TALLY_HOST_DEVICE constexpr std::uint32_t round_double_bits(std::uint64_t bits, int precision,
                                                           int emin, int emax,
                                                           int exponent_bits) {
  const int width = precision + exponent_bits;
  const std::uint32_t sign = static_cast<std::uint32_t>(bits >> 63) << (width - 1);
  const std::uint32_t exp_ones = ((1u << exponent_bits) - 1u) << (precision - 1);
  const int biased = static_cast<int>((bits >> 52) & 0x7FF);
  const std::uint64_t fraction = bits & 0x000FFFFFFFFFFFFFull;
  if (biased == 0x7FF)  // inf, or NaN made quiet
    return fraction != 0 ? (sign | exp_ones | (1u << (precision - 2))) : (sign | exp_ones);
  if (biased == 0) return sign;  // +-0, or a double subnormal: far below every format's range
  const int e = biased - 1023;
  if (e > emax) return sign | exp_ones;  // >= 2^(emax + 1): overflow
  const std::uint64_t significand = fraction | (std::uint64_t{1} << 52);
  int drop = 52 - (precision - 1);
  if (e < emin) drop += emin - e;  // subnormal in the target: fewer bits survive
  std::uint64_t kept = 0;
  if (drop < 54) {  // drop >= 54: below half the smallest subnormal, rounds to 0
    kept = significand >> drop;
    const std::uint64_t rest = significand & ((std::uint64_t{1} << drop) - 1);
    const std::uint64_t half = std::uint64_t{1} << (drop - 1);
    kept += static_cast<std::uint64_t>(rest > half) |
            (static_cast<std::uint64_t>(rest == half) & kept);  // ties to even
  }
  // (exponent field - 1) << mantissa bits, plus the significand with its implicit bit: a carry
  // out of the significand bumps the exponent, up to the inf pattern; subnormals add to 0.
  const std::uint32_t base =
      e >= emin ? static_cast<std::uint32_t>(e - emin) << (precision - 1) : 0u;
  return sign | (base + static_cast<std::uint32_t>(kept));
}

}  // namespace detail

// ---- Storage dtypes: rounding (integer bit manipulation) and widening -------------------------

TALLY_HOST_DEVICE inline std::uint32_t round_to_fp32_bits(double value) {
  return detail::round_double_bits(detail::double_bits(value), 24, -126, 127, 8);
}
TALLY_HOST_DEVICE inline std::uint16_t round_to_bf16_bits(double value) {
  return static_cast<std::uint16_t>(
      detail::round_double_bits(detail::double_bits(value), 8, -126, 127, 8));
}
TALLY_HOST_DEVICE inline std::uint16_t round_to_fp16_bits(double value) {
  return static_cast<std::uint16_t>(
      detail::round_double_bits(detail::double_bits(value), 11, -14, 15, 5));
}

TALLY_HOST_DEVICE inline float fp32_from_bits(std::uint32_t bits) {
  return detail::float_from_bits(bits);
}
TALLY_HOST_DEVICE inline float bf16_to_float(std::uint16_t bits) {
  return detail::float_from_bits(static_cast<std::uint32_t>(bits) << 16);
}
TALLY_HOST_DEVICE inline float fp16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return detail::float_from_bits(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return detail::float_from_bits(sign);
    int e = -14;  // subnormal: normalise, every fp16 subnormal is a normal fp32
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    return detail::float_from_bits(sign | (static_cast<std::uint32_t>(e + 127) << 23) |
                                   ((mantissa & 0x3FFu) << 13));
  }
  return detail::float_from_bits(sign | ((exponent - 15u + 127u) << 23) | (mantissa << 13));
}

// `value` rounded once to the dtype, widened back to float (exact).
template <Dtype D>
TALLY_HOST_DEVICE inline float round_to(double value) {
  if constexpr (D == Dtype::fp32) return fp32_from_bits(round_to_fp32_bits(value));
  else if constexpr (D == Dtype::bf16) return bf16_to_float(round_to_bf16_bits(value));
  else return fp16_to_float(round_to_fp16_bits(value));
}
TALLY_HOST_DEVICE inline float round_to(double value, Dtype dtype) {
  switch (dtype) {
    case Dtype::fp32: return round_to<Dtype::fp32>(value);
    case Dtype::bf16: return round_to<Dtype::bf16>(value);
    default: return round_to<Dtype::fp16>(value);
  }
}

// ---- The generator -----------------------------------------------------------------------------

// The per-(seed, param) stream key; compute it once per tensor.
TALLY_HOST_DEVICE constexpr std::uint64_t stream_key(std::uint64_t seed, std::uint64_t param) {
  return detail::mix64(detail::mix64(seed ^ detail::kSeedSalt) ^ (param * detail::kParamOdd));
}

namespace detail {
TALLY_HOST_DEVICE inline double normal_value(std::uint64_t key, std::uint64_t element) {
  const double v = static_cast<double>((draw(key, element, 0) >> 11) + 1);  // [1, 2^53], exact
  const double radius = sqrt_rn(mul(-2.0, ln_scaled(v)));
  return mul(radius, cos_turns(draw(key, element, 1)));
}
}  // namespace detail

// The generated (unrounded) value of element `element` of the stream `key`.
template <GradientMode M>
TALLY_HOST_DEVICE inline double generated_value(std::uint64_t key, std::uint64_t element) {
  if constexpr (M == GradientMode::ones) {
    return 1.0;
  } else if constexpr (M == GradientMode::zeros) {
    return 0.0;
  } else if constexpr (M == GradientMode::dyadic) {
    const std::uint64_t h = detail::draw(key, element, 0);
    const int k = static_cast<int>(((h >> 32) * 17u) >> 32) - 8;  // uniform on [-8, 8]
    return static_cast<double>(k) * 0.125;
  } else if constexpr (M == GradientMode::uniform) {
    const std::uint64_t h = detail::draw(key, element, 0);
    return detail::mul(static_cast<double>(h >> 11), 0x1p-52) - 1.0;  // exact
  } else if constexpr (M == GradientMode::normal) {
    return detail::normal_value(key, element);
  } else if constexpr (M == GradientMode::sparse) {
    if ((detail::draw(key, element, 2) >> 61) != 0) return 0.0;
    return detail::normal_value(key, element);
  } else {  // rank_encoded
    const std::uint64_t h = detail::draw(key, element, 0);
    const std::uint64_t c = ((h >> 32) * 7u) >> 32;  // uniform on [0, 6]
    return detail::double_from_bits(((h & 1u) << 63) | ((1023u + c - 3u) << 52));
  }
}

// The stored value (generated, rounded to D, widened to float): what every rank and the oracle
// read. Exact modes skip the rounding, which is the identity for them.
template <GradientMode M, Dtype D>
TALLY_HOST_DEVICE inline float stored_value(std::uint64_t key, std::uint64_t element) {
  if constexpr (mode_is_exact(M)) return static_cast<float>(generated_value<M>(key, element));
  else return round_to<D>(generated_value<M>(key, element));
}

TALLY_HOST_DEVICE inline double generated_value(GradientMode mode, std::uint64_t key,
                                                std::uint64_t element) {
  switch (mode) {
    case GradientMode::ones: return generated_value<GradientMode::ones>(key, element);
    case GradientMode::zeros: return generated_value<GradientMode::zeros>(key, element);
    case GradientMode::dyadic: return generated_value<GradientMode::dyadic>(key, element);
    case GradientMode::uniform: return generated_value<GradientMode::uniform>(key, element);
    case GradientMode::normal: return generated_value<GradientMode::normal>(key, element);
    case GradientMode::sparse: return generated_value<GradientMode::sparse>(key, element);
    default: return generated_value<GradientMode::rank_encoded>(key, element);
  }
}

TALLY_HOST_DEVICE inline float stored_value(GradientMode mode, Dtype dtype, std::uint64_t key,
                                            std::uint64_t element) {
  const double value = generated_value(mode, key, element);
  return mode_is_exact(mode) ? static_cast<float>(value) : round_to(value, dtype);
}

#if !defined(__CUDA_ARCH__)
// The stored value of element `element` of a param whose values the case states (host only).
inline float stated_value(const GeneratorSpec& spec, std::uint64_t key, std::uint64_t element) {
  const StatedValues& s = spec.stated;
  switch (s.kind) {
    case StatedValues::Kind::constant: return round_to(s.number, spec.dtype);
    case StatedValues::Kind::scaled:
      return round_to(generated_value(spec.mode, key, element) * s.number, spec.dtype);
    case StatedValues::Kind::listed:
      return element < static_cast<std::uint64_t>(s.count) ? round_to(s.list[element], spec.dtype)
                                                           : 0.0f;
    case StatedValues::Kind::none: break;
  }
  return stored_value(spec.mode, spec.dtype, key, element);
}

// What every host reader of one param's values calls: stated or generated, with the key hoisted.
inline float stored_value(const GeneratorSpec& spec, std::uint64_t key, std::uint64_t element) {
  return states_values(spec) ? stated_value(spec, key, element)
                             : stored_value(spec.mode, spec.dtype, key, element);
}
#endif

// Element `element` (row-major index in the logical tensor) of logical parameter `param`.
TALLY_HOST_DEVICE inline float gradient_value(const GeneratorSpec& spec, std::uint64_t param,
                                              std::uint64_t element) {
#if !defined(__CUDA_ARCH__)
  return stored_value(spec, stream_key(spec.seed, param), element);
#else
  return stored_value(spec.mode, spec.dtype, stream_key(spec.seed, param), element);
#endif
}

}  // namespace tally::kernels
