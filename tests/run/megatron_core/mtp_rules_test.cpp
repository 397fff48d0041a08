// What the megatron-core worker runs of multi-token prediction (run/megatron_core/rules.h): 0.19's
// MTP block on one stage, its separate grad-norm group reported; every other MTP case refused in
// one line naming the field and the rule, and generated cases drop MTP where it would be refused.
#include <gtest/gtest.h>

#include "casefile/case_file.h"
#include "run/megatron_core/rules.h"
#include "run/megatron_core/section.h"

namespace tally::run {
namespace {

// A dense GPT of two layers with one MTP layer whose params have a grad-norm group of their own.
casefile::Case mtp_case(int world, int pp) {
  casefile::Case c;
  c.topology = {.world = world, .pp = pp};
  c.model.num_layers = 2;
  c.model.mtp_num_layers = 1;
  c.model.mtp_detach_heads = true;
  return c;
}

bool starts_with(const std::optional<std::string>& text, std::string_view prefix) {
  return text && text->rfind(prefix, 0) == 0;
}

TEST(MegatronMtp, RunsOnOneStageOfRelease0_19) {
  const casefile::Case c = mtp_case(2, 1);
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2"));
  const casefile::Case within = within_megatron_core(c, "0.19.2", {}, 1);
  EXPECT_EQ(within.model.mtp_num_layers, 1);
  EXPECT_TRUE(within.model.mtp_detach_heads);
}

TEST(MegatronMtp, NamesWhatTheWorkerDoesNotRecord) {
  casefile::Case c = mtp_case(2, 1);
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.16.1"),
                          "model.mtp_num_layers 1: tally's worker does not build multi-token prediction with "
                          "megatron-core 0.16.1"));
  c = mtp_case(2, 2);
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"), "model.mtp_num_layers 1 with topology.pp 2:"));
  c = mtp_case(2, 1);
  c.path.optimizer = vocab::OptimizerModel::distributed;
  kMegatronFsdpSection.set(c, MegatronFsdpConfig{});
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"), "model.mtp_num_layers 1 with megatron_fsdp:"));
}

TEST(MegatronMtp, NamesWhereMegatronAndTallysModelBuildItDifferently) {
  casefile::Case c = mtp_case(2, 1);
  c.topology.ep = 2;
  c.topology.etp = 1;
  c.model.num_experts = 2;
  c.model.moe_layer_freq = 2;  // layer 1, the last, is dense
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"), "model.mtp_num_layers 1 with model.moe_layer_freq 2:"));
  EXPECT_EQ(within_megatron_core(c, "0.19.2", {}, 1).model.mtp_num_layers, 0);
  c.model.num_layers = 3;  // layer 2 is MoE
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2"));
}

TEST(MegatronMtp, ItsOwnNormUnderTheLayerWiseParameterLayoutIsRefusedAndLeftAttachedWhenDrawn) {
  casefile::Case c = mtp_case(2, 1);
  c.path.optimizer = vocab::OptimizerModel::layerwise;
  c.path.layer_wise_param_layout = true;
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"),
                          "model.mtp_detach_heads with optimizer.layer_wise_param_layout:"));
  const casefile::Case within = within_megatron_core(c, "0.19.2", {}, 1);
  EXPECT_TRUE(within.path.layer_wise_param_layout);
  EXPECT_EQ(within.model.mtp_num_layers, 1);
  EXPECT_FALSE(within.model.mtp_detach_heads);
  EXPECT_FALSE(megatron_core_refusal(within, "0.19.2"));
}

TEST(MegatronMtp, GeneratedCasesDropItWhereItWouldBeRefused) {
  for (const auto& [c, version] : {std::pair{mtp_case(2, 2), "0.19.2"}, std::pair{mtp_case(2, 1), "0.16.1"}}) {
    const casefile::Case within = within_megatron_core(c, version, {}, 1);
    EXPECT_EQ(within.model.mtp_num_layers, 0) << version;
    EXPECT_FALSE(within.model.mtp_detach_heads) << version;
    EXPECT_FALSE(megatron_core_refusal(within, version)) << version;
  }
}

}  // namespace
}  // namespace tally::run
