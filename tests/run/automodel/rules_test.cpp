// What the NeMo-Automodel worker runs (run/automodel/rules.h): every generated case is one it builds,
// and each case it cannot build is refused in one line naming the field and the rule (Automodel's own
// check where it has one).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "run/automodel/rules.h"
#include "run/automodel/section.h"
#include "run/deepspeed/section.h"
#include "run/target.h"
#include "vocab/faults.h"
#include "tests/support/worker_rule_cases.h"

namespace tally::run {
namespace {

// A Llama on TP 2 x DP 2: RMSNorm, rotary positions, a gated MLP, untied, no linear biases.
casefile::Case llama_case() {
  casefile::Case c;
  c.topology = topologies::ParallelConfig{.world = 4, .tp = 2, .etp = 2};
  c.model.num_layers = 2;
  c.model.hidden_size = 8;
  c.model.num_attention_heads = 2;
  c.model.ffn_hidden_size = 16;
  c.model.vocab_size = 8;
  c.model.normalization = topologies::Normalization::rms_norm;
  c.model.position_embedding = topologies::PositionEmbedding::rope;
  c.model.swiglu = true;
  c.model.add_bias_linear = false;
  c.model.untie_embeddings_and_output_weights = true;
  kAutomodelSection.set(c, AutomodelConfig{});
  return c;
}

bool starts_with(const std::optional<std::string>& text, std::string_view prefix) {
  return text && text->rfind(prefix, 0) == 0;
}

FaultPlants every_plant() {
  FaultPlants plants;
  for (const char* name : {"average-rank-norms", "stats-over-replicas", "clip-per-child-norm"}) plants.planted[name] = "planted";
  return plants;
}

RC_GTEST_PROP(AutomodelTarget, EveryGeneratedCaseIsOneTheWorkerBuilds, ()) {
  const int world = *rc::gen::element(2, 4, 8);
  fuzz::CaseGenOptions options = testing::gpt_cases_of_world(world);
  const FaultPlants plants = every_plant();
  options.restrict_to = [plants](casefile::Case c) {
    const std::uint64_t draw = c.path.gradients.generator.seed;
    return within_automodel(std::move(c), plants, draw);
  };
  casefile::Case c = *fuzz::gen_case(options);
  if (*rc::gen::arbitrary<bool>()) {
    c.path.faults = vocab::FaultSet::of({*rc::gen::element(vocab::Fault::average_rank_norms, vocab::Fault::stats_over_replicas,
                                                           vocab::Fault::clip_per_child_norm)});
    c = within_automodel(std::move(c), plants, c.path.gradients.generator.seed);
  }
  RC_ASSERT(!casefile::check_case(c));
  RC_ASSERT(c.topology.world == world);
  RC_ASSERT(kAutomodelSection.of(c).has_value());
  const std::optional<std::string> refusal = automodel_refusal(c, "0.7.0", plants);
  RC_ASSERT(!refusal);
}

TEST(AutomodelTarget, AFaultOfTheReplicasGetsReplicasWhereDataParallelAllowsThem) {
  casefile::Case c = llama_case();
  c.topology = topologies::ParallelConfig{.world = 8, .tp = 2, .etp = 2};  // DP 4
  c.path.faults = vocab::FaultSet::of({vocab::Fault::stats_over_replicas});
  c = within_automodel(std::move(c), every_plant(), 0);
  EXPECT_EQ(kAutomodelSection.of(c)->dp_replicate, 2);
  EXPECT_FALSE(automodel_refusal(c, "0.7.0", every_plant()));
}

TEST(AutomodelTarget, NamesWhatTheWorkerCannotBuild) {
  casefile::Case c = llama_case();
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(automodel_refusal(c, "0.7.0"));
  casefile::keep_only_section(c, "");
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0"), "automodel: the case has no Automodel configuration"));
  c = llama_case();
  c.model.normalization = topologies::Normalization::layer_norm;
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0"), "model.normalization LayerNorm:"));
  c = llama_case();
  c.model.num_experts = 4;
  EXPECT_NE(automodel_refusal(c, "0.7.0").value_or("").find("qwen3_moe/model.py:184"), std::string::npos);
  c = llama_case();
  c.model.qk_layernorm = true;
  c.model.add_bias_linear = true;
  EXPECT_NE(automodel_refusal(c, "0.7.0").value_or("").find("Qwen3MLP"), std::string::npos);
  c = llama_case();
  c.model.hidden_size = 10;  // 4 heads of 4 channels: Megatron's kv_channels, not LlamaConfig's rule
  c.model.num_attention_heads = 4;
  c.model.kv_channels = 4;
  EXPECT_NE(automodel_refusal(c, "0.7.0").value_or("").find("configuration_llama.py:94-100"), std::string::npos);
  c = llama_case();
  c.model.num_attention_heads = 4;
  c.model.num_query_groups = 1;  // one key-value head on TP 2
  EXPECT_NE(automodel_refusal(c, "0.7.0").value_or("").find("parallelizer.py:1039-1040"), std::string::npos);
  c = llama_case();
  kAutomodelSection.change(c, [&](AutomodelConfig& d) { d.dp_replicate = 2; });  // DP 2: Automodel's own refusal
  EXPECT_NE(automodel_refusal(c, "0.7.0").value_or("").find("mesh_utils.py:310-314"), std::string::npos);
  c = llama_case();
  c.topology = topologies::ParallelConfig{.world = 4, .pp = 2};
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0"), "topology.pp 2: the worker builds no pipeline"));
  c = llama_case();
  c.topology.order = "cp-tp-ep-dp-pp";
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0"), "topology.order cp-tp-ep-dp-pp:"));
  c = llama_case();
  c.path.faults = vocab::FaultSet::of({vocab::Fault::missing_pp_reduction});
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0", every_plant()), "faults: the worker plants no counterpart"));
  c = llama_case();
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0"), "deepspeed: a DeepSpeed case"));
}

TEST(AutomodelTarget, EachOtherTargetRefusesAnAutomodelCase) {
  const casefile::Case c = llama_case();
  for (const FrameworkTarget* row : framework_targets()) {
    if (row->name == "automodel") continue;
    EXPECT_TRUE(starts_with(row->refusal_at_release(c, ""), "automodel: a NeMo-Automodel case")) << row->name;
  }
}

TEST(AutomodelTarget, TheSweepTriesLlamaAndQwen3OnFsdpAndHsdpWithAndWithoutSequenceParallelism) {
  casefile::Case megatron_gpt = llama_case();  // the sweep's own dense GPT: LayerNorm, learned positions
  megatron_gpt.model.normalization = topologies::Normalization::layer_norm;
  megatron_gpt.model.position_embedding = topologies::PositionEmbedding::learned_absolute;
  megatron_gpt.model.swiglu = false;
  const auto variants = automodel_sweep_variants(megatron_gpt);
  ASSERT_EQ(variants.size(), 16u);
  EXPECT_EQ(variants[0].first, "fsdp");
  EXPECT_EQ(variants[1].first, "fsdp-unreduced");
  EXPECT_TRUE(kAutomodelSection.of(variants[1].second)->before_reduction);
  EXPECT_EQ(variants[6].first, "hsdp-sp");
  EXPECT_EQ(kAutomodelSection.of(variants[6].second)->dp_replicate, 2);
  EXPECT_TRUE(kAutomodelSection.of(variants[6].second)->sequence_parallel);
  EXPECT_FALSE(kAutomodelSection.of(variants[6].second)->before_reduction);
  EXPECT_EQ(variants[8].first, "qwen3-fsdp");
  EXPECT_TRUE(variants[8].second.model.qk_layernorm);
  for (const auto& [name, c] : variants) {
    EXPECT_EQ(c.model.normalization, topologies::Normalization::rms_norm) << name;
    EXPECT_TRUE(c.model.swiglu) << name;
  }
  megatron_gpt.topology = topologies::ParallelConfig{.world = 4};
  EXPECT_EQ(automodel_sweep_variants(megatron_gpt).size(), 8u) << "no sequence parallelism without TP";
  megatron_gpt.model.num_experts = 4;
  EXPECT_EQ(automodel_sweep_variants(megatron_gpt).size(), 4u) << "the experts' refusal once per FSDP variant";
}

// FSDP2 averages every gradient over dp_replicate x dp_shard x cp (Automodel sets no divide factor).
TEST(AutomodelTarget, StatesFsdp2sAverageWhereGradientsEnterBeforeIt) {
  casefile::Case c = llama_case();  // world 4, TP 2
  EXPECT_EQ(automodel_reduction_groups(c), std::nullopt) << "after the reduction: no shares";
  kAutomodelSection.change(c, [&](AutomodelConfig& d) { d.before_reduction = true; });
  EXPECT_EQ(automodel_reduction_groups(c), (ReductionGroups{{2}, 2}));
  kAutomodelSection.change(c, [&](AutomodelConfig& d) { d.sequence_parallel = true; });
  EXPECT_EQ(automodel_reduction_groups(c), (ReductionGroups{{2, 4}, 2})) << "a TP-replicated param: FSDP x TP";
  kAutomodelSection.change(c, [&](AutomodelConfig& d) { d.sequence_parallel = false; });
  c.topology = {.world = 8, .tp = 1, .cp = 2, .etp = 1};
  EXPECT_EQ(automodel_reduction_groups(c), (ReductionGroups{{8}, 8})) << "CP ranks are FSDP's too";
  const nlohmann::json written = casefile::case_to_json(c);
  EXPECT_EQ(written["automodel"]["gradients_enter"], "before_reduction");
  EXPECT_EQ(kAutomodelSection.of(casefile::case_from_json(nlohmann::json::parse(written.dump()), run::case_frameworks(), "case.json")),
            kAutomodelSection.of(c));
  kAutomodelSection.change(c, [&](AutomodelConfig& d) { d.before_reduction = false; });
  EXPECT_FALSE(casefile::case_to_json(c)["automodel"].contains("gradients_enter"));
}

TEST(AutomodelTarget, ACampaignDrawsBothSidesOfTheReduction) {
  casefile::Case c = llama_case();
  casefile::keep_only_section(c, "");
  int before = 0;
  for (std::uint64_t draw = 0; draw < 1024; draw += 7) before += kAutomodelSection.of(within_automodel(c, {}, draw))->before_reduction;
  EXPECT_GT(before, 20);
  EXPECT_LT(before, 126);
}

TEST(AutomodelTarget, TheRecipeNamesAutomodelsOwnSettings) {
  casefile::Case c = llama_case();
  kAutomodelSection.change(c, [&](AutomodelConfig& d) { d.sequence_parallel = true; });
  c.path.max_norm = 0.5;
  const nlohmann::ordered_json recipe = automodel_recipe(c);
  EXPECT_EQ(recipe["distributed"]["tp_size"], 2);
  EXPECT_EQ(recipe["distributed"]["dp_replicate_size"], 1);
  EXPECT_EQ(recipe["distributed"]["sequence_parallel"], true);
  EXPECT_EQ(recipe["clip_grad"]["max_norm"], 0.5);
  EXPECT_EQ(recipe["architecture"], "LlamaForCausalLM");
  c.model.qk_layernorm = true;
  EXPECT_EQ(automodel_recipe(c)["architecture"], "Qwen3ForCausalLM");
}

}  // namespace
}  // namespace tally::run
