// Each rank's share of a case's gradients for a framework's own reduction (run/contributions.h),
// sent with the request where the target's row states the groups (DeepSpeed's:
// run/deepspeed/engine.h): the shares of a group add up exactly to the gradient times the divisor,
// every rank's is nonzero, and the request's identity does not change with them.
#include "run/contributions.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/gradient_generator.h"
#include "run/deepspeed/engine.h"
#include "run/deepspeed/section.h"
#include "run/framework_worker.h"
#include "tests/support/founding_case.h"

namespace tally::run {
namespace {

// Rank by rank, each addition rounded to the dtype, as a collective adds them.
float group_sum(const DealtShares& dealt, std::size_t elements, int ranks, std::size_t e, kernels::Dtype dtype) {
  double sum = 0;
  for (int r = 0; r < ranks; ++r)
    sum = kernels::round_to(sum + dealt.shares[static_cast<std::size_t>(r) * elements + e], dtype);
  return static_cast<float>(sum);
}

TEST(DealShares, EachGroupAddsUpToTheGradientTimesTheDivisorWithEveryRankGiving) {
  const std::vector<float> values = {1.0f, 0.0f, -3.0f, 0.375f};
  for (int ranks : {2, 3, 4, 8}) {
    const DealtShares dealt = deal_shares(values, ranks, 4, kernels::Dtype::bf16);
    ASSERT_EQ(dealt.shares.size(), values.size() * static_cast<std::size_t>(ranks));
    EXPECT_EQ(dealt.given_whole, 0) << ranks;
    for (std::size_t e = 0; e < values.size(); ++e) {
      EXPECT_EQ(group_sum(dealt, values.size(), ranks, e, kernels::Dtype::bf16), values[e] * 4) << ranks << " " << e;
      for (int r = 0; r < ranks; ++r)
        EXPECT_NE(dealt.shares[static_cast<std::size_t>(r) * values.size() + e], 0.0f) << ranks << " " << e << " " << r;
    }
  }
}

TEST(DealShares, AGradientWithNoExactSharesIsGivenWholeByTheFirstRankAndCounted) {
  // 255 * 3 = 765 needs 10 significant bits, more than bf16's 8.
  const DealtShares dealt = deal_shares(std::vector<float>{255.0f, 1.0f}, 2, 3, kernels::Dtype::bf16);
  EXPECT_EQ(dealt.given_whole, 1);
  EXPECT_EQ(dealt.shares[0], 765.0f);
  EXPECT_EQ(dealt.shares[2], 0.0f);
  EXPECT_EQ(dealt.shares[1] + dealt.shares[3], 3.0f);
}

TEST(DealShares, AGroupLargerThanTheDtypeCanCountIsGivenWhole) {
  const DealtShares dealt = deal_shares(std::vector<float>{1.0f}, 512, 1, kernels::Dtype::bf16);
  EXPECT_EQ(dealt.given_whole, 1);
  EXPECT_EQ(dealt.shares[0], 1.0f);
}

TEST(DealShares, AGroupOfNoRanksIsTheCallersError) {
  EXPECT_THROW(deal_shares(std::vector<float>{1.0f}, 0, 1, kernels::Dtype::fp32), std::invalid_argument);
  EXPECT_THROW(deal_shares(std::vector<float>{1.0f}, 2, 0, kernels::Dtype::fp32), std::invalid_argument);
}

TEST(LogicalGradients, SendTheSharesOfEachGroupSizeWithoutChangingTheRequestsIdentity) {
  casefile::Case c = testing::founding_case();
  const LogicalGradients plain = logical_gradients(c);
  const LogicalGradients dealt = logical_gradients(c, ReductionGroups{{2, 4}, 4});
  EXPECT_EQ(dealt.case_digest, plain.case_digest);
  EXPECT_EQ(dealt.values, plain.values);
  ASSERT_EQ(dealt.shares.size(), 2u);
  EXPECT_EQ(dealt.shares.at(2).shares.size(), 2 * plain.values.size());
  EXPECT_EQ(dealt.shares.at(4).shares.size(), 4 * plain.values.size());
  const nlohmann::json index = nlohmann::json::parse(dealt.index_json);
  EXPECT_EQ(index.at("shares").at("divisor"), 4);
  EXPECT_EQ(index.at("shares").at("group_sizes"), nlohmann::json({2, 4}));
  EXPECT_TRUE(index.at("shares").at("given_whole").contains("2"));
  EXPECT_FALSE(nlohmann::json::parse(plain.index_json).contains("shares"));
  EXPECT_TRUE(plain.shares.empty());
}

TEST(DeepSpeedReduction, DenseOverDpExpertsOverExpertDpBothDividedByDp) {
  casefile::Case c = testing::founding_case();
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  c.model.num_experts = 4;
  c.topology = {.world = 8, .tp = 2, .ep = 2, .etp = 2};
  EXPECT_EQ(deepspeed_reduction_groups(c), (ReductionGroups{{4, 2}, 4})) << "expert TP: DP / EP of a TP lane";
  c.topology = {.world = 8, .tp = 2, .ep = 2, .etp = 1};
  EXPECT_EQ(deepspeed_reduction_groups(c), (ReductionGroups{{4}, 4})) << "no expert TP: 8 ranks / EP 2, TP ranks included";
  c.topology = {.world = 2, .tp = 2, .ep = 1, .etp = 1};
  EXPECT_EQ(deepspeed_reduction_groups(c), (ReductionGroups{{1, 2}, 1})) << "the TP ranks sum an expert's gradient";
  c.topology = {.world = 4, .ep = 1};
  EXPECT_EQ(deepspeed_reduction_groups(c), (ReductionGroups{{4}, 4})) << "EP 1, TP 1: the expert-DP group is the DP group";
  c.model.num_experts = 0;
  c.topology = {.world = 8, .tp = 2, .pp = 2};
  EXPECT_EQ(deepspeed_reduction_groups(c), (ReductionGroups{{2}, 2})) << "the pipeline grid's DP";
}

}  // namespace
}  // namespace tally::run
