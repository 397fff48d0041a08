// The layer-wise optimizer over megatron-core 0.19's parameter layout (optimizer.
// layer_wise_param_layout, run/megatron_core/rules.h): generated layer-wise cases take it where the
// release has it, each such case is one the worker builds, and every case it cannot run is refused
// in one line naming the field and the rule.
#include <algorithm>
#include <map>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "casefile/case_file.h"
#include "run/megatron_core/megatron_args.h"
#include "fuzz/generators.h"
#include "fuzz/known.h"
#include "run/megatron_core/rules.h"
#include "run/megatron_core/section.h"
#include "run/target.h"
#include "tests/support/worker_rule_cases.h"

namespace tally::run {
namespace {

// The founding case (TP 2, EP 2, ETP 1 on world 2) without biases, as Megatron-LM 0.19 trains
// `--optimizer muon --use-distributed-optimizer`.
casefile::Case layout_case() {
  casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.pass.json", run::case_frameworks());
  c.expect.reset();
  c.model.add_bias_linear = false;
  c.path.optimizer = vocab::OptimizerModel::layerwise;
  c.path.layer_wise_param_layout = true;
  return c;
}

bool starts_with(const std::optional<std::string>& text, std::string_view prefix) {
  return text && text->rfind(prefix, 0) == 0;
}

RC_GTEST_PROP(LayerWiseLayout, EveryGeneratedCaseIsOneTheWorkerBuilds, ()) {
  const int world = *rc::gen::element(2, 4, 8);
  const std::string version = *rc::gen::element<std::string>("0.16.1", "0.19.2");
  const casefile::Case c = *fuzz::gen_case(testing::gpt_cases_within(world, [&version](casefile::Case c, std::uint64_t draw) {
    return within_megatron_core(std::move(c), version, {}, draw);
  }));
  RC_ASSERT(!casefile::check_case(c));
  RC_ASSERT(!megatron_core_refusal(c, version));
  if (c.path.layer_wise_param_layout) {
    RC_ASSERT(version == "0.19.2");
    RC_ASSERT(c.path.optimizer == vocab::OptimizerModel::layerwise);
  }
}

TEST(LayerWiseLayout, HalfTheLayerWiseCasesTakeItWhereTheReleaseHasIt) {
  std::map<std::string, int> drawn;
  for (std::uint64_t draw = 0; draw < 400; ++draw) {
    casefile::Case c = layout_case();
    c.path.layer_wise_param_layout = false;
    c = within_megatron_core(std::move(c), "0.19.2", {}, draw);
    drawn[kMegatronFsdpSection.of(c) ? "fsdp" : c.path.layer_wise_param_layout ? "layout" : "layerwise"] += 1;
  }
  EXPECT_EQ(drawn["fsdp"], 80) << "a fifth are Megatron-FSDP";
  EXPECT_EQ(drawn["layout"], 160);
  EXPECT_EQ(drawn["layerwise"], 160);
  casefile::Case c = layout_case();
  EXPECT_FALSE(within_megatron_core(c, "0.16.1", {}, 40).path.layer_wise_param_layout);
  EXPECT_FALSE(within_megatron_core(c, "0.19.2", {}, 40, {{"optimizer.layer_wise_param_layout", "a stand-in"}})
                   .path.layer_wise_param_layout);
  c.model.add_bias_linear = true;
  EXPECT_FALSE(within_megatron_core(c, "0.19.2", {}, 40).path.layer_wise_param_layout)
      << "expert biases: Megatron asserts";
  c = layout_case();
  c.path.optimizer = vocab::OptimizerModel::distributed;
  EXPECT_FALSE(within_megatron_core(c, "0.19.2", {}, 40).path.layer_wise_param_layout) << "a shrink to another model";
}

TEST(LayerWiseLayout, NamesWhatTheWorkerCannotRun) {
  casefile::Case c = layout_case();
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2"));
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.16.1"),
                          "optimizer.layer_wise_param_layout: tally's worker does not build the layer-wise "
                          "parameter layout with megatron-core 0.16.1"));
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2", {}, {{"optimizer.layer_wise_param_layout", "why"}}),
                          "optimizer.layer_wise_param_layout: tally's worker does not build the layer-wise "
                          "parameter layout on this machine"));
  c.path.bucket_elements = 64;
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"),
                          "optimizer.bucket_elements 64 with optimizer.layer_wise_param_layout:"));
  EXPECT_EQ(within_megatron_core(c, "0.19.2", {}, 41).path.bucket_elements, 0);
  c.path.bucket_elements = 0;
  c.model.add_bias_linear = true;
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"),
                          "optimizer.layer_wise_param_layout with expert biases (model.add_bias_linear, num_experts 2)"));
  c.model.num_experts = 0;
  c.model.moe_ffn_hidden_size.reset();
  c.topology.ep = 1;
  c.topology.etp = c.topology.tp;
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2")) << "dense biases are the DistributedOptimizer's";
}

TEST(LayerWiseLayout, BelongsToTheLayerWiseModelAlone) {
  casefile::Case c = layout_case();
  c.path.optimizer = vocab::OptimizerModel::distributed;
  EXPECT_EQ(casefile::check_case(c),
            "optimizer.layer_wise_param_layout belongs to optimizer.model layerwise (the layer-wise optimizer's "
            "parameter layout), not distributed");
}

TEST(LayerWiseLayout, RoundTripsThroughACaseFileAndIsWrittenOnlyWhenSet) {
  const casefile::Case c = layout_case();
  const std::string text = casefile::case_to_text(c);
  EXPECT_NE(text.find("\"layer_wise_param_layout\": true"), std::string::npos) << text;
  EXPECT_EQ(casefile::case_from_text(text, "layout.json", run::case_frameworks()), c);
  casefile::Case without = c;
  without.path.layer_wise_param_layout = false;
  EXPECT_EQ(casefile::case_to_text(without).find("layer_wise_param_layout"), std::string::npos);
}

TEST(LayerWiseLayout, IsMegatronCoresAlone) {
  const casefile::Case c = layout_case();
  ASSERT_NE(framework_of(c), nullptr);
  EXPECT_EQ(framework_of(c)->name, "megatron-core");
  EXPECT_TRUE(starts_with(other_frameworks_section(c, "deepspeed"), "optimizer.layer_wise_param_layout:"));
  EXPECT_FALSE(other_frameworks_section(c, "megatron-core"));
  EXPECT_FALSE(framework_of(c)->release_model_case(c, "0.19.2")) << "tally's model has no parameter layout";
  EXPECT_EQ(framework_of(c)->norm_code(c), "layerwise layout");
  EXPECT_TRUE(fuzz::norm_code_filter("layerwise")(c));
  EXPECT_TRUE(fuzz::norm_code_filter("layerwise layout")(c));
}

TEST(LayerWiseLayout, ShowsMegatronLmsFlags) {
  casefile::Case c = layout_case();
  const std::vector<std::string> with = megatron_args(c).args;
  EXPECT_NE(std::find(with.begin(), with.end(), "--use-distributed-optimizer"), with.end());
  EXPECT_EQ(std::find(with.begin(), with.end(), "--no-use-layer-wise-param-layout"), with.end());
  c.path.layer_wise_param_layout = false;
  const std::vector<std::string> without = megatron_args(c).args;
  EXPECT_NE(std::find(without.begin(), without.end(), "--no-use-layer-wise-param-layout"), without.end());
}

}  // namespace
}  // namespace tally::run
