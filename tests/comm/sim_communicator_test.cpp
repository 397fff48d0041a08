#include "comm/sim_communicator.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "tests/support/config_gen.h"

namespace tally::comm {
namespace {

using topologies::Family;
using topologies::ParallelConfig;
using topologies::RankLayout;

RankLayout example_a() {
  ParallelConfig c;
  c.world = 8;
  c.tp = 2;
  c.ep = 4;
  c.etp = 1;
  return RankLayout(c);
}

TEST(SimCommunicator, SumsOverEachGroupAndEveryMemberGetsTheResult) {
  const RankLayout layout = example_a();
  SimCommunicator comm(layout);
  std::vector<std::vector<double>> values(8);
  for (int rank = 0; rank < 8; ++rank) {
    values[rank] = {std::ldexp(1.0, rank), 1.0};
    comm.all_reduce(rank, group_of(layout, Family::expt_dp, rank), values[rank], ReduceOp::sum,
                    "test");
  }
  comm.end_phase();
  // EDP groups of example A: [0,4] [1,5] [2,6] [3,7]; 2^rank exposes which group was used.
  for (int rank = 0; rank < 8; ++rank) {
    const int partner = rank < 4 ? rank + 4 : rank - 4;
    EXPECT_EQ(values[rank][0], std::ldexp(1.0, rank) + std::ldexp(1.0, partner));
    EXPECT_EQ(values[rank][1], 2.0);
  }
  EXPECT_EQ(comm.completed(), 4);
}

TEST(SimCommunicator, MaxOfInt64AndNaNPropagates) {
  const RankLayout layout = example_a();
  SimCommunicator comm(layout);
  std::vector<std::vector<std::int64_t>> counts(8);
  std::vector<std::vector<double>> maxima(8);
  for (int rank = 0; rank < 8; ++rank) {
    counts[rank] = {rank * 10};
    maxima[rank] = {rank == 6 ? std::nan("") : double(rank)};
    comm.all_reduce(rank, group_of(layout, Family::world, rank), counts[rank], ReduceOp::max, "c");
    comm.all_reduce(rank, group_of(layout, Family::world, rank), maxima[rank], ReduceOp::max, "m");
  }
  comm.end_phase();
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(counts[rank][0], 70);
    EXPECT_TRUE(std::isnan(maxima[rank][0]));
  }
}

TEST(SimCommunicator, SeveralCollectivesOnOneGroupMatchInCallOrder) {
  const RankLayout layout = example_a();
  SimCommunicator comm(layout);
  std::vector<double> first(8), second(8);
  // Rank 0 issues both before rank 1 issues any: sequence numbers, not arrival, match them.
  for (int rank : {0, 1}) {
    first[rank] = 1.0 + rank;
    second[rank] = 100.0 + rank;
    const Group tp = group_of(layout, Family::tp, rank);
    comm.all_reduce(rank, tp, std::span(&first[rank], 1), ReduceOp::sum, "first");
    comm.all_reduce(rank, tp, std::span(&second[rank], 1), ReduceOp::sum, "second");
  }
  comm.end_phase();
  EXPECT_EQ(first[0], 3.0);
  EXPECT_EQ(first[1], 3.0);
  EXPECT_EQ(second[0], 201.0);
  EXPECT_EQ(second[1], 201.0);
}

TEST(SimCommunicator, AMemberThatNeverJoinsIsAHangNamingGroupAndRanks) {
  const RankLayout layout = example_a();
  SimCommunicator comm(layout);
  std::vector<double> values(8, 1.0);
  for (int rank = 0; rank < 8; ++rank) {
    if (rank == 5) continue;  // an empty rank that skips the collective
    comm.all_reduce(rank, group_of(layout, Family::expt_ep, rank), std::span(&values[rank], 1),
                    ReduceOp::sum, "expert grad stats");
  }
  try {
    comm.end_phase();
    FAIL() << "expected InfraError";
  } catch (const InfraError& error) {
    EXPECT_EQ(error.call(), "all_reduce(sum) 'expert grad stats' on expt-ep group 1 [4,5,6,7]");
    EXPECT_EQ(std::string(error.what()),
              "all_reduce(sum) 'expert grad stats' on expt-ep group 1 [4,5,6,7] never completed: "
              "rank(s) 5 did not join (the job would hang)");
  }
}

TEST(SimCommunicator, MismatchedCollectivesAreAnInfrastructureError) {
  const RankLayout layout = example_a();
  SimCommunicator comm(layout);
  std::vector<double> a(2, 1.0), b(3, 1.0);
  comm.all_reduce(0, group_of(layout, Family::tp, 0), a, ReduceOp::sum, "stats");
  EXPECT_THROW(comm.all_reduce(1, group_of(layout, Family::tp, 1), b, ReduceOp::sum, "stats"),
               InfraError);
}

TEST(SimCommunicator, ANonMemberIsAProgrammingError) {
  const RankLayout layout = example_a();
  SimCommunicator comm(layout);
  double value = 1.0;
  EXPECT_THROW(comm.all_reduce(3, group_of(layout, Family::tp, 0), std::span(&value, 1),
                               ReduceOp::sum, "stats"),
               std::logic_error);
}

// Sums in group order: every member gets bit-identical results, run after run.
RC_GTEST_PROP(SimCommunicatorProperty, SumEqualsTheGroupOrderSumOnEveryMember, ()) {
  const ParallelConfig c = *testing::valid_config(3);
  const RankLayout layout(c);
  const Family family = *rc::gen::elementOf(std::vector<Family>(topologies::kAllFamilies.begin(),
                                                                topologies::kAllFamilies.end()));
  RC_PRE(family != Family::embedding);
  std::vector<double> values(c.world);
  for (int r = 0; r < c.world; ++r) values[r] = 1.0 / (r + 3);
  std::vector<double> reduced = values;
  SimCommunicator comm(layout);
  for (int r = 0; r < c.world; ++r)
    comm.all_reduce(r, group_of(layout, family, r), std::span(&reduced[r], 1), ReduceOp::sum, "p");
  comm.end_phase();
  for (int r = 0; r < c.world; ++r) {
    double expected = 0.0;
    bool first = true;
    for (int member : layout.group_ranks(family, r)) {
      expected = first ? values[member] : expected + values[member];
      first = false;
    }
    RC_ASSERT(reduced[r] == expected);
  }
}

}  // namespace
}  // namespace tally::comm
