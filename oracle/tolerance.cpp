#include "oracle/tolerance.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace tally::oracle {
namespace {

constexpr double kU64 = 0x1p-53;
constexpr double kU32 = 0x1p-24;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kRoundUp = 1.0 + 0x1p-40;  // covers the evaluation of the bound itself
// The oracle's own relative errors (oracle/ground_truth.h).
constexpr double kOracleSum = (1.0 + 0x1p-9) * kU64;
constexpr double kOraclePSum = 2.03 * kU64;

// The absolute error of one underflowing product: at most half the smallest subnormal (fp64:
// the smallest subnormal itself, half of it is not a double).
double underflow_unit(kernels::Accumulation a) {
  return a == kernels::Accumulation::fp32 ? 0x1p-150 : 0x1p-1074;
}

double round_up(double bound) { return bound > 0.0 ? bound * kRoundUp : bound; }

// Relative bound on sqrt(x^) (1 + d) against sqrt(x) when |x^ / x - 1| <= g and |d| <= u
// (item 6), written without cancellation.
double sqrt_relative(double g, double u) {
  if (g >= 1.0) return kInf;
  const double up = g / (1.0 + std::sqrt(1.0 + g));    // sqrt(1 + g) - 1
  const double down = g / (1.0 + std::sqrt(1.0 - g));  // 1 - sqrt(1 - g)
  return std::max(up + u + up * u, down + u - down * u);
}

// Relative bound on x^^q against x^q when |x^ / x - 1| <= g, q > 0.
double power_relative(double g, double q) {
  if (g >= 1.0) return kInf;
  return std::max(std::expm1(q * std::log1p(g)), -std::expm1(q * std::log1p(-g)));
}

// Relative bound on pow(P^, fl(1/p)) (1 + d) against P^(1/p) (item 7): the sum's error g, the
// rounding of 1/p in a type of unit u (none when p is a power of two), pow's < 1 ulp.
double root_relative(double g, double p, double sum, double u) {
  const double q = 1.0 / p;
  const double a = power_relative(g, q);
  int exponent = 0;
  const bool q_exact = std::frexp(p, &exponent) == 0.5;  // p a power of two: 1/p exact
  const double log_sum = sum > 0.0 ? std::abs(std::log(sum)) + 1.0 : 0.0;  // +1: slack
  const double b = q_exact ? 0.0 : std::expm1(log_sum * q * u);
  const double c = 2.0 * u;
  return a + b + c + a * b + c * (a + b) + a * b * c;  // (1 + a)(1 + b)(1 + c) - 1, expanded
}

// |path - truth| from the path's and the oracle's relative errors against the exact value,
// converted to the truth's scale (the exact value is at most truth / (1 - oracle)).
double combine(double path_rel, double oracle_rel, double truth) {
  if (!(oracle_rel < 1.0)) return kInf;
  return round_up((path_rel + oracle_rel) * truth / (1.0 - oracle_rel));
}

int term_roundings_square(kernels::Accumulation local) {
  return local == kernels::Accumulation::fp32 ? 1 : 0;  // a float's square is exact in fp64
}

int term_roundings_power(kernels::Accumulation local, double p) {
  const bool integer = p == std::floor(p) && p >= 1.0 && p <= 8.0;  // local_stats' rule
  if (!integer) return 2;  // std::pow, < 1 ulp
  const int n = static_cast<int>(p);
  return local == kernels::Accumulation::fp32 ? n - 1 : std::max(n - 2, 0);
}

}  // namespace

double unit_roundoff(kernels::Accumulation accumulation) {
  return accumulation == kernels::Accumulation::fp32 ? kU32 : kU64;
}

double gamma_of(double eps) { return eps < 1.0 ? eps / (1.0 - eps) : kInf; }

std::int64_t local_chain_length(std::int64_t n, std::int64_t shards, int term_roundings) {
  if (n <= 0) return term_roundings;
  const std::int64_t in_chunk = std::min(n, kernels::kStatsChunk);
  const std::int64_t lane_terms = (in_chunk + kernels::kStatsLanes - 1) / kernels::kStatsLanes;
  const std::int64_t chunks = (n + kernels::kStatsChunk - 1) / kernels::kStatsChunk;
  return term_roundings + (lane_terms - 1) + 3 + (chunks - 1) + std::max<std::int64_t>(shards - 1, 0);
}

Tolerance tolerance(const ReductionModel& m, const GroupTruth& truth) {
  Tolerance t;
  const double u_l = unit_roundoff(m.local), u_r = unit_roundoff(m.reduction);
  const bool fp64_everywhere =
      m.local == kernels::Accumulation::fp64 && m.reduction == kernels::Accumulation::fp64;
  // Exact values summed in fp64 give exact sums (ground_truth.h): no rounding before the
  // combination steps, and no underflow (exact-mode values are 0 or >= 2^-3).
  const bool exact_sums = m.exact_mode && fp64_everywhere;
  const double eta_unit = m.exact_mode ? 0.0 : underflow_unit(m.local);

  std::int64_t reduction_adds = 0;
  for (int g : m.reduction_groups) reduction_adds += std::max(g - 1, 0);
  const int conversion =
      m.local == kernels::Accumulation::fp64 && m.reduction == kernels::Accumulation::fp32 ? 1 : 0;
  const int children = std::max(m.children, 1);
  const int combination = children > 1 ? children + 2 : 0;  // item 5
  const int sqrt_square = m.local_sqrt_square ? 3 : 0;

  // Sum of squares and L2 norm.
  t.local_chain =
      (exact_sums ? 0 : local_chain_length(m.shard_elements, m.shards, term_roundings_square(m.local))) +
      sqrt_square;
  t.reduction_chain = (exact_sums ? 0 : conversion + reduction_adds) + combination;
  t.gamma = gamma_of(static_cast<double>(t.local_chain) * u_l +
                     static_cast<double>(t.reduction_chain) * u_r);
  t.oracle = m.exact_mode ? 0.0 : kOracleSum;
  const int square_products = m.local == kernels::Accumulation::fp32 ? 1 : 0;
  const double eta = static_cast<double>(truth.elements) * square_products * eta_unit;

  const double s_t = truth.sum_squares;
  t.sum_squares = s_t > 0.0 ? combine(t.gamma, t.oracle, s_t) + round_up(eta) : round_up(eta);
  if (s_t > 0.0) {
    const double s_low = s_t / (1.0 + t.oracle);
    const double path = sqrt_relative(t.gamma + eta / s_low, u_r);
    const double oracle = m.exact_mode ? 0.0 : sqrt_relative(t.oracle, kU64);
    const bool identical = t.gamma == 0.0 && eta == 0.0 && t.oracle == 0.0 && u_r == kU64;
    t.norm = identical ? 0.0 : combine(path, oracle, truth.norm);
  } else {
    // The exact sum is 0 (a zero sum is computed exactly): the path's sum is at most eta.
    t.norm = round_up(std::sqrt(eta) * (1.0 + u_r));
  }

  // p-sums and p-norms (children add their p-sums: C - 1 more additions).
  for (const PNormTruth& pn : truth.p_norms) {
    const bool exact_p = exact_sums && pn.p == std::floor(pn.p) && pn.p >= 1.0 && pn.p <= 4.0;
    const int terms = term_roundings_power(m.local, pn.p);
    const double eps =
        exact_p ? 0.0
                : static_cast<double>(local_chain_length(m.shard_elements, m.shards, terms)) * u_l +
                      static_cast<double>(conversion + reduction_adds + (children - 1)) * u_r;
    const double g = gamma_of(eps);
    const double oracle = exact_p ? 0.0 : kOraclePSum;
    // Exact-mode values can underflow only in a high power: keep the underflow term unless the
    // p-sum is exact.
    const double eta_p = exact_p ? 0.0
                                 : static_cast<double>(truth.elements) * std::max(terms, 1) *
                                       underflow_unit(m.local);
    const double p_t = pn.sum;
    t.p_sums.push_back(p_t > 0.0 ? combine(g, oracle, p_t) + round_up(eta_p) : round_up(eta_p));
    if (exact_p && u_r == kU64) {
      t.p_norms.push_back(0.0);  // pow(sum, 1.0 / p) of identical bits on both sides
    } else if (p_t > 0.0) {
      const double p_low = p_t / (1.0 + oracle);
      const double path = root_relative(g + eta_p / p_low, pn.p, p_t, u_r);
      const double own = root_relative(oracle, pn.p, p_t, kU64);
      t.p_norms.push_back(combine(path, own, pn.norm));
    } else {
      t.p_norms.push_back(round_up(std::pow(eta_p, 1.0 / pn.p) * (1.0 + 4.0 * u_r)));
    }
  }

  // Clip coefficient and clipped elements (item 8).
  const ClipTruth& clip = truth.clip;
  if (clip.max_norm > 0.0 && (t.norm > 0.0 || u_r != kU64)) {
    const double denominator = truth.norm + kClipEpsilon;
    // A fp32 path adds 1e-6 as a float: off by at most 1e-6 u_32.
    const double epsilon_error = u_r == kU64 ? 0.0 : kClipEpsilon * u_r;
    const double b = (t.norm + epsilon_error) / denominator;
    if (b >= 1.0) {
      t.clip_coefficient = kInf;
    } else {
      const double path = (2.0 * u_r + b - b * u_r) / ((1.0 - b) * (1.0 - u_r));
      const double oracle = 2.0 * kU64 / (1.0 - kU64);
      t.clip_coefficient = combine(path, oracle, clip.coefficient);
    }
    const double c = clip.coefficient;
    t.clip_decision_certain = c + t.clip_coefficient < 1.0 || c - t.clip_coefficient >= 1.0;
  }
  // max_norm == 0: both coefficients are 0 and nothing is clipped. t.norm == 0 with a fp64
  // reduction: both sides compute the same coefficient from the same norm bits.
  return t;
}

ClipScales clip_scales(const Tolerance& tolerance, const ClipTruth& clip) {
  if (tolerance.clip_coefficient == 0.0 || clip.max_norm <= 0.0) {
    const float applied = static_cast<float>(clip.applied());
    return {applied, applied};
  }
  // One step outward covers the rounding of c -/+ bound itself; the path's scale is never
  // negative and never above 1 (it does not clip there).
  const double low = std::nextafter(clip.coefficient - tolerance.clip_coefficient, -kInf);
  const double high = std::nextafter(clip.coefficient + tolerance.clip_coefficient, kInf);
  return {static_cast<float>(std::clamp(low, 0.0, 1.0)), static_cast<float>(std::clamp(high, 0.0, 1.0))};
}

bool clipped_within(float got, float stored, ClipScales scales) {
  const float a = stored * scales.low, b = stored * scales.high;
  return std::min(a, b) <= got && got <= std::max(a, b);
}

double error_ratio(double got, double expected, double bound) {
  if (std::isnan(got) || std::isnan(expected) || std::isnan(bound)) return kInf;
  if (bound == 0.0)
    return std::bit_cast<std::uint64_t>(got) == std::bit_cast<std::uint64_t>(expected) ? 0.0 : kInf;
  return std::abs(got - expected) / bound;
}

}  // namespace tally::oracle
