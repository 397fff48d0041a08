// What the torchtitan worker runs (run/torchtitan/rules.h): every generated case is one it builds,
// and each case it cannot build is refused in one line naming the field and the rule.
#include <functional>
#include <regex>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "run/deepspeed/section.h"
#include "run/target.h"
#include "run/torchtitan/rules.h"
#include "run/torchtitan/section.h"
#include "topologies/presets.h"
#include "vocab/faults.h"
#include "tests/support/worker_rule_cases.h"

namespace tally::run {
namespace {

// TP 1, DP 2, two experts on EP 2: a case the worker runs as it stands.
casefile::Case moe_case() {
  casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.pass.json", run::case_frameworks());
  c.expect.reset();
  c.topology.tp = c.topology.etp = 1;
  c.path.optimizer = vocab::OptimizerModel::plain;
  kTorchTitanSection.set(c, TorchTitanConfig{});
  return c;
}

bool starts_with(const std::optional<std::string>& text, std::string_view prefix) {
  return text && text->rfind(prefix, 0) == 0;
}

FaultPlants every_plant() {
  FaultPlants plants;
  for (const char* name : {"missing-pp-reduction", "average-rank-norms", "clip-per-stage-norm", "expert-norm-dropped",
                           "missing-ep-reduction", "clip-per-child-norm"})
    plants.planted[name] = "planted";
  return plants;
}

RC_GTEST_PROP(TorchTitanTarget, EveryGeneratedCaseIsOneTheWorkerBuilds, ()) {
  const int world = *rc::gen::element(2, 4, 8);
  const bool with_fault = *rc::gen::arbitrary<bool>();
  fuzz::CaseGenOptions options = testing::gpt_cases_of_world(world);
  const FaultPlants plants = every_plant();
  options.restrict_to = [plants](casefile::Case c) {
    const std::uint64_t draw = c.path.gradients.generator.seed;
    return within_torchtitan(std::move(c), plants, draw);
  };
  casefile::Case c = *fuzz::gen_case(options);
  if (with_fault) {
    c.path.faults = vocab::FaultSet::of({*rc::gen::element(vocab::Fault::missing_pp_reduction, vocab::Fault::expert_norm_dropped,
                                                           vocab::Fault::clip_per_child_norm)});
    c = within_torchtitan(std::move(c), plants, c.path.gradients.generator.seed);
  }
  RC_ASSERT(!casefile::check_case(c));
  RC_ASSERT(c.topology.world == world);
  RC_ASSERT(kTorchTitanSection.of(c).has_value());
  const std::optional<std::string> refusal = torchtitan_refusal(c, "0.3.0", plants);
  RC_ASSERT(!refusal);
}

TEST(TorchTitanTarget, NamesWhatTheWorkerCannotBuild) {
  casefile::Case c = moe_case();
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(torchtitan_refusal(c, "0.3.0"));
  casefile::keep_only_section(c, "");
  EXPECT_TRUE(starts_with(torchtitan_refusal(c, "0.3.0"), "torchtitan: the case has no torchtitan configuration"));
  c = moe_case();
  c.path.gradients.generator.dtype = kernels::Dtype::bf16;
  EXPECT_TRUE(starts_with(torchtitan_refusal(c, "0.3.0"), "gradients.dtype bf16:"));
  c = moe_case();
  kTorchTitanSection.change(c, [&](TorchTitanConfig& d) { d.clip = DTensorClip::torch; });
  EXPECT_NE(torchtitan_refusal(c, "0.3.0").value_or("").find("two meshes"), std::string::npos)
      << "torch's clip cannot stack the expert mesh's norms with the dense mesh's";
  c = moe_case();
  kTorchTitanSection.change(c, [&](TorchTitanConfig& d) { d.dp_replicate = 2; });  // EP 2 needs dp_shard x cp x tp = 1 rank to hold 2
  EXPECT_TRUE(starts_with(torchtitan_refusal(c, "0.3.0"), "topology.ep 2:"));
  kTorchTitanSection.change(c, [&](TorchTitanConfig& d) { d.dp_replicate = 3; });
  EXPECT_TRUE(starts_with(torchtitan_refusal(c, "0.3.0"), "torchtitan.dp_replicate 3:"));
  c = moe_case();
  c.path.optimizer = vocab::OptimizerModel::layerwise;
  EXPECT_TRUE(starts_with(torchtitan_refusal(c, "0.3.0"), "optimizer.model layerwise:"));
  c = moe_case();
  c.path.faults = c.path.faults.with(vocab::Fault::missing_pp_reduction);
  EXPECT_TRUE(
      starts_with(torchtitan_refusal(c, "0.3.0"), "faults: tally's worker does not build (plant) a counterpart"));
  EXPECT_FALSE(torchtitan_refusal(c, "0.3.0", every_plant()));
  c = moe_case();
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  EXPECT_TRUE(starts_with(torchtitan_refusal(c, "0.3.0"), "deepspeed: a DeepSpeed case"));
}

// Every refusal names the check of torchtitan 0.3.0 or torch 2.15 it mirrors (a file:line, which
// tests/adapters/torchtitan/test_torchtitan_refusals.py calls), or says that tally's worker does not
// build the case (issue 50). One case per rule; the prefix says which rule fired.
TEST(TorchTitanTarget, EveryRefusalCitesTorchTitansCheckOrSaysTheWorkerDoesNotBuildIt) {
  using Edit = std::function<void(casefile::Case&)>;
  const auto section = [](auto change) {
    return [change](casefile::Case& c) { kTorchTitanSection.change(c, change); };
  };
  const auto without_ep = [](casefile::Case& c) { c.topology.ep = 1; };
  const auto piped = [](casefile::Case& c) {  // world 4 on PP 2, as RefusesTyingWithPipelineAsTorchTitanDoes
    c.topology = {.world = 4, .pp = 2};
    c.model = {};
    c.model.num_layers = 2;
  };
  const struct {
    const char* rule;
    Edit edit;
    const char* prefix;
    FaultPlants plants = {};
  } rules[] = {
      {"custom layout", [](casefile::Case& c) { c.model.kind = topologies::ModelKind::custom; }, "model.kind custom:"},
      {"MTP", [](casefile::Case& c) { c.model.mtp_num_layers = 1; }, "model.mtp_num_layers 1:"},
      {"multi-latent attention",
       [](casefile::Case& c) {
         c.model.multi_latent_attention = true;
         c.model.num_query_groups.reset();
       },
       "model.multi_latent_attention:"},
      {"generalized TP", [](casefile::Case& c) { c.topology.gtp = 2; }, "topology.gtp/egtp:"},
      {"VPP", [](casefile::Case& c) { c.topology.vpp = 2; }, "topology.vpp 2:"},
      {"order", [](casefile::Case& c) { c.topology.order = "tp-dp-cp-ep-pp"; }, "topology.order tp-dp-cp-ep-pp:"},
      {"distributed-optimizer instances", [](casefile::Case& c) { c.topology.dist_opt_instances = 2; },
       "topology.dist_opt_instances:"},
      {"optimizer model", [](casefile::Case& c) { c.path.optimizer = vocab::OptimizerModel::layerwise; },
       "optimizer.model layerwise:"},
      {"p-norms", [](casefile::Case& c) { c.path.p_values = {1.0}; }, "statistics.p_norms:"},
      {"16-bit gradients", [](casefile::Case& c) { c.path.gradients.generator.dtype = kernels::Dtype::bf16; },
       "gradients.dtype bf16:"},
      {"unplanted fault",
       [](casefile::Case& c) { c.path.faults = c.path.faults.with(vocab::Fault::missing_pp_reduction); }, "faults: "},
      {"dp_replicate not dividing DP", section([](TorchTitanConfig& d) { d.dp_replicate = 3; }),
       "torchtitan.dp_replicate 3:"},
      {"ETP with EP", [](casefile::Case& c) { c.topology.etp = 2; }, "topology.etp 2 with ep 2:"},
      {"ETP other than TP without EP", [&](casefile::Case& c) { without_ep(c); c.topology.etp = 2; },
       "topology.etp 2 with ep 1 and tp 1:"},
      {"EP not dividing dp_shard x cp x tp", section([](TorchTitanConfig& d) { d.dp_replicate = 2; }),
       "topology.ep 2: must divide dp_shard x cp x tp (1)"},
      {"EP not dividing the experts", [](casefile::Case& c) { c.model.num_experts = 3; },
       "topology.ep 2: must divide the experts (3)"},
      {"tying with PP", piped, "model.untie_embeddings_and_output_weights false with topology.pp 2:"},
      {"experts FSDP2 splits unevenly on dim 1",
       [&](casefile::Case& c) {  // one expert of 15 rows, sharded over 2 FSDP ranks on dim 1
         without_ep(c);
         c.model.num_experts = 1;
         c.model.moe_ffn_hidden_size = 15;
       },
       "model: "},
      {"torch's clip with PP",
       [&](casefile::Case& c) {
         piped(c);
         c.model.untie_embeddings_and_output_weights = true;
         kTorchTitanSection.change(c, [](TorchTitanConfig& d) { d.clip = DTensorClip::torch; });
       },
       "torchtitan.clip torch with topology.pp 2:"},
      {"torch's clip with EP", section([](TorchTitanConfig& d) { d.clip = DTensorClip::torch; }),
       "torchtitan.clip torch with topology.ep 2:"},
      {"a fault of torchtitan's clip with torch's",
       [&](casefile::Case& c) {
         without_ep(c);
         kTorchTitanSection.change(c, [](TorchTitanConfig& d) { d.clip = DTensorClip::torch; });
         c.path.faults = c.path.faults.with(vocab::Fault::missing_pp_reduction);
       },
       "faults missing-pp-reduction with torchtitan.clip torch:", every_plant()},
  };
  const std::regex citation(R"([A-Za-z0-9_/]+\.py:[0-9]+)");
  for (const auto& r : rules) {
    casefile::Case c = moe_case();
    r.edit(c);
    const std::string text = torchtitan_refusal(c, "0.3.0", r.plants).value_or("(not refused)");
    EXPECT_EQ(text.rfind(r.prefix, 0), 0u) << r.rule << ": " << text;
    EXPECT_TRUE(std::regex_search(text, citation) || text.find("tally's worker does not build") != std::string::npos)
        << r.rule << " names neither torchtitan's check nor what tally's worker does not build: " << text;
  }
  // Refusals in tally's own terms (a field of another target, a case with no torchtitan section) claim
  // no torchtitan limit and cite none.
  casefile::Case c = moe_case();
  c.path.gradients.before_reduction = true;
  EXPECT_TRUE(starts_with(torchtitan_refusal(c, "0.3.0"), "gradients.enter before_reduction:"));
  // grads-averaged-twice is planted in FSDP2's reduction, which runs under torch's clip too.
  c = moe_case();
  without_ep(c);
  kTorchTitanSection.change(c, [](TorchTitanConfig& d) { d.clip = DTensorClip::torch; });
  FaultPlants plants;
  plants.planted["grads-averaged-twice"] = "planted";
  c.path.faults = c.path.faults.with(vocab::Fault::grads_averaged_twice);
  EXPECT_FALSE(torchtitan_refusal(c, "0.3.0", plants));
}

TEST(TorchTitanTarget, RefusesTyingWithPipelineAsTorchTitanDoes) {
  casefile::Case c = moe_case();
  c.topology = {.world = 4, .pp = 2};
  c.model = {};
  c.model.num_layers = 2;
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_NE(torchtitan_refusal(c, "0.3.0").value_or("").find("Weight tying is not supported with Pipeline Parallel"),
            std::string::npos);
  c.model.untie_embeddings_and_output_weights = true;
  EXPECT_FALSE(torchtitan_refusal(c, "0.3.0"));
  kTorchTitanSection.change(c, [&](TorchTitanConfig& d) { d.clip = DTensorClip::torch; });
  EXPECT_NE(torchtitan_refusal(c, "0.3.0").value_or("").find("torchtitan #596"), std::string::npos);
  const casefile::Case within = within_torchtitan(c, {}, 0);
  EXPECT_EQ(kTorchTitanSection.of(within)->clip, DTensorClip::torchtitan) << "torch's clip has no pipeline group";
  EXPECT_FALSE(torchtitan_refusal(within, "0.3.0"));
}

// A preset on one stage is torchtitan's own model of its family; MTP and multi-latent attention only
// deepseek_v3's has, so the deepseek-v3 preset runs there and nowhere else.
TEST(TorchTitanTarget, BuildsAPresetAsTorchTitansOwnFamilyOnOneStage) {
  const topologies::ParallelConfig config{.world = 4, .tp = 2, .ep = 2, .etp = 1};
  casefile::Case c = moe_case();
  c.topology = config;
  c.model = *topologies::preset_model(topologies::Preset::deepseek_v3, config).model;
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_EQ(torchtitan_family(c), "deepseek_v3");
  EXPECT_FALSE(torchtitan_refusal(c, "0.3.0"));
  EXPECT_NE(torchtitan_model_description(c).find("torchtitan's own deepseek_v3 model"), std::string::npos);
  EXPECT_NE(torchtitan_model_description(c).find("apply_fsdp_to_mtp_decoder"), std::string::npos);
  const casefile::Case within = within_torchtitan(c, {}, 0);
  EXPECT_TRUE(within.model.multi_latent_attention);
  EXPECT_EQ(within.model.mtp_num_layers, 1);
  EXPECT_FALSE(torchtitan_refusal(within, "0.3.0"));
  casefile::Case piped = c;
  piped.topology = {.world = 4, .tp = 2, .pp = 2};
  const topologies::PresetModel staged = topologies::preset_model(topologies::Preset::deepseek_v3, piped.topology);
  ASSERT_TRUE(staged.model) << staged.why_none;
  piped.model = *staged.model;
  EXPECT_EQ(torchtitan_family(piped), "");
  EXPECT_NE(torchtitan_refusal(piped, "0.3.0").value_or("").find("for model.preset deepseek-v3 on one pipeline stage"),
            std::string::npos);
  EXPECT_EQ(within_torchtitan(piped, {}, 0).topology.pp, 1) << "kept on one stage, where torchtitan builds it";
  c.model = *topologies::preset_model(topologies::Preset::mixtral, config).model;
  EXPECT_EQ(torchtitan_family(c), "") << "torchtitan 0.3.0 has no Mixtral";
  c.model = *topologies::preset_model(topologies::Preset::qwen3_moe, config).model;
  EXPECT_EQ(torchtitan_family(c), "qwen3");
  // FSDP2 shards two experts over four ranks on dim 1: linear_fc1's 4 rows divide, but torchtitan's
  // qwen3 holds them as w1_EFD and w3_EFD, 2 rows each, which fully_shard refuses to split unevenly.
  casefile::Case dp4 = moe_case();
  dp4.topology = {.world = 4};
  dp4.model = *topologies::preset_model(topologies::Preset::qwen3_moe, dp4.topology).model;
  ASSERT_EQ(dp4.model.num_experts, 2);
  EXPECT_NE(torchtitan_refusal(dp4, "0.3.0").value_or("").find("w1_EFD and w3_EFD"), std::string::npos);
  dp4.model.preset.clear();  // the worker's own decoder holds linear_fc1 whole
  EXPECT_FALSE(torchtitan_refusal(dp4, "0.3.0"));
}

TEST(TorchTitanTarget, APlantedFaultGetsTheAxisItShowsOn) {
  casefile::Case c = moe_case();
  c.topology = {.world = 4, .tp = 1};
  c.model = {};
  c.model.num_layers = 2;
  c.model.num_experts = 4;
  c.path.faults = c.path.faults.with(vocab::Fault::missing_pp_reduction);
  casefile::Case within = within_torchtitan(c, every_plant(), 0);
  EXPECT_EQ(within.topology.pp, 2);
  EXPECT_FALSE(torchtitan_refusal(within, "0.3.0", every_plant()));
  c.path.faults = {};
  c.path.faults = c.path.faults.with(vocab::Fault::expert_norm_dropped);
  within = within_torchtitan(c, every_plant(), 0);
  EXPECT_GT(within.topology.ep, 1);
  EXPECT_FALSE(torchtitan_refusal(within, "0.3.0", every_plant()));
  within = within_torchtitan(c, {}, 0);
  EXPECT_TRUE(within.path.faults.empty()) << "a fault the worker does not plant is dropped";
}

TEST(TorchTitanTarget, SweepsEachClipOnEachBackendOnEachSideOfTheReduction) {
  const std::vector<std::pair<std::string, casefile::Case>> variants = torchtitan_sweep_variants(moe_case());
  ASSERT_EQ(variants.size(), 16u);
  EXPECT_EQ(variants[0].first, "torchtitan-full_dtensor");
  EXPECT_FALSE(kTorchTitanSection.of(variants[0].second)->before_reduction);
  EXPECT_EQ(variants[1].first, "torchtitan-full_dtensor-unreduced");
  EXPECT_TRUE(kTorchTitanSection.of(variants[1].second)->before_reduction);
  EXPECT_EQ(variants[2].first, "torchtitan-full_dtensor-hsdp");
  EXPECT_EQ(kTorchTitanSection.of(variants[2].second)->dp_replicate, 2);
  EXPECT_EQ(variants[15].first, "torch-partial_dtensor-hsdp-unreduced");
  EXPECT_EQ(torchtitan_norm_code(variants[0].second), "torchtitan _clip_grad_norm_with_ep on full_dtensor");
  EXPECT_EQ(torchtitan_norm_code(variants[15].second), "torch.nn.utils.clip_grad_norm_ on partial_dtensor");
}

TEST(TorchTitanTarget, ACaseFileKeepsItsSection) {
  casefile::Case c = moe_case();
  kTorchTitanSection.set(c, TorchTitanConfig{DTensorClip::torch, SpmdBackend::partial_dtensor, 2, true});
  const nlohmann::json written = casefile::case_to_json(c);
  EXPECT_EQ(written["torchtitan"]["gradients_enter"], "before_reduction");
  const casefile::Case back = casefile::case_from_json(nlohmann::json::parse(written.dump()), run::case_frameworks(), "case.json");
  EXPECT_EQ(kTorchTitanSection.of(back), kTorchTitanSection.of(c));
  EXPECT_EQ(framework_of(back)->name, "torchtitan");
  kTorchTitanSection.change(c, [&](TorchTitanConfig& d) { d.before_reduction = false; });
  EXPECT_FALSE(casefile::case_to_json(c)["torchtitan"].contains("gradients_enter"))
      << "after the reduction is written as earlier case files were, so their digests stay theirs";
}

TEST(TorchTitanTarget, ARequestNamingAnotherStageIsRefusedByTheReader) {
  nlohmann::json j = casefile::case_to_json(moe_case());
  j["torchtitan"]["gradients_enter"] = "during_reduction";
  try {
    casefile::case_from_json(j, run::case_frameworks(), "case.json");
    FAIL() << "read";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("torchtitan.gradients_enter"), std::string::npos) << e.what();
  }
}

// FSDP2 sums (never divides, under torchtitan) a dense gradient over dp_replicate x dp_shard x cp,
// an expert's with EP over dp_replicate x efsdp (efsdp = dp_shard x cp x tp / ep).
TEST(TorchTitanTarget, StatesFsdp2sReductionGroupsWhereGradientsEnterBeforeIt) {
  casefile::Case c = moe_case();  // world 2, TP 1, EP 2
  EXPECT_EQ(torchtitan_reduction_groups(c), std::nullopt) << "after the reduction: no shares";
  kTorchTitanSection.change(c, [&](TorchTitanConfig& d) { d.before_reduction = true; });
  EXPECT_EQ(torchtitan_reduction_groups(c), (ReductionGroups{{2, 1}, 1}));
  c.topology = {.world = 8, .tp = 2, .cp = 1, .pp = 2, .ep = 2, .etp = 1};
  EXPECT_EQ(torchtitan_reduction_groups(c), (ReductionGroups{{2, 4}, 1}))
      << "8 / (pp 2 x tp 2); TP-replicated: the stage's 4; experts 4 / ep 2";
  c.topology = {.world = 8, .tp = 1, .cp = 2, .pp = 1, .ep = 1, .etp = 1};
  EXPECT_EQ(torchtitan_reduction_groups(c), (ReductionGroups{{8}, 1})) << "CP ranks are FSDP's too";
  c.model.num_experts = 0;
  c.topology = {.world = 4, .tp = 2, .cp = 1, .pp = 1, .ep = 1, .etp = 2};
  EXPECT_EQ(torchtitan_reduction_groups(c), (ReductionGroups{{2, 4}, 1}));
}

TEST(TorchTitanTarget, ACampaignDrawsBothSidesOfTheReduction) {
  casefile::Case c = moe_case();
  casefile::keep_only_section(c, "");
  int before = 0;
  for (std::uint64_t draw = 0; draw < 64; ++draw) before += kTorchTitanSection.of(within_torchtitan(c, {}, draw))->before_reduction;
  EXPECT_GT(before, 8);
  EXPECT_LT(before, 56);
}

}  // namespace
}  // namespace tally::run
