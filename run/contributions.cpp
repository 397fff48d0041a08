#include "run/contributions.h"

#include <stdexcept>

#include "kernels/shares.h"

namespace tally::run {

namespace {

// The magnitude of a zero gradient's cancelling shares: a power of two every dtype holds with room
// for a group's worth of them times fp16's largest static loss scale (2^16), so a framework that
// scales the loss sees no overflow in a share where the gradient itself has none.
constexpr double kZeroUnit = 1.0 / 1024;

}  // namespace

DealtShares deal_shares(std::span<const float> values, int ranks, int divisor, kernels::Dtype dtype) {
  if (ranks < 1 || divisor < 1)
    throw std::invalid_argument("deal_shares: a group of " + std::to_string(ranks) + " ranks divided by " +
                                std::to_string(divisor) + "; both must be 1 or more");
  DealtShares out;
  const std::size_t n = values.size();
  out.shares.assign(n * static_cast<std::size_t>(ranks), 0.0f);
  // A group larger than the dtype can count in its significand has no exact shares at all.
  const bool dealable = ranks < (1 << kernels::dtype_grid(dtype).precision);
  for (std::size_t e = 0; e < n; ++e) {
    const double total = static_cast<double>(values[e]) * divisor;
    const std::optional<std::vector<double>> dealt =
        dealable ? kernels::deal_exact_shares(total, ranks, dtype, kZeroUnit) : std::nullopt;
    if (!dealt) {
      out.shares[e] = static_cast<float>(total);  // the first rank gives it whole
      ++out.given_whole;
      continue;
    }
    for (int r = 0; r < ranks; ++r)
      out.shares[static_cast<std::size_t>(r) * n + e] = static_cast<float>((*dealt)[static_cast<std::size_t>(r)]);
  }
  return out;
}

std::string shares_file_name(const std::string& case_name, int ranks) {
  return case_name + ".shares-" + std::to_string(ranks) + ".f32";
}

}  // namespace tally::run
