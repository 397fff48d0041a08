// A double-double accumulator for the oracle's sums: the running sum `hi` plus `lo`, the exact
// rounding errors of the additions into `hi` (Knuth's TwoSum), themselves summed in double.
// That is Ogita, Rump and Oishi's Sum2 ("Accurate sum and dot product", SIAM J. Sci. Comput.
// 26(6), 2005), whose result is as accurate as a sum in twice the working precision, then
// rounded once: |value() - S| <= u |S| + gamma_{n-1}^2 sum |x_i|, u = 2^-53.
//
// gamma_{n-1}^2 grows with n^2, so the oracle never feeds one accumulator more than
// kMaxAddends values: it sums blocks into fresh accumulators and merges the (hi, lo) pairs one
// level up (elements -> blocks -> params -> groups). Each level adds at most
// gamma_{2^21}^2 <= 2^-63 relative, so for non-negative terms the total is within
// (1 + 2^-9) u of S: at most one ulp. Sums of exactly representable terms whose partial sums
// are exact (ones, zeros, dyadic, rank-encoded) stay exact: every TwoSum error is then 0.
//
// Needs IEEE double arithmetic without reassociation (no -ffast-math); an FMA contraction cannot
// touch it (there are no products).
#pragma once

#include <cmath>
#include <cstdint>

namespace tally::oracle::detail {

inline constexpr std::int64_t kMaxAddends = std::int64_t{1} << 20;

class CompensatedSum {
 public:
  void add(double x) {
    const double s = hi_ + x;
    const double b = s - hi_;
    lo_ += (hi_ - (s - b)) + (x - b);  // TwoSum: hi_ + x == s + error exactly
    hi_ = s;
  }
  // Adds another accumulator's unevaluated pair.
  void merge(const CompensatedSum& other) {
    add(other.hi_);
    lo_ += other.lo_;
  }
  // An overflow makes hi_ infinite and lo_ NaN (inf - inf): the sum is then hi_.
  double value() const { return std::isfinite(hi_) ? hi_ + lo_ : hi_; }
  double hi() const { return hi_; }
  double lo() const { return lo_; }

 private:
  double hi_ = 0.0;
  double lo_ = 0.0;
};

}  // namespace tally::oracle::detail
