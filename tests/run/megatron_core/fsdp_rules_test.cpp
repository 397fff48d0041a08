// What the megatron-core worker runs of Megatron-FSDP (run/megatron_core/rules.h): generated cases
// draw every strategy, each is one the worker builds, and each case Megatron-FSDP cannot run is
// refused in one line naming the field and the rule.
#include <map>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "fuzz/known.h"
#include "run/megatron_core/rules.h"
#include "run/megatron_core/section.h"
#include "run/target.h"
#include "tests/support/worker_rule_cases.h"

namespace tally::run {
namespace {

// TP 2, EP 2, ETP 1 on world 2 (the founding case), as Megatron-FSDP with the distributed optimizer.
casefile::Case fsdp_case(FsdpSharding sharding = FsdpSharding::optim_grads_params) {
  casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.pass.json", run::case_frameworks());
  c.expect.reset();
  c.path.optimizer = vocab::OptimizerModel::distributed;
  kMegatronFsdpSection.set(c, MegatronFsdpConfig{.sharding = sharding});
  return c;
}

bool starts_with(const std::optional<std::string>& text, std::string_view prefix) {
  return text && text->rfind(prefix, 0) == 0;
}

RC_GTEST_PROP(MegatronFsdpTarget, EveryGeneratedCaseIsOneTheWorkerBuilds, ()) {
  const int world = *rc::gen::element(2, 4, 8);
  fuzz::CaseGenOptions options = testing::gpt_cases_of_world(world);
  options.restrict_to = [](casefile::Case c) {
    const std::uint64_t draw = c.path.gradients.generator.seed;
    return within_megatron_core(std::move(c), "0.19.2", {}, draw);
  };
  const casefile::Case c = *fuzz::gen_case(options);
  RC_ASSERT(!casefile::check_case(c));
  RC_ASSERT(c.topology.world == world);
  const std::optional<std::string> refusal = megatron_core_refusal(c, "0.19.2");
  RC_ASSERT(!refusal);
  if (kMegatronFsdpSection.of(c)) {
    RC_ASSERT(c.topology.pp == 1);
    RC_ASSERT(c.path.optimizer == vocab::OptimizerModel::distributed);
  }
}

RC_GTEST_PROP(MegatronFsdpTarget, ANormCodeCampaignDrawsOnlyThatCode, ()) {
  fuzz::CaseGenOptions options;
  options.topology.exact_world = 4;
  options.topology.max_world = 4;
  options.topology.avoid_megatron_corners = false;
  options.gpt_only = true;
  options.restrict_to = [](casefile::Case c) {
    const std::uint64_t draw = c.path.gradients.generator.seed;
    return within_megatron_core(std::move(c), "0.19.2", {}, draw);
  };
  options.keep_only = fuzz::norm_code_filter("megatron-fsdp");
  const casefile::Case c = *fuzz::gen_case(options);
  RC_ASSERT(kMegatronFsdpSection.of(c).has_value());
  RC_ASSERT(!megatron_core_refusal(c, "0.19.2"));
}

TEST(MegatronFsdpTarget, GeneratedCasesDrawEveryStrategyAboutAsOftenAsAnOptimizer) {
  std::map<std::string, int> drawn;
  for (std::uint64_t draw = 0; draw < 400; ++draw) {
    casefile::Case c = fsdp_case();
    casefile::keep_only_section(c, "");
    c.path.optimizer = vocab::OptimizerModel::plain;
    c = within_megatron_core(std::move(c), "0.19.2", {}, draw);
    drawn[kMegatronFsdpSection.of(c) ? std::string(fsdp_sharding_name(kMegatronFsdpSection.of(c)->sharding)) : "ddp"] += 1;
  }
  EXPECT_EQ(drawn["ddp"], 320);
  for (FsdpSharding sharding : kFsdpShardings)
    EXPECT_EQ(drawn[std::string(fsdp_sharding_name(sharding))], 20) << fsdp_sharding_name(sharding);
}

TEST(MegatronFsdpTarget, HybridFsdpKeepsTheInstancesDrawnForAnotherOptimizer) {
  casefile::Case c = fsdp_case();
  casefile::keep_only_section(c, "");
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = {.world = 4, .dist_opt_instances = 2};
  c.model.num_experts = 0;
  c.model.moe_ffn_hidden_size.reset();
  ASSERT_FALSE(casefile::check_case(c));
  // 35: a fifth (35 % 5), optim_grads_params (7 % 4), the outer strategy (35 / 20 odd).
  const casefile::Case hybrid = within_megatron_core(c, "0.19.2", {}, 35);
  ASSERT_TRUE(kMegatronFsdpSection.of(hybrid));
  EXPECT_EQ(hybrid.topology.dist_opt_instances, 2);
  EXPECT_EQ(kMegatronFsdpSection.of(hybrid)->outer_sharding, FsdpOuterSharding::optim);
  EXPECT_FALSE(megatron_core_refusal(hybrid, "0.19.2"));
  EXPECT_EQ(within_megatron_core(c, "0.19.2", {}, 36).topology.dist_opt_instances, 1) << "plain Adam: one instance";
}

TEST(MegatronFsdpTarget, HybridFsdpTakesTwoInstancesWhereTheLayoutAllowsThem) {
  casefile::Case c = fsdp_case();
  casefile::keep_only_section(c, "");
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = {.world = 4, .pp = 2};
  c.model.num_layers = 2;
  c.model.num_experts = 0;
  c.model.moe_ffn_hidden_size.reset();
  ASSERT_FALSE(casefile::check_case(c));
  // 35: a fifth, optim_grads_params, the outer strategy; the stages fold into DP 4.
  const casefile::Case hybrid = within_megatron_core(c, "0.19.2", {}, 35);
  ASSERT_TRUE(kMegatronFsdpSection.of(hybrid));
  EXPECT_EQ(hybrid.topology.pp, 1);
  EXPECT_EQ(hybrid.topology.dist_opt_instances, 2);
  EXPECT_EQ(kMegatronFsdpSection.of(hybrid)->outer_sharding, FsdpOuterSharding::optim);
  EXPECT_FALSE(megatron_core_refusal(hybrid, "0.19.2"));
  c.topology = {.world = 2, .tp = 2, .etp = 2};  // DP 1: one instance, so the outer strategy goes
  ASSERT_FALSE(casefile::check_case(c));
  const casefile::Case one = within_megatron_core(c, "0.19.2", {}, 35);
  ASSERT_TRUE(kMegatronFsdpSection.of(one));
  EXPECT_EQ(one.topology.dist_opt_instances, 1);
  EXPECT_EQ(kMegatronFsdpSection.of(one)->outer_sharding, FsdpOuterSharding::no_shard);
}

TEST(MegatronFsdpTarget, ANormCodeMatchesWholeWords) {
  casefile::Case c = fsdp_case(FsdpSharding::optim_grads);
  EXPECT_TRUE(fuzz::norm_code_filter("megatron-fsdp")(c));
  EXPECT_TRUE(fuzz::norm_code_filter("megatron-fsdp optim_grads")(c));
  EXPECT_FALSE(fuzz::norm_code_filter("megatron-fsdp optim")(c));
  EXPECT_FALSE(fuzz::norm_code_filter("megatron")(c));
}

TEST(MegatronFsdpTarget, ReleasesItsWorkerDoesNotReadDrawNone) {
  casefile::Case c = fsdp_case();
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.16.1"),
                          "megatron_fsdp: tally's worker does not build Megatron-FSDP with megatron-core 0.16.1"));
  EXPECT_FALSE(kMegatronFsdpSection.of(within_megatron_core(c, "0.16.1", {}, 0)));
  casefile::keep_only_section(c, "");
  EXPECT_FALSE(kMegatronFsdpSection.of(within_megatron_core(c, "0.16.1", {}, 0)));
}

TEST(MegatronFsdpTarget, NamesWhatMegatronFsdpCannotRun) {
  casefile::Case c = fsdp_case();
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2"));

  c.topology = {.world = 2, .pp = 2};
  c.model.num_layers = 2;
  c.model.num_experts = 0;
  c.model.moe_ffn_hidden_size.reset();
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"), "topology.pp 2 with megatron_fsdp:"));
  const casefile::Case one_stage = within_megatron_core(c, "0.19.2");
  EXPECT_EQ(one_stage.topology.pp, 1);
  EXPECT_EQ(one_stage.topology.world, 2) << "the stages fold into DP";
  EXPECT_FALSE(megatron_core_refusal(one_stage, "0.19.2"));

  c = fsdp_case();
  c.topology.order = "tp-pp-cp-ep-dp";
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"), "topology.order tp-pp-cp-ep-dp with megatron_fsdp:"));
  EXPECT_FALSE(megatron_core_refusal(within_megatron_core(c, "0.19.2"), "0.19.2"));

  c = fsdp_case();
  c.path.optimizer = vocab::OptimizerModel::layerwise;
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"), "optimizer.model layerwise with megatron_fsdp:"));
  EXPECT_EQ(within_megatron_core(c, "0.19.2").path.optimizer, vocab::OptimizerModel::distributed);

  c = fsdp_case();
  c.path.bucket_elements = 64;
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"), "optimizer.bucket_elements 64 with megatron_fsdp:"));

  c = fsdp_case();
  kMegatronFsdpSection.change(c, [&](MegatronFsdpConfig& d) { d.outer_sharding = FsdpOuterSharding::optim; });
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"),
                          "megatron_fsdp.outer_dp_sharding_strategy optim with topology.dist_opt_instances 1:"));
  c.topology = {.world = 4, .tp = 2, .etp = 2, .dist_opt_instances = 2};
  c.model.num_experts = 0;
  c.model.moe_ffn_hidden_size.reset();
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(megatron_core_refusal(c, "0.19.2"));
  kMegatronFsdpSection.change(c, [&](MegatronFsdpConfig& d) { d.sharding = FsdpSharding::optim_grads; });
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.19.2"),
                          "megatron_fsdp.outer_dp_sharding_strategy optim with data_parallel_sharding_strategy "
                          "optim_grads:"));
  EXPECT_EQ(kMegatronFsdpSection.of(within_megatron_core(c, "0.19.2"))->outer_sharding, FsdpOuterSharding::no_shard);
}

TEST(MegatronFsdpTarget, ItsSectionIsMegatronCoresAlone) {
  const casefile::Case c = fsdp_case();
  ASSERT_NE(framework_of(c), nullptr);
  EXPECT_EQ(framework_of(c)->name, "megatron-core");
  EXPECT_TRUE(starts_with(other_frameworks_section(c, "deepspeed"), "megatron_fsdp: a Megatron-FSDP case"));
  EXPECT_FALSE(other_frameworks_section(c, "megatron-core"));
  EXPECT_FALSE(framework_of(c)->release_model_case(c, "0.19.2")) << "tally models DDP's path, not Megatron-FSDP's";
  EXPECT_EQ(framework_of(c)->norm_code(c), "megatron-fsdp optim_grads_params");
}

TEST(MegatronFsdpTarget, SweepsEveryStrategyOnALayoutItRuns) {
  casefile::Case base = fsdp_case();
  casefile::keep_only_section(base, "");
  base.path.optimizer = vocab::OptimizerModel::plain;
  base.model.add_bias_linear = false;  // the layer-wise parameter layout refuses expert biases
  const FrameworkTarget& row = *framework_target("megatron-core");
  std::vector<std::string> names;
  for (const auto& [name, c] : row.sweep_variants(base)) {
    names.push_back(name);
    EXPECT_FALSE(megatron_core_refusal(c, "0.19.2")) << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"plain", "distributed", "layerwise", "muon", "plain-unreduced",
                                             "distributed-unreduced", "layerwise-layout", "fsdp-no_shard",
                                             "fsdp-no_shard-unreduced", "fsdp-optim", "fsdp-optim-unreduced",
                                             "fsdp-optim_grads", "fsdp-optim_grads-unreduced", "fsdp-optim_grads_params",
                                             "fsdp-optim_grads_params-unreduced"}));
  base.topology = {.world = 2, .pp = 2};
  base.model.num_layers = 2;
  EXPECT_EQ(row.sweep_variants(base).size(), 7u) << "no Megatron-FSDP variant across stages";
}

TEST(MegatronFsdpTarget, ItsSectionRoundTripsThroughACaseFile) {
  casefile::Case c = fsdp_case(FsdpSharding::no_shard);
  EXPECT_EQ(casefile::case_from_text(casefile::case_to_text(c), "fsdp.json", run::case_frameworks()), c);
  std::string text = casefile::case_to_text(c);
  text.replace(text.find("\"no_shard\""), 10, "\"zero3\"");
  try {
    casefile::case_from_text(text, "fsdp.json", run::case_frameworks());
    ADD_FAILURE() << "an unknown strategy was read";
  } catch (const casefile::CaseFileError& error) {
    EXPECT_NE(std::string(error.what()).find("case.megatron_fsdp.data_parallel_sharding_strategy"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace tally::run
