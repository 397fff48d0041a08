// A gradient dealt into its reduction group's shares (kernels/shares.h): every share nonzero and
// representable, and every order and grouping of the reduction, rounded in the dtype, gives the
// total exactly; a share left out or counted twice does not.
#include "kernels/shares.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tally::kernels {
namespace {

double rounded(double value, Dtype dtype) { return static_cast<double>(round_to(value, dtype)); }

// The shares reduced as a collective might: two at a time, picked by `picks`, each sum rounded to
// the dtype (a double holds the exact sum of two values of any of the dtypes).
double reduce_in_order(std::vector<double> values, Dtype dtype, const std::vector<std::size_t>& picks) {
  std::size_t k = 0;
  while (values.size() > 1) {
    const std::size_t a = picks.empty() ? 0 : picks[k++ % picks.size()] % values.size();
    double first = values[a];
    values.erase(values.begin() + static_cast<std::ptrdiff_t>(a));
    const std::size_t b = picks.empty() ? 0 : picks[k++ % picks.size()] % values.size();
    values[b] = rounded(first + values[b], dtype);
  }
  return values.front();
}

double left_to_right(const std::vector<double>& values, Dtype dtype) {
  double sum = 0;
  for (double v : values) sum = rounded(sum + v, dtype);
  return sum;
}

TEST(DealExactShares, SharesAreOneTwoAndSoOnUnitsAndTheRest) {
  // 1 = 16 sixteenths: 1, 2, 3 and 10 of them.
  EXPECT_EQ(deal_exact_shares(1.0, 4, Dtype::fp32, 1.0), (std::vector<double>{0.0625, 0.125, 0.1875, 0.625}));
  EXPECT_EQ(deal_exact_shares(-8.0, 2, Dtype::bf16, 1.0), (std::vector<double>{-2.0, -6.0}));
  EXPECT_EQ(deal_exact_shares(3.0, 2, Dtype::fp32, 1.0), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(deal_exact_shares(0.375, 3, Dtype::fp16, 1.0), (std::vector<double>{0.0625, 0.125, 0.1875}));
}

TEST(DealExactShares, WithoutTheBitsForDistinctSharesTheyAreNearEqual) {
  // bf16's 8 bits: 255 split 128 ways would need 1 + ... + 128 = 8256 units.
  const std::optional<std::vector<double>> shares = deal_exact_shares(255.0, 128, Dtype::bf16, 1.0);
  ASSERT_TRUE(shares);
  EXPECT_EQ(std::count(shares->begin(), shares->end(), 2.0), 127);
  EXPECT_EQ(std::count(shares->begin(), shares->end(), 1.0), 1);
}

TEST(DealExactShares, ZeroIsDealtAsSharesThatCancel) {
  EXPECT_EQ(deal_exact_shares(0.0, 4, Dtype::fp32, 0.5), (std::vector<double>{0.5, -0.5, 0.5, -0.5}));
  EXPECT_EQ(deal_exact_shares(0.0, 3, Dtype::bf16, 2.0), (std::vector<double>{2.0, 2.0, -4.0}));
}

TEST(DealExactShares, OneRankGivesTheWholeValue) {
  EXPECT_EQ(deal_exact_shares(0.0, 1, Dtype::fp32, 1.0), (std::vector<double>{0.0}));
  EXPECT_EQ(deal_exact_shares(-1.5, 1, Dtype::fp16, 1.0), (std::vector<double>{-1.5}));
}

TEST(DealExactShares, AValueTheDtypeCannotSplitThatManyWaysHasNone) {
  // bf16 holds 8 significand bits: 255 (8 bits) splits 255 ways at most, and 1 at most 128 ways.
  EXPECT_TRUE(deal_exact_shares(255.0, 200, Dtype::bf16, 1.0));
  EXPECT_FALSE(deal_exact_shares(1.0, 200, Dtype::bf16, 1.0)) << "200 shares of 1 need 9 bits";
  EXPECT_TRUE(deal_exact_shares(1.0, 128, Dtype::bf16, 1.0));
  // The smallest subnormal cannot be split at all.
  EXPECT_FALSE(deal_exact_shares(std::ldexp(1.0, -149), 2, Dtype::fp32, 1.0));
  EXPECT_TRUE(deal_exact_shares(std::ldexp(1.0, -148), 2, Dtype::fp32, 1.0));
}

TEST(DealExactShares, AValueNotInTheDtypeOrNotFiniteHasNone) {
  EXPECT_FALSE(deal_exact_shares(1.0 + std::ldexp(1.0, -10), 2, Dtype::bf16, 1.0));
  EXPECT_FALSE(deal_exact_shares(INFINITY, 2, Dtype::fp32, 1.0));
  EXPECT_FALSE(deal_exact_shares(NAN, 2, Dtype::fp32, 1.0));
}

TEST(DealExactShares, AGroupOrAZeroUnitOutOfRangeIsTheCallersError) {
  EXPECT_THROW(deal_exact_shares(1.0, 0, Dtype::fp32, 1.0), std::invalid_argument);
  EXPECT_THROW(deal_exact_shares(1.0, 256, Dtype::bf16, 1.0), std::invalid_argument);
  EXPECT_THROW(deal_exact_shares(1.0, 2, Dtype::fp32, 3.0), std::invalid_argument) << "not a power of two";
  EXPECT_THROW(deal_exact_shares(1.0, 2, Dtype::fp16, 32768.0), std::invalid_argument) << "4 of them overflow fp16";
}

// A value of `dtype` from random bits: any finite one, subnormals and extremes included.
double value_of(Dtype dtype, std::uint64_t bits) {
  const double wide = std::ldexp(static_cast<double>(bits >> 11) / 9007199254740992.0,
                                 static_cast<int>(bits % 300) - 150);
  const double value = rounded((bits & 1024) ? -wide : wide, dtype);
  return std::isfinite(value) ? value : 0.0;
}

// Whether some grid 2^g the dtype reaches (g at or above its smallest subnormal's exponent) holds
// `total` as a whole number of units, at least one per rank and fewer than 2^precision: searched,
// grid by grid, not derived as deal_exact_shares derives it.
bool splittable(double total, int ranks, Dtype dtype) {
  if (total == 0.0 || ranks == 1) return true;
  const DtypeGrid grid = dtype_grid(dtype);
  for (int g = grid.min_exponent; g <= 128; ++g) {
    const double units = std::fabs(total) / std::ldexp(1.0, g);  // exact: a power-of-two scaling
    if (units != std::floor(units)) return false;  // coarser grids do not hold it either
    if (units >= ranks && units < std::ldexp(1.0, grid.precision)) return true;
  }
  return false;
}

RC_GTEST_PROP(DealExactShares, EveryOrderOfTheReductionGivesTheTotalExactly,
              (std::uint64_t bits, std::uint8_t dtype_index, std::uint8_t rank_draw, std::vector<std::size_t> picks)) {
  const Dtype dtype = kAllDtypes[dtype_index % kDtypeCount];
  const int ranks = 1 + rank_draw % 64;
  const double total = value_of(dtype, bits);
  const std::optional<std::vector<double>> shares = deal_exact_shares(total, ranks, dtype, 1.0);
  RC_ASSERT(shares.has_value() == splittable(total, ranks, dtype));
  if (!shares) return;
  RC_ASSERT(static_cast<int>(shares->size()) == ranks);
  for (double share : *shares) {
    RC_ASSERT(rounded(share, dtype) == share);
    if (ranks > 1) RC_ASSERT(share != 0.0);
  }
  RC_ASSERT(reduce_in_order(*shares, dtype, picks) == total);
  RC_ASSERT(left_to_right(*shares, dtype) == total);
}

RC_GTEST_PROP(DealExactShares, AShareLeftOutOrCountedTwiceChangesTheTotal,
              (std::uint64_t bits, std::uint8_t dtype_index, std::uint8_t rank_draw, std::uint8_t which)) {
  const Dtype dtype = kAllDtypes[dtype_index % kDtypeCount];
  const int ranks = 2 + rank_draw % 63;
  const double total = value_of(dtype, bits);
  const std::optional<std::vector<double>> shares = deal_exact_shares(total, ranks, dtype, 1.0);
  RC_PRE(shares.has_value());
  std::vector<double> dropped = *shares, doubled = *shares;
  const std::size_t k = which % shares->size();
  dropped.erase(dropped.begin() + static_cast<std::ptrdiff_t>(k));
  doubled.push_back((*shares)[k]);
  RC_ASSERT(left_to_right(dropped, dtype) != total);
  RC_ASSERT(left_to_right(doubled, dtype) != total);
}

RC_GTEST_PROP(DealExactShares, SharesAreDistinctWhereTheDtypeHasTheBits,
              (std::uint8_t significand, std::int8_t exponent, std::uint8_t dtype_index, std::uint8_t rank_draw)) {
  const Dtype dtype = kAllDtypes[dtype_index % kDtypeCount];
  const int ranks = 2 + rank_draw % 7;  // up to 8: 36 units, 6 bits
  const double total = std::ldexp(static_cast<double>((significand % 4) | 1), exponent % 6);  // 2 bits
  const std::optional<std::vector<double>> shares = deal_exact_shares(total, ranks, dtype, 1.0);
  RC_ASSERT(shares.has_value());
  std::vector<double> sorted = *shares;
  std::sort(sorted.begin(), sorted.end());
  RC_ASSERT(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
}

RC_GTEST_PROP(DealExactShares, AValueWithRoomForTheSplitAlwaysHasShares,
              (std::uint16_t significand, std::int8_t exponent, std::uint8_t dtype_index, std::uint8_t rank_draw)) {
  const Dtype dtype = kAllDtypes[dtype_index % kDtypeCount];
  const DtypeGrid grid = dtype_grid(dtype);
  const int ranks = 2 + rank_draw % 63;
  const int split_bits = std::bit_width(static_cast<unsigned>(ranks - 1));
  const int bits = grid.precision - split_bits;  // a significand of this many bits leaves room
  RC_PRE(bits >= 1);
  const std::uint64_t m = (significand % (std::uint64_t{1} << bits)) | 1;
  const double total = std::ldexp(static_cast<double>(m), exponent % 6);  // within fp16's range too
  RC_ASSERT(deal_exact_shares(total, ranks, dtype, 1.0).has_value());
}

}  // namespace
}  // namespace tally::kernels
