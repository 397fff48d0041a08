#include "topologies/parallel_config.h"

#include <gtest/gtest.h>
#include "tests/support/configs.h"

namespace tally::topologies {
namespace {

std::string error_of(const ParallelConfig& c) { return check_config(c).value_or("(valid)"); }

TEST(ParallelConfig, DerivesDpAndEdp) {
  const ParallelConfig c = testing::config(8, 2, 1, 1, 4, 1);
  EXPECT_EQ(check_config(c), std::nullopt);
  EXPECT_EQ(dp(c), 4);
  EXPECT_EQ(edp(c), 2);
}

TEST(ParallelConfig, EverySizeMustBePositive) {
  EXPECT_EQ(error_of(testing::config(0, 1, 1, 1, 1, 1)), "world must be at least 1 (got 0)");
  EXPECT_EQ(error_of(testing::config(8, 0, 1, 1, 1, 1)), "tp must be at least 1 (got 0)");
  EXPECT_EQ(error_of(testing::config(8, 1, -2, 1, 1, 1)), "cp must be at least 1 (got -2)");
  EXPECT_EQ(error_of(testing::config(8, 1, 1, 0, 1, 1)), "pp must be at least 1 (got 0)");
  EXPECT_EQ(error_of(testing::config(8, 1, 1, 1, 0, 1)), "ep must be at least 1 (got 0)");
  EXPECT_EQ(error_of(testing::config(8, 1, 1, 1, 1, 0)), "etp must be at least 1 (got 0)");
  ParallelConfig c = testing::config(8, 1, 1, 1, 1, 1);
  c.vpp = 0;
  EXPECT_EQ(error_of(c), "vpp must be at least 1 (got 0)");
  c.vpp = 1;
  c.dist_opt_instances = 0;
  EXPECT_EQ(error_of(c), "dist_opt_instances must be at least 1 (got 0)");
}

TEST(ParallelConfig, WorldHasAnUpperBound) {
  EXPECT_EQ(error_of(testing::config(kMaxWorld * 2, 1, 1, 1, 1, 1)),
            "world 2097152 is larger than tally supports (at most 1048576 ranks)");
}

TEST(ParallelConfig, OrderTokensMustBeKnownDistinctAndNonEmpty) {
  EXPECT_EQ(error_of(testing::config(8, 1, 1, 1, 1, 1, 1, "tp-xx")),
            "order 'tp-xx' has unknown token 'xx' (tokens: tp, cp, ep, dp, pp; the gtp_remat axis is "
            "placed by Megatron-LM, after tp in the dense grid and after ep in the expert grid)");
  EXPECT_EQ(error_of(testing::config(8, 1, 1, 1, 1, 1, 1, "tp-dp-tp")), "order 'tp-dp-tp' repeats token 'tp'");
  EXPECT_EQ(error_of(testing::config(8, 1, 1, 1, 1, 1, 1, "tp--dp")),
            "order 'tp--dp' has an empty token (write tokens joined by '-', e.g. tp-cp-ep-dp-pp)");
  EXPECT_EQ(error_of(testing::config(8, 1, 1, 1, 1, 1, 1, "")),
            "order '' has an empty token (write tokens joined by '-', e.g. tp-cp-ep-dp-pp)");
}

TEST(ParallelConfig, WorldMustDivideByTpCpPp) {
  EXPECT_EQ(error_of(testing::config(12, 2, 1, 4, 1, 2)), "world 12 is not divisible by tp*cp*pp = 8");
  EXPECT_EQ(error_of(testing::config(4, 2, 2, 2, 1, 2)), "world 4 is not divisible by tp*cp*pp = 8");
}

TEST(ParallelConfig, WorldMustDivideByEtpEpPp) {
  EXPECT_EQ(error_of(testing::config(12, 2, 1, 1, 8, 1)), "world 12 is not divisible by etp*ep*pp = 8");
  // Four sizes of 2^16 multiply to 2^64: no overflow, the whole product named.
  topologies::ParallelConfig huge = testing::config(1 << 20, 1 << 16, 1 << 16, 1 << 16, 1, 1);
  huge.gtp = 1 << 16;
  EXPECT_EQ(error_of(huge),
            "world 1048576 is not divisible by tp*gtp*cp*pp = 18446744073709551616");
}

TEST(ParallelConfig, AnAxisLeftOutOfTheOrderMustHaveSizeOne) {
  EXPECT_EQ(error_of(testing::config(8, 2, 2, 1, 1, 2, 1, "tp-dp-pp")),
            "order 'tp-dp-pp' omits cp, but cp = 2 (an axis left out of the order must have size 1)");
  EXPECT_EQ(error_of(testing::config(8, 2, 1, 1, 2, 1, 1, "tp-dp-pp")),
            "order 'tp-dp-pp' omits ep, but ep = 2 (an axis left out of the order must have size 1)");
  // dp is 1 in the dense grid but edp is 2 in the expert grid.
  EXPECT_EQ(error_of(testing::config(4, 2, 2, 1, 1, 2, 1, "tp-cp-pp")),
            "order 'tp-cp-pp' omits dp, but edp = 2 (an axis left out of the order must have size 1)");
  EXPECT_EQ(check_config(testing::config(4, 2, 1, 2, 1, 2, 1, "tp-pp")), std::nullopt);
}

TEST(ParallelConfig, OrderNotEndingInPpNeedsEqualDpAndEdp) {
  EXPECT_EQ(error_of(testing::config(8, 2, 1, 2, 1, 1, 1, "tp-cp-ep-pp-dp")),
            "order 'tp-cp-ep-pp-dp' does not end in pp and pp = 2, so edp (4) must equal dp (2)");
  EXPECT_EQ(check_config(testing::config(8, 2, 1, 2, 1, 1, 1, "tp-cp-ep-dp-pp")), std::nullopt);
  EXPECT_EQ(check_config(testing::config(8, 2, 1, 1, 1, 1, 1, "tp-cp-ep-pp-dp")), std::nullopt);
}

TEST(ParallelConfig, PipelineGroupsMustMatchInBothGrids) {
  EXPECT_EQ(error_of(testing::config(8, 2, 1, 2, 2, 1, 1, "tp-pp-cp-ep-dp")),
            "pipeline groups differ between the dense grid (pp stride 2) and the expert grid (pp "
            "stride 1) under order 'tp-pp-cp-ep-dp': Megatron-LM requires identical pp groups (tp "
            "2, etp 1, ep 2, cp 1)");
  EXPECT_EQ(check_config(testing::config(8, 2, 1, 2, 1, 2, 1, "tp-pp-cp-ep-dp")), std::nullopt);
}

TEST(ParallelConfig, VirtualPipelineNeedsPipeline) {
  ParallelConfig c = testing::config(8, 2, 1, 1, 1, 2);
  c.vpp = 2;
  EXPECT_EQ(error_of(c), "vpp 2 needs pp > 1 (the interleaved schedule splits each pipeline stage)");
  c.pp = 2;
  EXPECT_EQ(check_config(c), std::nullopt);
}

TEST(ParallelConfig, DistOptInstancesMustDivideDpCpAndEdp) {
  ParallelConfig c = testing::config(8, 1, 1, 1, 1, 1);
  c.dist_opt_instances = 3;
  EXPECT_EQ(error_of(c), "dist_opt_instances 3 does not divide dp*cp = 8");
  c = testing::config(8, 1, 1, 1, 4, 1);
  c.dist_opt_instances = 4;
  EXPECT_EQ(error_of(c), "dist_opt_instances 4 does not divide edp = 2");
  c.dist_opt_instances = 2;
  EXPECT_EQ(check_config(c), std::nullopt);
}

TEST(ParseOrder, AppendsMissingAxesAsMegatronDoes) {
  std::string error;
  EXPECT_EQ(order_string(*parse_order("tp-dp", &error)), "tp-dp-pp-ep-cp");
  EXPECT_EQ(order_string(*parse_order("pp", &error)), "pp-tp-dp-ep-cp");
  EXPECT_EQ(order_string(*parse_order(kDefaultOrder, &error)), "tp-cp-ep-dp-pp");
}

TEST(ParseOrder, TokensAreCaseSensitive) {
  std::string error;
  EXPECT_FALSE(parse_order("TP-DP", &error));
  EXPECT_EQ(error, "order 'TP-DP' has unknown token 'TP' (tokens: tp, cp, ep, dp, pp; the gtp_remat axis is "
            "placed by Megatron-LM, after tp in the dense grid and after ep in the expert grid)");
}

}  // namespace
}  // namespace tally::topologies
