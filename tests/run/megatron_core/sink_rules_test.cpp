// Attention sinks on the megatron-core target (run/megatron_core/rules.h): the worker builds the
// local DotProductAttention's learnable softmax_offset, but until that build has run on a GPU a
// case with sinks is refused saying so (not that the framework cannot), and generated cases take
// none. What 0.16.1 and 0.19.2 count of them (Megatron-LM #7452) is in tally's model of both.
#include <gtest/gtest.h>

#include "run/megatron_core/rules.h"

namespace tally::run {
namespace {

casefile::Case sink_case() {
  casefile::Case c;
  c.topology = {.world = 2, .tp = 2};
  c.model.softmax_type = topologies::SoftmaxType::learnable;
  return c;
}

TEST(MegatronSinks, ACaseWithAttentionSinksIsRefusedAsNotYetRunOnAGpuNotAsTheFrameworksLimit) {
  for (const char* version : {"0.16.1", "0.19.2"}) {
    const std::optional<std::string> why = megatron_core_refusal(sink_case(), version);
    ASSERT_TRUE(why.has_value()) << version;
    EXPECT_EQ(why->rfind("model.softmax_type learnable: the worker builds attention sinks", 0), 0u) << *why;
    EXPECT_NE(why->find("dot_product_attention.py:126-138"), std::string::npos) << *why;
    EXPECT_NE(why->find("has not yet run on a GPU"), std::string::npos) << *why;
  }
}

TEST(MegatronSinks, GeneratedCasesTakeNoAttentionSinksWhileTheyAreRefused) {
  const casefile::Case within = within_megatron_core(sink_case(), "0.19.2", {}, 1);
  EXPECT_EQ(within.model.softmax_type, topologies::SoftmaxType::vanilla);
  EXPECT_FALSE(megatron_core_refusal(within, "0.19.2"));
}

}  // namespace
}  // namespace tally::run
