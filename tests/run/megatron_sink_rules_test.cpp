// Attention sinks on the megatron-core target (run/megatron_core/rules.h): the worker builds the
// local DotProductAttention's learnable softmax_offset, so a case with sinks runs and generated
// cases keep them; what megatron-core 0.16.1 and 0.19.2 count of them is their miscount to show
// (Megatron-LM #7452), not a reason to refuse.
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

TEST(MegatronSinks, ACaseWithAttentionSinksRunsOnBothReleases) {
  for (const char* version : {"0.16.1", "0.19.2"}) {
    const std::optional<std::string> why = megatron_core_unsupported(sink_case(), version);
    EXPECT_FALSE(why.has_value()) << version << ": " << why.value_or("");
  }
}

TEST(MegatronSinks, GeneratedCasesKeepTheirAttentionSinks) {
  const casefile::Case within = within_megatron_core(sink_case(), "0.19.2", {}, 1);
  EXPECT_EQ(within.model.softmax_type, topologies::SoftmaxType::learnable);
  EXPECT_FALSE(megatron_core_unsupported(within, "0.19.2"));
}

}  // namespace
}  // namespace tally::run
