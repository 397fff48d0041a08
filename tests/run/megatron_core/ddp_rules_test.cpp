// What the megatron-core worker runs of DDP's bucketing (run/megatron_core/rules.h): tally's worker
// does not overlap the gradient reduction, so megatron-core lays out one bucket per buffer; a case
// that asks for buckets is refused naming that, and generated cases take one bucket.
#include <gtest/gtest.h>

#include "run/megatron_core/rules.h"

namespace tally::run {
namespace {

casefile::Case distributed_case() {
  casefile::Case c;
  c.topology = {.world = 2};
  c.path.optimizer = vocab::OptimizerModel::distributed;
  return c;
}

TEST(MegatronDdp, BucketsAreRefusedNamingDdpsOwnRule) {
  casefile::Case c = distributed_case();
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2"));
  c.path.bucket_elements = 64;
  for (const char* version : {"0.16.1", "0.19.2"}) {
    const std::optional<std::string> why = megatron_core_refusal(c, version);
    ASSERT_TRUE(why.has_value()) << version;
    EXPECT_EQ(why->rfind("optimizer.bucket_elements 64: tally's worker does not build DDP buckets", 0), 0u) << *why;
    EXPECT_NE(why->find("distributed_data_parallel.py"), std::string::npos) << *why;
  }
}

TEST(MegatronDdp, GeneratedCasesTakeOneBucketPerBuffer) {
  casefile::Case c = distributed_case();
  c.path.bucket_elements = 64;
  const casefile::Case within = within_megatron_core(c, "0.19.2", {}, 1);
  EXPECT_EQ(within.path.bucket_elements, 0);
  EXPECT_FALSE(megatron_core_refusal(within, "0.19.2"));
}

}  // namespace
}  // namespace tally::run
