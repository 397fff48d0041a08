// megatron-core's rules (run/megatron_core/rules.h): what the worker builds, and every generated
// case one it builds, for each release.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <string>
#include <vector>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "run/deepspeed/section.h"
#include "run/megatron_core/rules.h"
#include "topologies/logical_model.h"
#include "topologies/model_spec.h"
#include "vocab/optimizer_models.h"
#include "tests/support/founding_case.h"

namespace tally::run {
namespace {

using testing::founding_case;

RC_GTEST_PROP(MegatronCoreTarget, EveryGeneratedCaseIsOneTheWorkerBuilds, ()) {
  const std::string version = *rc::gen::element<std::string>("0.16.1", "0.19.2");
  fuzz::CaseGenOptions options;
  options.topology.max_world = 16;
  options.topology.avoid_megatron_corners = false;
  options.gpt_only = true;
  options.restrict_to = [version](casefile::Case c) { return within_megatron_core(std::move(c), version); };
  const casefile::Case c = *fuzz::gen_case(options);
  RC_ASSERT(!casefile::check_case(c));
  const std::optional<std::string> refusal = megatron_core_refusal(c, version);
  RC_ASSERT(!refusal);
}

TEST(MegatronCoreTarget, NamesWhatTheWorkerCannotBuild) {
  casefile::Case c = founding_case();
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2"));
  c.model.mtp_num_layers = 1;
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2")) << "0.19's MTP block, on one stage";
  EXPECT_EQ(megatron_core_refusal(c, "0.16.1").value_or("").rfind("model.mtp_num_layers 1:", 0), 0u);
  c = founding_case();
  c.path.optimizer = vocab::OptimizerModel::muon;
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2"));
  EXPECT_NE(megatron_core_refusal(c, "0.16.1").value_or("").find("list.remove"), std::string::npos);
  EXPECT_EQ(within_megatron_core(c, "0.16.1").path.optimizer, vocab::OptimizerModel::layerwise);
  c = founding_case();
  c.topology = {.world = 2, .pp = 2, .vpp = 2};
  c.model = {};
  c.model.num_layers = 4;
  c.model.first_stage_layers = 2;
  c.model.last_stage_layers = 2;
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_NE(megatron_core_refusal(c, "0.19.2").value_or("").find("ZeroDivisionError"), std::string::npos);
  const casefile::Case within = within_megatron_core(c, "0.19.2");
  EXPECT_FALSE(casefile::check_case(within));
  EXPECT_FALSE(megatron_core_refusal(within, "0.19.2"));
  EXPECT_EQ(topologies::layers_of(within.model, 2, 2, 1, 1).count, 1) << "the last stage keeps its layers";
  c = founding_case();
  c.path.p_values = {3.0};
  EXPECT_NE(megatron_core_refusal(c, "0.19.2").value_or("").find("p_norms"), std::string::npos);
  c = founding_case();
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  EXPECT_EQ(megatron_core_refusal(c, "0.19.2").value_or("").rfind("deepspeed: a DeepSpeed case", 0), 0u);
}

TEST(MegatronCoreTarget, ReleasesCompareByMajorAndMinor) {
  EXPECT_TRUE(megatron_core_older_than("0.16.1", 0, 19));
  EXPECT_FALSE(megatron_core_older_than("0.19.2", 0, 19));
  EXPECT_FALSE(megatron_core_older_than("0.20.0rc1", 0, 19));
  EXPECT_FALSE(megatron_core_older_than("unknown", 0, 19)) << "an unknown version counts as the newest";
}

}  // namespace
}  // namespace tally::run
