#include "run/contributions.h"

#include <stdexcept>

#include "kernels/shares.h"

namespace tally::run {

DealtShares deal_shares(std::span<const float> values, int ranks, int divisor, kernels::Dtype dtype) {
  if (ranks < 1 || divisor < 1)
    throw std::invalid_argument("deal_shares: a group of " + std::to_string(ranks) + " ranks divided by " +
                                std::to_string(divisor) + "; both must be 1 or more");
  DealtShares out;
  const std::size_t n = values.size();
  out.shares.assign(n * static_cast<std::size_t>(ranks), 0.0f);
  for (std::size_t e = 0; e < n; ++e) {
    const kernels::GroupShares dealt =
        kernels::deal_group_shares(static_cast<double>(values[e]) * divisor, ranks, dtype);
    out.given_whole += dealt.given_whole;
    for (int r = 0; r < ranks; ++r)
      out.shares[static_cast<std::size_t>(r) * n + e] = static_cast<float>(dealt.shares[static_cast<std::size_t>(r)]);
  }
  return out;
}

std::string shares_file_name(const std::string& case_name, int ranks) {
  return case_name + ".shares-" + std::to_string(ranks) + ".f32";
}

}  // namespace tally::run
