// The error-bound model for random gradient modes: how far the path's statistics may be from the
// ground truth through rounding alone. The verdict reports error / bound (error_ratio); no
// hand-tuned rtol anywhere. Exact modes with fp64 accumulation everywhere (and one reduction, no
// sqrt-then-square step) have bound 0: the path must match the truth bit for bit.
//
// The reasoning (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., ch. 3-4).
//
// 1. Rounding model. Each correctly rounded +, *, sqrt in a type with unit roundoff u (2^-24 for
//    fp32, 2^-53 for fp64) returns x (1 + d), |d| <= u, plus, for a product, an absolute
//    underflow error below half the smallest subnormal (2^-150 in fp32). Sums never underflow
//    (IEEE addition of subnormals is exact).
// 2. Sums of non-negative terms. A sum computed in any fixed order (a tree, a chain, lanes, ...)
//    equals sum x_i prod_{j in path(i)} (1 + d_j): each addend is multiplied by the roundings
//    along its path to the root. With k the longest such chain and all x_i >= 0,
//        |computed - S| <= gamma_k S,   gamma_k = k u / (1 - k u)          (Higham Lemma 3.1)
//    and with roundings in two types the same lemma gives eps = k_32 u_32 + k_64 u_64 in place
//    of k u. The square or power that makes a term is one more factor on its path.
// 3. The chain of kernels/local_stats.h's documented order, for a shard of n elements, s shards
//    per call:  term roundings (fp32: g*g rounds once, |g|^p p-1 times, pow twice (< 1 ulp);
//    fp64: g*g of a float is exact, |g|^p max(p-2, 0), pow 2)
//      + lane additions  ceil(min(n, kStatsChunk) / 8) - 1   (a lane starts at +0: exact first add)
//      + 3 tree levels
//      + chunk additions  ceil(n / kStatsChunk) - 1
//      + shard additions  s - 1
//    the local sum is then widened exactly to double. Chained children that share one stats
//    group (one reduction over all their gradients) are simply more shards in the call.
// 4. Reduction. A fp64 local sum handed to a fp32 reduction rounds once. Each all-reduce over G
//    ranks is, per element, a sum of G values in some order: any order has at most G - 1
//    roundings on a path (the sim backend sums in group order; a ring or tree does no worse).
//    Reductions over several groups in sequence add their chains.
// 5. Children not sharing a group (ChainedOptimizer, not shared): norm = sqrt(sum n_i^2). Each
//    n_i = sqrt(S_i) rounds once, enters squared (2 factors), is squared (1), and the C child
//    squares are summed (C - 1): C + 2 more roundings of S in the reduction type.
//    Megatron-LM's local multi_tensor_l2norm (sqrt, then square of the local sum) is 3 more in
//    the local type.
// 6. Norm. With S^ = S (1 + t), |t| <= g, the path's norm is sqrt(S^) (1 + d): relative error
//    at most max(sqrt(1 + g)(1 + u) - 1, 1 - sqrt(1 - g)(1 - u)), about g / 2 + u: the sqrt
//    halves the sum's error and adds its own rounding.
// 7. p-norms: the p-sum as in 2-4 (children add their p-sums: C - 1 additions); the root
//    pow(P, 1/p) moves the sum's relative error g to about g / p, the rounding of 1/p adds
//    |ln P| u / p, pow itself < 1 ulp (2 u).
// 8. Clip coefficient c = max_norm / (norm + 1e-6): a norm error B_n moves the denominator by at
//    most B_n, relative b = B_n / (norm + 1e-6); with the rounding of the + and the /, the
//    relative error is at most (2 u + b - b u) / ((1 - b)(1 - u)). A clipped element is
//    fl32(g * fl32(min(c', 1))) for the path's coefficient c' (no clipping at c' >= 1 leaves g,
//    which is fl32(g * 1)). Both roundings and the min are monotone, so every value the path can
//    make of g lies between the products with the lowest and the highest float scale that a c'
//    within the coefficient's bound gives (clip_scales): the check is that interval, exactly.
// 9. The oracle's own error (oracle/ground_truth.h): sums within (1 + 2^-9) 2^-53 relative,
//    p-sums 2.03 * 2^-53, the norm's and the root's final roundings; exact modes: 0. Both errors
//    add: |path - truth| <= |path - exact| + |exact - truth|, and the exact value is bounded
//    from the truth by the oracle's relative error.
// Every nonzero bound is finally rounded up by a factor 1 + 2^-40, which covers the rounding of
// the bound's own evaluation (a few ulps of the bound).
//
// Exact values (no bound: compare bit for bit in every mode): abs-max (max is exact in any
// order), the zero count, element counts and the ledger.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/gradient_generator.h"
#include "kernels/summation_order.h"  // Accumulation, kStatsChunk, kStatsLanes: the documented order
#include "oracle/ground_truth.h"

namespace tally::oracle {

// How the path under test computed one group's statistics on its longest path.
struct ReductionModel {
  kernels::Accumulation local = kernels::Accumulation::fp64;  // local_stats accumulation
  // The type of the cross-rank sums and of everything after them (sqrt, pow, clip
  // coefficient): fp64 for tally's Communicator (double vectors), fp32 for a path that
  // all-reduces a fp32 tensor as Megatron-LM does.
  kernels::Accumulation reduction = kernels::Accumulation::fp64;
  std::int64_t shard_elements = 0;  // elements of the largest shard one rank sums
  std::int64_t shards = 1;          // shards in one local call
  std::vector<int> reduction_groups;  // sizes of the groups all-reduced over, in sequence
  int children = 1;  // child norms combined as sqrt(sum n_i^2); 1: a single reduction
  bool local_sqrt_square = false;  // the local sum enters as sqrt(s)^2 (multi_tensor_l2norm)
  bool exact_mode = false;         // kernels::mode_is_exact of the case's gradient mode
  friend bool operator==(const ReductionModel&, const ReductionModel&) = default;
};

// Bounds on |path - truth| for one group (main or MTP). 0 means bit for bit.
struct Tolerance {
  // The reasoning, for the report.
  std::int64_t local_chain = 0;      // roundings on the longest path, local type
  std::int64_t reduction_chain = 0;  // roundings on the longest path, reduction type
  double gamma = 0.0;   // relative bound of the path's sum of squares
  double oracle = 0.0;  // relative bound of the truth's sum of squares
  // Absolute bounds.
  double sum_squares = 0.0;
  double norm = 0.0;
  std::vector<double> p_sums;   // one per GroupTruth::p_norms entry
  std::vector<double> p_norms;
  double clip_coefficient = 0.0;
  // The path's "clip or not" (coefficient < 1) cannot differ from the truth's.
  bool clip_decision_certain = true;
  friend bool operator==(const Tolerance&, const Tolerance&) = default;
};

double unit_roundoff(kernels::Accumulation accumulation);  // 2^-24 or 2^-53
// gamma for eps = sum of k_i u_i: eps / (1 - eps); +inf when eps >= 1.
double gamma_of(double eps);
// Roundings on the longest path of one addend through local_stats's documented order
// (item 3 above), the term's own roundings included.
std::int64_t local_chain_length(std::int64_t shard_elements, std::int64_t shards,
                                int term_roundings);

Tolerance tolerance(const ReductionModel& model, const GroupTruth& truth);

// The float scales a path may multiply its gradients by (item 8): fl32(min(c', 1)) for the
// lowest and the highest coefficient c' within tolerance.clip_coefficient of clip's. Equal, and
// fl32(clip.applied()), where the coefficient is certain (bound 0).
struct ClipScales {
  float low = 1.0f;
  float high = 1.0f;
  friend bool operator==(const ClipScales&, const ClipScales&) = default;
};
ClipScales clip_scales(const Tolerance& tolerance, const ClipTruth& clip);

// Whether `got` is a value the path can make of `stored`: between fl32(stored * scales.low) and
// fl32(stored * scales.high). NaN is never within.
bool clipped_within(float got, float stored, ClipScales scales);

// |got - expected| / bound, what the verdict reports. bound 0: 0 when the bits are equal, +inf
// otherwise. NaN anywhere: +inf.
double error_ratio(double got, double expected, double bound);

}  // namespace tally::oracle
