#include "kernels/shares.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace tally::kernels {

DtypeGrid dtype_grid(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp32: return {24, -149};
    case Dtype::bf16: return {8, -133};
    case Dtype::fp16: return {11, -24};
  }
  return {24, -149};
}

namespace {

bool representable(double value, Dtype dtype) {
  return std::isfinite(value) && static_cast<double>(round_to(value, dtype)) == value;
}

bool power_of_two(double value) {
  int exponent = 0;
  return value > 0 && std::isfinite(value) && std::frexp(value, &exponent) == 0.5;
}

std::vector<double> cancelling_shares(int ranks, double unit) {
  std::vector<double> shares;
  if (ranks % 2 != 0) shares = {unit, unit, -2 * unit};
  while (static_cast<int>(shares.size()) < ranks) {
    shares.push_back(unit);
    shares.push_back(-unit);
  }
  return shares;
}

}  // namespace

std::optional<std::vector<double>> deal_exact_shares(double total, int ranks, Dtype dtype, double zero_unit) {
  const DtypeGrid grid = dtype_grid(dtype);
  if (ranks < 1 || ranks >= (1 << grid.precision))
    throw std::invalid_argument("deal_exact_shares: " + std::to_string(ranks) + " ranks; a group holds 1 to " +
                                std::to_string((1 << grid.precision) - 1) + " in " + std::string(dtype_name(dtype)));
  if (!power_of_two(zero_unit) || !representable(zero_unit * 2 * ranks, dtype) || !representable(zero_unit, dtype))
    throw std::invalid_argument("deal_exact_shares: zero_unit " + std::to_string(zero_unit) +
                                " must be a power of two that " + std::string(dtype_name(dtype)) + " holds " +
                                std::to_string(2 * ranks) + " times over");
  if (!representable(total, dtype)) return std::nullopt;
  if (ranks == 1) return std::vector<double>{total};
  if (total == 0) return cancelling_shares(ranks, zero_unit);

  // |total| = significand * 2^grid_exponent, the significand an odd integer.
  int exponent = 0;
  const double fraction = std::frexp(std::fabs(total), &exponent);  // in [0.5, 1)
  std::uint64_t significand = static_cast<std::uint64_t>(std::ldexp(fraction, 53));
  int grid_exponent = exponent - 53;
  const int trailing = std::countr_zero(significand);
  significand >>= trailing;
  grid_exponent += trailing;
  const auto fits = [&grid](std::uint64_t count, int unit) {
    return static_cast<int>(std::bit_width(count)) <= grid.precision && unit >= grid.min_exponent;
  };
  // The coarsest grid with 1 + 2 + ... + ranks units, where the dtype has the bits: every share
  // distinct, so a reduction that takes one rank's share in another's place changes the sum too.
  const std::uint64_t n = static_cast<std::uint64_t>(ranks);
  std::uint64_t units = significand;
  int unit_exponent = grid_exponent;
  while (units < n * (n + 1) / 2) {
    units <<= 1;
    --unit_exponent;
  }
  const double sign = total < 0 ? -1.0 : 1.0;
  std::vector<double> shares;
  shares.reserve(static_cast<std::size_t>(ranks));
  if (fits(units, unit_exponent)) {
    for (std::uint64_t r = 0; r + 1 < n; ++r)
      shares.push_back(sign * std::ldexp(static_cast<double>(r + 1), unit_exponent));
    shares.push_back(sign * std::ldexp(static_cast<double>(units - n * (n - 1) / 2), unit_exponent));
    return shares;
  }
  // Else near-equal shares on the coarsest grid with a unit for every rank.
  while (significand < n) {
    significand <<= 1;
    --grid_exponent;
  }
  if (!fits(significand, grid_exponent)) return std::nullopt;
  const std::uint64_t each = significand / n;
  const std::uint64_t more = significand % n;
  for (std::uint64_t r = 0; r < n; ++r)
    shares.push_back(sign * std::ldexp(static_cast<double>(each + (r < more ? 1 : 0)), grid_exponent));
  return shares;
}

GroupShares deal_group_shares(double total, int ranks, Dtype dtype) {
  GroupShares out;
  const bool dealable = ranks < (1 << dtype_grid(dtype).precision);
  std::optional<std::vector<double>> dealt =
      dealable ? deal_exact_shares(total, ranks, dtype, kZeroShareUnit) : std::nullopt;
  if (dealt) {
    out.shares = std::move(*dealt);
    return out;
  }
  out.shares.assign(static_cast<std::size_t>(ranks), 0.0);
  out.shares[0] = total;
  out.given_whole = true;
  return out;
}

}  // namespace tally::kernels
