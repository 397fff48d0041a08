// The reduction every communicator shares: max propagates NaN, and the packed form the mpi and
// nccl backends hand to their library's max gives the same result.
#include "comm/communicator.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace tally::comm {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ReducePair, MaxPropagatesNanFromEitherSide) {
  EXPECT_TRUE(std::isnan(reduce_pair(kNan, 1.0, ReduceOp::max)));
  EXPECT_TRUE(std::isnan(reduce_pair(1.0, kNan, ReduceOp::max)));
  EXPECT_TRUE(std::isnan(reduce_pair(kInf, kNan, ReduceOp::max)));
  EXPECT_EQ(reduce_pair(-3.0, 2.0, ReduceOp::max), 2.0);
  EXPECT_EQ(reduce_pair<std::int64_t>(7, 5, ReduceOp::max), 7);
  EXPECT_EQ(reduce_pair(1.5, 2.0, ReduceOp::sum), 3.5);
}

// A library max that leaves NaN to its implementation: here, one that drops it.
std::vector<double> library_max(const std::vector<std::vector<double>>& packed) {
  std::vector<double> out = packed[0];
  for (std::size_t r = 1; r < packed.size(); ++r)
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = packed[r][i] > out[i] ? packed[r][i] : out[i];
  return out;
}

// The packed max of any ranks' values (NaN and infinities included) is reduce_pair's max.
RC_GTEST_PROP(PackedMax, EqualsReducePairsMaxWhateverTheLibraryDoesWithNan, ()) {
  const int ranks = *rc::gen::inRange(1, 6);
  const std::size_t n = *rc::gen::inRange<std::size_t>(0, 8);
  const auto value = rc::gen::weightedOneOf<double>(
      {{6, rc::gen::map(rc::gen::inRange(-1000, 1000), [](int v) { return v / 8.0; })},
       {1, rc::gen::just(kNan)},
       {1, rc::gen::just(kInf)},
       {1, rc::gen::just(-kInf)}});
  std::vector<std::vector<double>> values(ranks, std::vector<double>(n));
  for (auto& rank : values)
    for (double& v : rank) v = *value;
  std::vector<std::vector<double>> packed(ranks, std::vector<double>(2 * n));
  for (int r = 0; r < ranks; ++r) pack_for_max(values[r], packed[r]);
  std::vector<double> got(n);
  unpack_max(library_max(packed), got);
  for (std::size_t i = 0; i < n; ++i) {
    double want = values[0][i];
    for (int r = 1; r < ranks; ++r) want = reduce_pair(want, values[r][i], ReduceOp::max);
    RC_ASSERT((std::isnan(want) && std::isnan(got[i])) || want == got[i]);
  }
}

}  // namespace
}  // namespace tally::comm
