// What the Hugging Face worker runs (run/hf/rules.h): every generated case is one it builds, and each
// case it cannot build is refused in one line naming the field and the rule (transformers' or
// accelerate's own check where it has one).
#include <functional>
#include <regex>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "run/deepspeed/section.h"
#include "run/hf/rules.h"
#include "run/hf/section.h"
#include "run/target.h"
#include "tests/support/worker_rule_cases.h"
#include "vocab/faults.h"

namespace tally::run {
namespace {

constexpr std::string_view kRelease = "1.15.0+transformers-5.17.0";

// A Llama on FSDP2 over 4 ranks: RMSNorm, rotary positions, a gated MLP, untied, no linear biases.
casefile::Case llama_case() {
  casefile::Case c;
  c.topology = topologies::ParallelConfig{.world = 4};
  c.model.num_layers = 2;
  c.model.hidden_size = 8;
  c.model.num_attention_heads = 4;
  c.model.ffn_hidden_size = 16;
  c.model.vocab_size = 8;
  c.model.normalization = topologies::Normalization::rms_norm;
  c.model.position_embedding = topologies::PositionEmbedding::rope;
  c.model.swiglu = true;
  c.model.add_bias_linear = false;
  c.model.untie_embeddings_and_output_weights = true;
  kHfSection.set(c, HfConfig{});
  return c;
}

// The same with four experts in every layer: built as transformers' MixtralForCausalLM.
casefile::Case mixtral_case() {
  casefile::Case c = llama_case();
  c.model.num_experts = 4;
  c.model.moe_ffn_hidden_size = 8;
  return c;
}

void on_ep(casefile::Case& c, int world, int ep) { c.topology = topologies::ParallelConfig{.world = world, .ep = ep}; }

void on_tp(casefile::Case& c, int world, int tp) { c.topology = topologies::ParallelConfig{.world = world, .tp = tp, .etp = tp}; }

bool starts_with(const std::optional<std::string>& text, std::string_view prefix) {
  return text && text->rfind(prefix, 0) == 0;
}

FaultPlants every_plant() {
  FaultPlants plants;
  for (const char* name : {"average-rank-norms", "clip-per-child-norm", "grads-averaged-twice", "grads-not-averaged",
                            "expert-norm-dropped", "missing-ep-reduction", "clip-per-ep-group-norm"})
    plants.planted[name] = "planted";
  return plants;
}

RC_GTEST_PROP(HfTarget, EveryGeneratedCaseIsOneTheWorkerBuilds, ()) {
  const int world = *rc::gen::element(2, 4, 8);
  const FaultPlants plants = every_plant();
  casefile::Case c = *fuzz::gen_case(testing::gpt_cases_within(
      world, [plants](casefile::Case c, std::uint64_t draw) { return within_hf(std::move(c), plants, draw); }));
  if (*rc::gen::arbitrary<bool>()) {
    c.path.faults = vocab::FaultSet::of({*rc::gen::element(vocab::Fault::average_rank_norms,
                                                           vocab::Fault::clip_per_child_norm,
                                                           vocab::Fault::grads_averaged_twice,
                                                           vocab::Fault::missing_ep_reduction)});
    c = within_hf(std::move(c), plants, c.path.gradients.generator.seed);
  }
  RC_ASSERT(!casefile::check_case(c));
  RC_ASSERT(c.topology.world == world);
  RC_ASSERT(kHfSection.of(c).has_value());
  RC_ASSERT(c.topology.tp == 1 || c.topology.tp == world);
  RC_ASSERT(c.topology.ep == 1 || (c.topology.ep == world && c.topology.tp == 1 && c.model.num_experts > 0));
  const std::optional<std::string> refusal = hf_refusal(c, kRelease, plants);
  RC_LOG() << refusal.value_or("") << "\n";
  RC_ASSERT(!refusal);
}

TEST(HfTarget, AFaultGetsTheLayoutAndTheNormThatShowIt) {
  casefile::Case c = llama_case();
  c.path.faults = vocab::FaultSet::of({vocab::Fault::clip_per_child_norm});
  kHfSection.change(c, [](HfConfig& h) { h.norm = HfNorm::trainer; });
  c = within_hf(std::move(c), every_plant(), 0);
  EXPECT_EQ(c.topology.tp, 4) << "a per-mesh clip shows where a mesh's DTensors meet plain params: under TP";
  EXPECT_EQ(kHfSection.of(c)->norm, HfNorm::accelerate) << "planted in accelerate's norm";
  EXPECT_FALSE(hf_refusal(c, kRelease, every_plant()));
  c = llama_case();
  c.path.faults = vocab::FaultSet::of({vocab::Fault::grads_not_averaged});
  c = within_hf(std::move(c), every_plant(), 0);
  EXPECT_TRUE(kHfSection.of(c)->before_reduction) << "a reduction fault enters before FSDP2's reduction";
  EXPECT_FALSE(hf_refusal(c, kRelease, every_plant()));
}

TEST(HfTarget, ExpertsAreTheirFamilysClassOnEpOverTheWholeWorld) {
  casefile::Case c = mixtral_case();
  on_ep(c, 4, 2);
  c.model.add_bias_linear = true;  // Mixtral's experts have no biases: dropped
  c = within_hf(std::move(c), {}, 0);
  EXPECT_EQ(c.topology.ep, 4) << "transformers places the experts over the whole tp mesh";
  EXPECT_EQ(c.topology.tp, 1);
  EXPECT_FALSE(c.model.add_bias_linear);
  EXPECT_EQ(hf_architecture(c.model), "MixtralForCausalLM");
  EXPECT_FALSE(hf_refusal(c, kRelease));
  c.model.qk_layernorm = true;
  EXPECT_EQ(hf_architecture(c.model), "Qwen3MoeForCausalLM");
  c.model.preset = "gpt-oss";
  EXPECT_EQ(hf_architecture(c.model), "GptOssForCausalLM") << "a preset is its own family";
  c = mixtral_case();
  c.model.num_experts = 6;  // six experts do not divide among four ranks: no EP
  on_ep(c, 4, 2);
  c = within_hf(std::move(c), {}, 0);
  EXPECT_EQ(c.topology.ep, 1);
  EXPECT_FALSE(hf_refusal(c, kRelease));
  c = mixtral_case();
  c.path.faults = vocab::FaultSet::of({vocab::Fault::missing_ep_reduction});
  c = within_hf(std::move(c), every_plant(), 0);
  EXPECT_EQ(c.topology.ep, 4) << "a fault in the Trainer's expert norm shows under EP";
  EXPECT_EQ(kHfSection.of(c)->norm, HfNorm::trainer);
  EXPECT_FALSE(hf_refusal(c, kRelease, every_plant()));
  c = llama_case();
  c.path.faults = vocab::FaultSet::of({vocab::Fault::expert_norm_dropped});
  c = within_hf(std::move(c), every_plant(), 0);
  EXPECT_EQ(c.model.num_experts, 4) << "experts to show it on, one a rank";
  EXPECT_EQ(c.topology.ep, 4);
  EXPECT_FALSE(hf_refusal(c, kRelease, every_plant()));
}

TEST(HfTarget, TpIsTheWholeWorldOrNone) {
  casefile::Case c = llama_case();
  c.model.num_attention_heads = 8;  // heads, key-value heads, MLP and vocabulary that 8 divides
  on_tp(c, 8, 2);
  c = within_hf(std::move(c), {}, 0);
  EXPECT_EQ(c.topology.tp, 8);
  EXPECT_EQ(kHfSection.of(c)->dp_replicate, 1);
  EXPECT_FALSE(kHfSection.of(c)->before_reduction);
  c = llama_case();
  on_tp(c, 8, 2);
  c.model.num_attention_heads = 8;
  c.model.untie_embeddings_and_output_weights = false;  // a tied output under TP: FSDP2 instead
  c = within_hf(std::move(c), {}, 0);
  EXPECT_EQ(c.topology.tp, 1);
  EXPECT_FALSE(hf_refusal(c, kRelease));
}

TEST(HfTarget, EveryRefusalCitesTheStacksCheckOrSaysTheWorkerDoesNotBuildIt) {
  enum class Kind { cited, not_built, tally_terms };
  struct Row {
    const char* name;
    std::function<void(casefile::Case&)> change;
    const char* expected;
    Kind kind;
  };
  const auto section = [](casefile::Case& c, int replicate, bool before) {
    kHfSection.change(c, [&](HfConfig& h) {
      h.dp_replicate = replicate;
      h.before_reduction = before;
    });
  };
  const std::vector<Row> rows = {
      {"custom layout", [](casefile::Case& c) { c.model.kind = topologies::ModelKind::custom; }, "model.kind custom:",
       Kind::not_built},
      {"another framework's section", [](casefile::Case& c) { kDeepSpeedSection.set(c, DeepSpeedConfig{}); },
       "deepspeed: a DeepSpeed case", Kind::tally_terms},
      {"Megatron's gradients stage", [](casefile::Case& c) { c.path.gradients.before_reduction = true; },
       "hf.gradients_enter", Kind::tally_terms},
      {"EP beside TP",
       [](casefile::Case& c) {
         c = mixtral_case();
         c.topology = topologies::ParallelConfig{.world = 4, .tp = 2, .ep = 2, .etp = 1};
       },
       "mixin.py:89", Kind::cited},
      {"EP over part of the world",
       [](casefile::Case& c) {
         c = mixtral_case();
         on_ep(c, 4, 2);
       },
       "topology.ep 2 with expert data-parallel size 2", Kind::not_built},
      {"HSDP with EP",
       [&](casefile::Case& c) {
         c = mixtral_case();
         on_ep(c, 4, 4);
         section(c, 2, false);
       },
       "parallelism_config.py:337", Kind::cited},
      {"EP before a reduction",
       [&](casefile::Case& c) {
         c = mixtral_case();
         on_ep(c, 4, 4);
         section(c, 1, true);
       },
       "hf.gradients_enter before_reduction with topology.ep 4:", Kind::not_built},
      {"biases in a Mixtral",
       [](casefile::Case& c) {
         c = mixtral_case();
         c.model.add_bias_linear = true;
       },
       "model.add_bias_linear with model.num_experts", Kind::not_built},
      {"shared experts in a Mixtral",
       [](casefile::Case& c) {
         c = mixtral_case();
         c.model.moe_shared_expert_intermediate_size = 8;
       },
       "model.moe_shared_expert_intermediate_size", Kind::not_built},
      {"dense layers in a Mixtral",
       [](casefile::Case& c) {
         c = mixtral_case();
         c.model.moe_layer_freq = 2;
       },
       "model.moe_layer_freq", Kind::not_built},
      {"MTP", [](casefile::Case& c) { c.model.mtp_num_layers = 1; }, "modeling_layers.py:359", Kind::cited},
      {"expert TP of its own",
       [](casefile::Case& c) {
         c = mixtral_case();
         c.topology = topologies::ParallelConfig{.world = 4, .etp = 2};
       },
       "topology.etp 2 with topology.tp 1", Kind::not_built},
      {"experts over TP",
       [](casefile::Case& c) {
         c = mixtral_case();
         on_tp(c, 4, 4);
         c.model.moe_ffn_hidden_size = 6;
       },
       "model.moe_ffn_hidden_size 6", Kind::not_built},
      {"the Trainer's expert fault without EP",
       [](casefile::Case& c) {
         c = mixtral_case();
         c.path.faults = vocab::FaultSet::of({vocab::Fault::expert_norm_dropped});
         kHfSection.change(c, [](HfConfig& h) { h.norm = HfNorm::trainer; });
       },
       "trainer.py:2618", Kind::cited},
      {"MTP", [](casefile::Case& c) { c.model.mtp_num_layers = 1; }, "model.mtp_num_layers:", Kind::not_built},
      {"attention sinks", [](casefile::Case& c) { c.model.softmax_type = topologies::SoftmaxType::learnable; },
       "model.softmax_type learnable:", Kind::not_built},
      {"multi-latent attention",
       [](casefile::Case& c) {
         c.model.multi_latent_attention = true;
         c.model.num_query_groups.reset();
       },
       "model.multi_latent_attention:", Kind::not_built},
      {"LayerNorm", [](casefile::Case& c) { c.model.normalization = topologies::Normalization::layer_norm; },
       "model.normalization LayerNorm:", Kind::not_built},
      {"learned positions",
       [](casefile::Case& c) { c.model.position_embedding = topologies::PositionEmbedding::learned_absolute; },
       "model.position_embedding_type learned_absolute:", Kind::not_built},
      {"ungated MLP", [](casefile::Case& c) { c.model.swiglu = false; }, "model.swiglu false:", Kind::not_built},
      {"Qwen3 with MLP biases",
       [](casefile::Case& c) {
         c.model.qk_layernorm = true;
         c.model.add_bias_linear = true;
       },
       "qwen3/modeling_qwen3.py:76", Kind::not_built},
      {"Llama's hidden size",
       [](casefile::Case& c) {
         c.model.hidden_size = 10;
         c.model.num_attention_heads = 4;
         c.model.kv_channels = 4;
       },
       "llama/configuration_llama.py:97", Kind::cited},
      {"generalized TP", [](casefile::Case& c) { c.topology.gtp = 2; }, "topology.gtp/egtp:", Kind::not_built},
      {"pipeline", [](casefile::Case& c) { c.topology = topologies::ParallelConfig{.world = 4, .pp = 2}; },
       "parallelism_config.py:267", Kind::cited},
      {"context parallelism", [](casefile::Case& c) { c.topology = topologies::ParallelConfig{.world = 4, .cp = 2}; },
       "topology.cp 2:", Kind::not_built},
      {"order", [](casefile::Case& c) { c.topology.order = "cp-tp-ep-dp-pp"; }, "parallelism_config.py:267",
       Kind::not_built},
      {"distributed-optimizer instances", [](casefile::Case& c) { c.topology.dist_opt_instances = 2; },
       "topology.dist_opt_instances:", Kind::not_built},
      {"EP without experts", [](casefile::Case& c) { c.topology.ep = 2; }, "topology.ep 2:", Kind::not_built},
      {"optimizer model", [](casefile::Case& c) { c.path.optimizer = vocab::OptimizerModel::distributed; },
       "optimizer.model distributed:", Kind::not_built},
      {"p-norms", [](casefile::Case& c) { c.path.p_values = {1.0}; }, "statistics.p_norms:", Kind::not_built},
      {"16-bit gradients", [](casefile::Case& c) { c.path.gradients.generator.dtype = kernels::Dtype::bf16; },
       "gradients.dtype bf16:", Kind::not_built},
      {"unplanted fault", [](casefile::Case& c) { c.path.faults = vocab::FaultSet::of({vocab::Fault::missing_pp_reduction}); },
       "faults:", Kind::not_built},
      {"no hf section", [](casefile::Case& c) { casefile::keep_only_section(c, ""); },
       "hf: the case has no Hugging Face configuration", Kind::tally_terms},
      {"accelerate's fault with the Trainer under TP",
       [](casefile::Case& c) {
         on_tp(c, 4, 4);
         c.path.faults = vocab::FaultSet::of({vocab::Fault::average_rank_norms});
         kHfSection.change(c, [](HfConfig& h) { h.norm = HfNorm::trainer; });
       },
       "trainer.py:2618", Kind::cited},
      {"a reduction fault after the reduction",
       [](casefile::Case& c) { c.path.faults = vocab::FaultSet::of({vocab::Fault::grads_not_averaged}); },
       "faults: a reduction fault is planted in FSDP2's reduction", Kind::tally_terms},
      {"FSDP2 with TP", [](casefile::Case& c) { on_tp(c, 4, 2); }, "accelerator.py:1618", Kind::cited},
      {"HSDP with TP over the world",
       [&](casefile::Case& c) {
         on_tp(c, 4, 4);
         section(c, 2, false);
       },
       "parallelism_config.py:337", Kind::cited},
      {"TP before a reduction",
       [&](casefile::Case& c) {
         on_tp(c, 4, 4);
         section(c, 1, true);
       },
       "hf.gradients_enter before_reduction with topology.tp 4:", Kind::not_built},
      {"HSDP degree not dividing DP", [&](casefile::Case& c) { section(c, 3, false); }, "parallelism_config.py:373",
       Kind::cited},
      {"HSDP degree equal to DP", [&](casefile::Case& c) { section(c, 4, false); }, "parallelism_config.py:382",
       Kind::cited},
      {"one rank", [](casefile::Case& c) { c.topology = topologies::ParallelConfig{.world = 1}; },
       "parallelism_config.py:382", Kind::cited},
      {"vocabulary over TP",
       [](casefile::Case& c) {
         on_tp(c, 4, 4);
         c.model.vocab_size = 6;
       },
       "tensor_parallel.py:186", Kind::cited},
      {"key-value heads over TP",
       [](casefile::Case& c) {
         on_tp(c, 4, 4);
         c.model.num_query_groups = 2;
       },
       "model.num_query_groups (the key-value heads) 2", Kind::not_built},
      {"heads over TP",
       [](casefile::Case& c) {
         on_tp(c, 2, 2);
         c.model.hidden_size = 12;
         c.model.num_attention_heads = 3;
         c.model.num_query_groups = 2;
       },
       "model.num_attention_heads 3", Kind::not_built},
      {"MLP over TP",
       [](casefile::Case& c) {
         on_tp(c, 4, 4);
         c.model.ffn_hidden_size = 10;
       },
       "model.ffn_hidden_size 10", Kind::not_built},
      {"tied output under TP",
       [](casefile::Case& c) {
         on_tp(c, 4, 4);
         c.model.untie_embeddings_and_output_weights = false;
       },
       "model.untie_embeddings_and_output_weights false with topology.tp 4", Kind::not_built},
  };
  const std::regex citation("[A-Za-z0-9_/]+\\.py:[0-9]+");
  for (const Row& row : rows) {
    casefile::Case c = llama_case();
    row.change(c);
    const std::string refusal = hf_refusal(c, kRelease, every_plant()).value_or("");
    ASSERT_FALSE(refusal.empty()) << row.name << ": not refused";
    EXPECT_NE(refusal.find(row.expected), std::string::npos) << row.name << ": " << refusal;
    const bool cites = std::regex_search(refusal, citation);
    const bool not_built = refusal.find("tally's worker does not build") != std::string::npos;
    EXPECT_TRUE(row.kind != Kind::cited || cites) << row.name << " names no file:line: " << refusal;
    EXPECT_TRUE(row.kind != Kind::not_built || not_built) << row.name << " does not say what is not built: " << refusal;
    EXPECT_TRUE(row.kind == Kind::tally_terms || cites || not_built) << row.name << ": " << refusal;
  }
}

TEST(HfTarget, EachOtherTargetRefusesAnHfCase) {
  const casefile::Case c = llama_case();
  for (const FrameworkTarget* row : framework_targets()) {
    if (row->name == "hf") continue;
    EXPECT_TRUE(starts_with(row->refusal_at_release(c, ""), "hf: a Hugging Face case")) << row->name;
  }
}

TEST(HfTarget, TheSweepTriesLlamaAndQwen3WithEachNormOnFsdpHsdpAndTp) {
  casefile::Case megatron_gpt = llama_case();  // the sweep's own dense GPT: LayerNorm, learned positions
  megatron_gpt.model.normalization = topologies::Normalization::layer_norm;
  megatron_gpt.model.position_embedding = topologies::PositionEmbedding::learned_absolute;
  megatron_gpt.model.swiglu = false;
  const auto variants = hf_sweep_variants(megatron_gpt);
  ASSERT_EQ(variants.size(), 16u);
  EXPECT_EQ(variants[0].first, "fsdp");
  EXPECT_EQ(variants[1].first, "fsdp-unreduced");
  EXPECT_TRUE(kHfSection.of(variants[1].second)->before_reduction);
  EXPECT_EQ(variants[2].first, "hsdp");
  EXPECT_EQ(kHfSection.of(variants[2].second)->dp_replicate, 2);
  EXPECT_EQ(variants[4].first, "trainer-fsdp");
  EXPECT_EQ(kHfSection.of(variants[4].second)->norm, HfNorm::trainer);
  EXPECT_EQ(variants[8].first, "qwen3-fsdp");
  EXPECT_TRUE(variants[8].second.model.qk_layernorm);
  for (const auto& [name, c] : variants) {
    EXPECT_EQ(c.model.normalization, topologies::Normalization::rms_norm) << name;
    EXPECT_TRUE(c.model.swiglu) << name;
  }
  on_tp(megatron_gpt, 4, 4);
  const auto tp = hf_sweep_variants(megatron_gpt);
  ASSERT_EQ(tp.size(), 4u) << "TP over the world: no HSDP, no stage before a reduction";
  EXPECT_EQ(tp[1].first, "trainer-tp");
  megatron_gpt.model.num_experts = 4;
  EXPECT_EQ(hf_sweep_variants(megatron_gpt).size(), 2u) << "a MoE model at TP over the world: its class, per norm";
  megatron_gpt.topology = topologies::ParallelConfig{.world = 4, .ep = 4};
  const auto ep = hf_sweep_variants(megatron_gpt);
  ASSERT_EQ(ep.size(), 2u);
  EXPECT_EQ(ep[1].first, "trainer-ep");
  EXPECT_EQ(hf_architecture(ep[0].second.model), "MixtralForCausalLM");
  EXPECT_EQ(ep[0].second.model.normalization, topologies::Normalization::rms_norm);
  EXPECT_FALSE(hf_refusal(ep[1].second, kRelease));
}

// FSDP2 averages every gradient over the world at TP 1 (accelerate sets no divide factor).
TEST(HfTarget, StatesFsdp2sAverageWhereGradientsEnterBeforeIt) {
  casefile::Case c = llama_case();
  EXPECT_EQ(hf_reduction_groups(c), std::nullopt) << "after the reduction: no shares";
  kHfSection.change(c, [](HfConfig& h) {
    h.before_reduction = true;
    h.dp_replicate = 2;
  });
  EXPECT_EQ(hf_reduction_groups(c), (ReductionGroups{{4}, 4})) << "HSDP's replicas average too";
  const nlohmann::json written = casefile::case_to_json(c);
  EXPECT_EQ(written["hf"]["gradients_enter"], "before_reduction");
  EXPECT_EQ(written["hf"]["norm"], "accelerate");
  EXPECT_EQ(kHfSection.of(casefile::case_from_json(nlohmann::json::parse(written.dump()), run::case_frameworks(), "case.json")),
            kHfSection.of(c));
}

TEST(HfTarget, TheRecipeIsAcceleratesConfiguration) {
  casefile::Case c = llama_case();
  kHfSection.change(c, [](HfConfig& h) {
    h.dp_replicate = 2;
    h.norm = HfNorm::trainer;
  });
  const nlohmann::ordered_json recipe = hf_recipe(c);
  EXPECT_EQ(recipe["parallelism_config"]["dp_replicate_size"], 2);
  EXPECT_EQ(recipe["parallelism_config"]["dp_shard_size"], 2);
  EXPECT_EQ(recipe["parallelism_config"]["tp_size"], 1);
  EXPECT_EQ(recipe["fsdp_version"], 2);
  EXPECT_EQ(recipe["norm"], "trainer");
  EXPECT_EQ(hf_norm_code(c), "transformers Trainer._clip_grad_norm over HSDP");
  kHfSection.change(c, [](HfConfig& h) { h.dp_replicate = 1; });
  on_tp(c, 4, 4);
  EXPECT_TRUE(hf_recipe(c)["fsdp_version"].is_null());
  EXPECT_EQ(hf_recipe(c)["parallelism_config"]["dp_shard_size"], 1);
  EXPECT_TRUE(hf_recipe(c)["family"].is_null());
  c = mixtral_case();
  on_ep(c, 4, 4);
  const nlohmann::ordered_json ep = hf_recipe(c);
  EXPECT_EQ(ep["parallelism_config"]["tp_size"], 4) << "the experts are placed on accelerate's tp mesh";
  EXPECT_TRUE(ep["fsdp_version"].is_null());
  EXPECT_EQ(ep["expert_parallel"], true);
  EXPECT_EQ(ep["family"], "mixtral");
  EXPECT_EQ(ep["architecture"], "MixtralForCausalLM");
  EXPECT_EQ(hf_norm_code(c), "accelerate Accelerator.clip_grad_norm_ over EP");
}

}  // namespace
}  // namespace tally::run
