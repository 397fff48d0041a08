// Attention sinks on the megatron-core target (run/megatron_core/rules.h): the worker builds the
// local DotProductAttention's learnable softmax_offset. With 0.19.2, where that build has run on a
// GPU and agreed with tally's model of the release, cases with sinks run and are generated; with a
// release where it has not (0.16.1), a case with sinks is refused saying so (not that the framework
// cannot), and generated cases take none. What both releases count of them (Megatron-LM #7452) is
// in tally's model of both, and the known finding of each release names it.
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

TEST(MegatronSinks, ACaseWithAttentionSinksRunsOnTheReleaseWhoseBuildRanOnAGpu) {
  EXPECT_FALSE(megatron_core_refusal(sink_case(), "0.19.2"));
  EXPECT_FALSE(megatron_core_refusal(sink_case(), "")) << "the rules of every release: 0.19.2 runs it";
}

TEST(MegatronSinks, OnAnotherReleaseItIsRefusedAsNotYetRunOnAGpuNotAsTheFrameworksLimit) {
  const std::optional<std::string> why = megatron_core_refusal(sink_case(), "0.16.1");
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->rfind("model.softmax_type learnable with megatron-core 0.16.1: the worker builds attention sinks", 0),
            0u)
      << *why;
  EXPECT_NE(why->find("dot_product_attention.py:126-138"), std::string::npos) << *why;
  EXPECT_NE(why->find("has run on a GPU only with 0.19.2"), std::string::npos) << *why;
}

TEST(MegatronSinks, GeneratedCasesKeepAttentionSinksWhereTheyRunAndDropThemWhereTheyAreRefused) {
  const casefile::Case kept = within_megatron_core(sink_case(), "0.19.2", {}, 1);
  EXPECT_EQ(kept.model.softmax_type, topologies::SoftmaxType::learnable);
  EXPECT_FALSE(megatron_core_refusal(kept, "0.19.2"));
  const casefile::Case dropped = within_megatron_core(sink_case(), "0.16.1", {}, 1);
  EXPECT_EQ(dropped.model.softmax_type, topologies::SoftmaxType::vanilla);
  EXPECT_FALSE(megatron_core_refusal(dropped, "0.16.1"));
}

}  // namespace
}  // namespace tally::run
