// A gradient value dealt into the contributions the ranks of one reduction group give, for a case
// whose gradients enter before the framework's own reduction (issue: the whole path on the real
// targets). The reduction must give exactly the case's value, whatever order and grouping its
// collective adds the contributions in (a ring, a tree, a reduce-scatter's halves), in the
// gradient's own dtype; and every rank gives a nonzero share, so a reduction that leaves a rank
// out, or counts one twice, changes the value.
//
// How: a nonzero total is +-M * 2^g with M an integer (the total's significand, shifted left by as
// few bits as make M >= 1 + 2 + ... + the rank count). The shares are M split into the parts 1, 2,
// ..., ranks - 1 and the rest, each times +-2^g: all distinct, so a reduction that takes one rank's
// share in another's place changes the sum as well. Where the dtype lacks the bits for that, M is
// shifted only until it is at least the rank count and split into near-equal parts. Every partial
// sum then has the total's sign, magnitude at most
// the total's, and lies on the grid 2^g: it is k * 2^g with k < 2^p (p the dtype's significand
// bits), which the dtype holds exactly, normal or subnormal, when g is at or above the dtype's
// smallest subnormal exponent. A zero total is dealt as +-`zero_unit` shares that cancel (s, -s, ...;
// with an odd count s, s, -2s first), whose partial sums are small multiples of the unit.
#pragma once

#include <optional>
#include <vector>

#include "kernels/gradient_generator.h"

namespace tally::kernels {

// The dtype's significand bits (the implicit bit included) and its smallest subnormal's exponent.
struct DtypeGrid {
  int precision;
  int min_exponent;  // the smallest subnormal is 2^min_exponent
};
DtypeGrid dtype_grid(Dtype dtype);

// `total` dealt into `ranks` shares (ranks >= 1): each representable in `dtype` and nonzero (for
// ranks >= 2), their sum exactly `total` in any order and grouping with every addition rounded to
// `dtype`. `zero_unit`: the magnitude of a zero total's shares, a power of two the dtype holds with
// room for `ranks` of it (2 * ranks * zero_unit representable). nullopt where `total` has no such
// shares on one grid: it is not representable in `dtype`, it is not finite, its significand has too
// many bits to split `ranks` ways (total = 2^k needs 1 + ceil(log2 ranks) <= p), or splitting it
// would need a grid below the dtype's smallest subnormal.
std::optional<std::vector<double>> deal_exact_shares(double total, int ranks, Dtype dtype, double zero_unit);

// The magnitude of a zero gradient's cancelling shares, for every reduction group tally deals: a
// power of two every dtype holds with room for a group's worth of them times fp16's largest static
// loss scale (2^16), so a framework that scales the loss sees no overflow in a share where the
// gradient itself has none.
inline constexpr double kZeroShareUnit = 1.0 / 1024;

// What each of `ranks` gives of `total`: its exact shares (deal_exact_shares with kZeroShareUnit),
// or, where it has none (or the group is larger than the dtype can count in its significand), the
// whole total from the first rank and 0 from the others (`given_whole`).
struct GroupShares {
  std::vector<double> shares;
  bool given_whole = false;
};
GroupShares deal_group_shares(double total, int ranks, Dtype dtype);

}  // namespace tally::kernels
