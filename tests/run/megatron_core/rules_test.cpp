// megatron-core's rules (run/megatron_core/rules.h): what the worker builds, and every generated
// case one it builds, for each release.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <functional>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "run/deepspeed/section.h"
#include "run/megatron_core/rules.h"
#include "run/megatron_core/section.h"
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

// Every refusal names megatron-core's own check it mirrors (a file:line of the release), or says
// plainly that tally's worker does not build the case (issue 50). One case per rule; each row's
// prefix checks that its own rule, not an earlier one, refused it. Another framework's section
// (other_frameworks_section) is that framework's text and is left out.
TEST(MegatronCoreTarget, EveryRefusalCitesMegatronsCheckOrSaysTallysWorkerDoesNotBuildIt) {
  using Build = std::function<casefile::Case()>;
  const auto dense = [](int world) {
    casefile::Case c;
    c.topology = {.world = world};
    c.model.num_layers = 2;
    return c;
  };
  const auto mtp = [&](int world, int pp) {
    casefile::Case c = dense(world);
    c.topology.pp = pp;
    c.model.mtp_num_layers = 1;
    c.model.mtp_detach_heads = true;
    return c;
  };
  const auto fsdp = [](casefile::Case c) {
    c.path.optimizer = vocab::OptimizerModel::distributed;
    kMegatronFsdpSection.set(c, MegatronFsdpConfig{});
    return c;
  };
  const auto layout = [](casefile::Case c) {
    c.path.optimizer = vocab::OptimizerModel::layerwise;
    c.path.layer_wise_param_layout = true;
    return c;
  };
  struct Row {
    std::string version;
    Build build;
    std::string prefix;
    std::map<std::string, std::string> cannot_run = {};
  };
  const std::vector<Row> rows = {
      {"0.19.2", [] { casefile::Case c = founding_case(); c.model.kind = topologies::ModelKind::custom; return c; },
       "model.kind custom:"},
      {"0.16.1", [&] { return mtp(2, 1); }, "model.mtp_num_layers 1: tally's worker does not build"},
      {"0.19.2", [&] { return mtp(2, 2); }, "model.mtp_num_layers 1 with topology.pp 2:"},
      {"0.19.2", [&] { return fsdp(mtp(2, 1)); }, "model.mtp_num_layers 1 with megatron_fsdp:"},
      {"0.19.2", [&] {
         casefile::Case c = mtp(2, 1);
         c.topology.ep = 2;
         c.model.num_experts = 2;
         c.model.moe_layer_freq = 2;
         return c;
       }, "model.mtp_num_layers 1 with model.moe_layer_freq 2:"},
      {"0.19.2", [&] { return layout(mtp(2, 1)); }, "model.mtp_detach_heads with optimizer.layer_wise_param_layout:"},
      {"0.19.2", [&] { casefile::Case c = dense(2); c.model.multi_latent_attention = true; return c; },
       "model.multi_latent_attention with megatron-core 0.19.2:"},
      {"0.16.1", [&] { casefile::Case c = dense(2); c.model.multi_latent_attention = true; return c; },
       "model.multi_latent_attention with megatron-core 0.16.1:"},
      {"0.16.1", [&] { casefile::Case c = dense(2); c.model.softmax_type = topologies::SoftmaxType::learnable; return c; },
       "model.softmax_type learnable with megatron-core 0.16.1:"},
      {"0.16.1", [&] { casefile::Case c = dense(4); c.topology.gtp = 2; return c; }, "topology.gtp/egtp:"},
      {"0.19.2", [&] { casefile::Case c = dense(4); c.topology.gtp = 2; return c; }, "topology.gtp/egtp:"},
      {"0.19.2", [&] { casefile::Case c = dense(2); c.path.p_values = {3.0}; return c; }, "statistics.p_norms:"},
      {"0.19.2", [&] {
         casefile::Case c = dense(2);
         c.path.faults = vocab::FaultSet::of({vocab::Fault::expert_dedup_on_dense_tp});
         return c;
       }, "faults:"},
      {"0.16.1", [&] { casefile::Case c = dense(4); c.topology.dist_opt_instances = 2; return c; },
       "topology.dist_opt_instances 2 with optimizer.model plain:"},
      {"0.19.2", [&] {
         casefile::Case c = dense(4);
         c.topology.dist_opt_instances = 2;
         c.path.optimizer = vocab::OptimizerModel::muon;
         return c;
       }, "topology.dist_opt_instances 2 with optimizer.model muon:"},
      {"0.19.2", [&] { casefile::Case c = layout(dense(4)); c.topology.dist_opt_instances = 2; return c; },
       "topology.dist_opt_instances 2 with optimizer.model layerwise and optimizer.layer_wise_param_layout:"},
      {"0.19.2", [] {
         casefile::Case c;
         c.topology = {.world = 2, .pp = 2, .vpp = 2};
         c.model.num_layers = 4;
         c.model.first_stage_layers = 2;
         c.model.last_stage_layers = 2;
         return c;
       }, "model.decoder_first_pipeline_num_layers and decoder_last_pipeline_num_layers with pp 2 and vpp 2:"},
      {"0.19.2", [&] { return fsdp(dense(2)); }, "megatron_fsdp: tally's worker does not build Megatron-FSDP on this machine",
       {{"megatron_fsdp", "einops is missing"}}},
      {"0.16.1", [&] { return fsdp(dense(2)); }, "megatron_fsdp: tally's worker does not build Megatron-FSDP with"},
      {"0.19.2", [&] { casefile::Case c = fsdp(dense(2)); c.topology.pp = 2; return c; }, "topology.pp 2 with megatron_fsdp:"},
      {"0.19.2", [&] {
         casefile::Case c = fsdp(dense(4));
         c.topology.tp = 2;
         c.topology.order = "dp-tp-cp-ep-pp";
         return c;
       }, "topology.order dp-tp-cp-ep-pp with megatron_fsdp: Megatron-FSDP's adapter"},
      {"0.19.2", [&] { casefile::Case c = fsdp(dense(2)); c.topology.order = "tp-pp-cp-ep-dp"; return c; },
       "topology.order tp-pp-cp-ep-dp with megatron_fsdp: tally's worker does not build"},
      {"0.19.2", [&] { casefile::Case c = fsdp(dense(2)); c.path.optimizer = vocab::OptimizerModel::plain; return c; },
       "optimizer.model plain with megatron_fsdp:"},
      {"0.19.2", [&] { casefile::Case c = fsdp(dense(2)); c.path.optimizer = vocab::OptimizerModel::layerwise; return c; },
       "optimizer.model layerwise with megatron_fsdp:"},
      {"0.19.2", [&] { casefile::Case c = fsdp(dense(2)); c.path.bucket_elements = 64; return c; },
       "optimizer.bucket_elements 64 with megatron_fsdp:"},
      {"0.19.2", [&] {
         casefile::Case c = fsdp(dense(2));
         kMegatronFsdpSection.change(c, [](MegatronFsdpConfig& d) { d.outer_sharding = FsdpOuterSharding::optim; });
         return c;
       }, "megatron_fsdp.outer_dp_sharding_strategy optim with topology.dist_opt_instances 1:"},
      {"0.19.2", [&] {
         casefile::Case c = fsdp(dense(4));
         c.topology.dist_opt_instances = 2;
         kMegatronFsdpSection.set(c, {.sharding = FsdpSharding::optim, .outer_sharding = FsdpOuterSharding::optim});
         return c;
       }, "megatron_fsdp.outer_dp_sharding_strategy optim with data_parallel_sharding_strategy optim:"},
      {"0.19.2", [&] { return layout(dense(2)); }, "optimizer.layer_wise_param_layout: tally's worker does not build",
       {{"optimizer.layer_wise_param_layout", "a stand-in"}}},
      {"0.16.1", [&] { return layout(dense(2)); }, "optimizer.layer_wise_param_layout: tally's worker does not build"},
      {"0.19.2", [&] { casefile::Case c = layout(dense(2)); c.path.bucket_elements = 64; return c; },
       "optimizer.bucket_elements 64 with optimizer.layer_wise_param_layout:"},
      {"0.19.2", [&] { return layout(founding_case()); }, "optimizer.layer_wise_param_layout with expert biases"},
      {"0.19.2", [&] {
         casefile::Case c = dense(2);
         c.path.optimizer = vocab::OptimizerModel::distributed;
         c.path.bucket_elements = 64;
         return c;
       }, "optimizer.bucket_elements 64:"},
      {"0.19.2", [&] { casefile::Case c = dense(2); c.path.gradients.before_reduction = true; return c; },
       "gradients.enter before_reduction: tally's worker does not build", {{"gradients.enter", "a stand-in"}}},
      {"0.16.1", [&] { casefile::Case c = dense(2); c.path.gradients.before_reduction = true; return c; },
       "gradients.enter before_reduction: tally's worker does not build"},
      {"0.19.2", [&] { casefile::Case c = dense(3); c.path.gradients.before_reduction = true; return c; },
       "gradients.enter before_reduction at DP x CP 3:"},
      {"0.16.1", [] { casefile::Case c = founding_case(); c.path.optimizer = vocab::OptimizerModel::muon; return c; },
       "optimizer.model muon with experts:"},
  };
  const std::regex cites_a_line("[A-Za-z0-9_/]+\\.py:[0-9]+");
  for (const Row& row : rows) {
    const casefile::Case c = row.build();
    const std::optional<std::string> why = megatron_core_refusal(c, row.version, {}, row.cannot_run);
    ASSERT_TRUE(why.has_value()) << row.prefix;
    EXPECT_EQ(why->rfind(row.prefix, 0), 0u) << row.prefix << " at " << row.version << ", refused: " << *why;
    EXPECT_TRUE(std::regex_search(*why, cites_a_line) ||
                why->find("tally's worker does not build") != std::string::npos)
        << *why;
  }
}

TEST(MegatronCoreTarget, ReleasesCompareByMajorAndMinor) {
  EXPECT_TRUE(megatron_core_older_than("0.16.1", 0, 19));
  EXPECT_FALSE(megatron_core_older_than("0.19.2", 0, 19));
  EXPECT_FALSE(megatron_core_older_than("0.20.0rc1", 0, 19));
  EXPECT_FALSE(megatron_core_older_than("unknown", 0, 19)) << "an unknown version counts as the newest";
}

}  // namespace
}  // namespace tally::run
