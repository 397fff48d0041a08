// What the NeMo-Automodel worker runs (run/automodel/rules.h): every generated case is one it builds,
// and each case it cannot build is refused in one line naming the field and the rule (Automodel's own
// check where it has one).
#include <functional>
#include <map>
#include <regex>

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

// tally's deepseek-v3 preset's shape on the case: multi-latent attention, a dense first layer, a
// shared expert of one expert's width.
void deepseek_v3(casefile::Case& c) {
  c.model.num_experts = 4;
  c.model.multi_latent_attention = true;
  c.model.qk_layernorm = true;
  c.model.num_query_groups.reset();
  c.model.q_lora_rank = 4;
  c.model.kv_lora_rank = 2;
  c.model.qk_head_dim = 2;
  c.model.qk_pos_emb_head_dim = 2;
  c.model.v_head_dim = 2;
  c.model.moe_ffn_hidden_size = 2;
  c.model.moe_shared_expert_intermediate_size = 2;
  c.model.moe_layer_pattern = {false, true};
}

// A worker on a machine without a GPU says it cannot build MoE (its hello's cannot_run).
const std::map<std::string, std::string> kNoGpu = {{"model.num_experts", "no CUDA device (as the test says)"}};

RC_GTEST_PROP(AutomodelTarget, EveryGeneratedCaseIsOneTheWorkerBuilds, ()) {
  const int world = *rc::gen::element(2, 4, 8);
  const std::map<std::string, std::string> cannot_run = *rc::gen::arbitrary<bool>() ? kNoGpu : std::map<std::string, std::string>{};
  fuzz::CaseGenOptions options = testing::gpt_cases_of_world(world);
  const FaultPlants plants = every_plant();
  options.restrict_to = [plants, cannot_run](casefile::Case c) {
    const std::uint64_t draw = c.path.gradients.generator.seed;
    return within_automodel(std::move(c), plants, draw, cannot_run);
  };
  casefile::Case c = *fuzz::gen_case(options);
  if (*rc::gen::arbitrary<bool>()) {
    c.path.faults = vocab::FaultSet::of({*rc::gen::element(vocab::Fault::average_rank_norms, vocab::Fault::stats_over_replicas,
                                                           vocab::Fault::clip_per_child_norm)});
    c = within_automodel(std::move(c), plants, c.path.gradients.generator.seed, cannot_run);
  }
  RC_ASSERT(!casefile::check_case(c));
  RC_ASSERT(c.topology.world == world);
  RC_ASSERT(kAutomodelSection.of(c).has_value());
  RC_ASSERT(cannot_run.empty() || c.model.num_experts == 0 || c.model.multi_latent_attention);
  const std::optional<std::string> refusal = automodel_refusal(c, "0.7.0", plants, cannot_run);
  RC_LOG() << refusal.value_or("") << "\n";
  RC_ASSERT(!refusal);
}

// The presets as a campaign with --preset draws them, each made the worker's: every one it keeps MoE
// (Qwen3-MoE, GPT-OSS, DeepSeek-V3 without MTP) is one it builds, with or without a GPU.
RC_GTEST_PROP(AutomodelTarget, EveryPresetCaseIsOneTheWorkerBuilds, ()) {
  const int world = *rc::gen::element(2, 4, 8);
  const std::map<std::string, std::string> cannot_run = *rc::gen::arbitrary<bool>() ? kNoGpu : std::map<std::string, std::string>{};
  fuzz::CaseGenOptions options = testing::gpt_cases_of_world(world);
  options.presets = {topologies::Preset::llama3, topologies::Preset::mixtral, topologies::Preset::qwen3_moe,
                     topologies::Preset::gpt_oss, topologies::Preset::deepseek_v3};
  const FaultPlants plants = every_plant();
  options.restrict_to = [plants, cannot_run](casefile::Case c) {
    return within_automodel(std::move(c), plants, c.path.gradients.generator.seed, cannot_run);
  };
  const casefile::Case c = *fuzz::gen_case(options);
  RC_ASSERT(!casefile::check_case(c));
  const std::optional<std::string> refusal = automodel_refusal(c, "0.7.0", plants, cannot_run);
  RC_LOG() << refusal.value_or("") << "\n";
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
  c.model.qk_layernorm = true;
  const std::map<std::string, std::string> no_gpu = {
      {"model.num_experts", "Automodel's Qwen3-MoE builds its rotary embedding on cuda:current_device() "
                            "(nemo_automodel/components/models/qwen3_moe/model.py:184), and this worker sees no CUDA device"}};
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0", {}, no_gpu),
                          "model.num_experts without multi_latent_attention: Automodel's Qwen3-MoE builds"))
      << "the worker's own reason, where it cannot build MoE";
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0"), "topology.tp 2 with experts:")) << "where it can";
  c.topology = topologies::ParallelConfig{.world = 4, .ep = 2};
  EXPECT_FALSE(automodel_refusal(c, "0.7.0")) << "Qwen3-MoE on EP 2 x FSDP 2";
  // DeepSeek-V3 (multi-latent attention) builds on CPUs: the worker's reason does not reach it.
  deepseek_v3(c);
  EXPECT_FALSE(automodel_refusal(c, "0.7.0", {}, no_gpu)) << "DeepSeek-V3 on EP 2 x FSDP 2, without a GPU";
  const casefile::Case kept = within_automodel(c, {}, 1, no_gpu);
  EXPECT_EQ(kept.model.num_experts, 4) << "stays MoE where the worker sees no GPU";
  EXPECT_TRUE(kept.model.multi_latent_attention);
  c = llama_case();
  c.model.qk_layernorm = true;
  c.model.add_bias_linear = true;
  EXPECT_NE(automodel_refusal(c, "0.7.0").value_or("").find("Qwen3MLP"), std::string::npos);
  c = llama_case();
  c.model.hidden_size = 10;  // 4 heads of 4 channels: Megatron's kv_channels, not LlamaConfig's rule
  c.model.num_attention_heads = 4;
  c.model.kv_channels = 4;
  EXPECT_NE(automodel_refusal(c, "0.7.0").value_or("").find("configuration_llama.py:97"), std::string::npos);
  c = llama_case();
  c.model.num_attention_heads = 4;
  c.model.num_query_groups = 1;  // one key-value head on TP 2
  EXPECT_NE(automodel_refusal(c, "0.7.0").value_or("").find("parallelizer.py:1040"), std::string::npos);
  c = llama_case();
  kAutomodelSection.change(c, [&](AutomodelConfig& d) { d.dp_replicate = 2; });  // DP 2: Automodel's own refusal
  EXPECT_NE(automodel_refusal(c, "0.7.0").value_or("").find("mesh_utils.py:311"), std::string::npos);
  c = llama_case();
  c.topology = topologies::ParallelConfig{.world = 4, .pp = 2};
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0"), "topology.pp 2: tally's worker does not build a pipeline"));
  c = llama_case();
  c.topology.order = "cp-tp-ep-dp-pp";
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0"), "topology.order cp-tp-ep-dp-pp:"));
  c = llama_case();
  c.path.faults = vocab::FaultSet::of({vocab::Fault::missing_pp_reduction});
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0", every_plant()), "faults: tally's worker does not build a counterpart"));
  c = llama_case();
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  EXPECT_TRUE(starts_with(automodel_refusal(c, "0.7.0"), "deepspeed: a DeepSpeed case"));
}

// Issue 50: every refusal names Automodel's (or transformers') own check as file:line at the release
// (kind cited), or says plainly that tally's worker does not build the case (kind not_built). A few
// say what a field means in tally's own terms (kind tally_terms): another framework's section,
// Megatron's gradients stage, a missing automodel section; each is pinned by its own words.
TEST(AutomodelTarget, EveryRefusalCitesAutomodelsCheckOrSaysTheWorkerDoesNotBuildIt) {
  enum class Kind { cited, not_built, tally_terms };
  struct Row {
    const char* name;
    std::function<void(casefile::Case&)> change;
    const char* expected;
    Kind kind;
  };
  const auto tp = [](casefile::Case& c, int world, int tp_size) {
    c.topology = topologies::ParallelConfig{.world = world, .tp = tp_size, .etp = tp_size};
  };
  const auto section = [](casefile::Case& c, int replicate, bool sp) {
    kAutomodelSection.change(c, [&](AutomodelConfig& d) {
      d.dp_replicate = replicate;
      d.sequence_parallel = sp;
    });
  };
  const std::vector<Row> rows = {
      {"custom layout", [](casefile::Case& c) { c.model.kind = topologies::ModelKind::custom; }, "model.kind custom:",
       Kind::not_built},
      {"another framework's section", [](casefile::Case& c) { kDeepSpeedSection.set(c, DeepSpeedConfig{}); },
       "deepspeed: a DeepSpeed case", Kind::tally_terms},
      {"Megatron's gradients stage", [](casefile::Case& c) { c.path.gradients.before_reduction = true; },
       "automodel.gradients_enter", Kind::tally_terms},
      {"experts without q/k layernorms or sinks", [](casefile::Case& c) { c.model.num_experts = 4; },
       "gpt_oss/layers.py:97", Kind::not_built},
      {"GPT-OSS without biases",
       [](casefile::Case& c) {
         c.model.num_experts = 4;
         c.model.softmax_type = topologies::SoftmaxType::learnable;
       },
       "gpt_oss/layers.py:59-70", Kind::not_built},
      {"GPT-OSS with a dense layer",
       [](casefile::Case& c) {
         c.model.num_experts = 4;
         c.model.softmax_type = topologies::SoftmaxType::learnable;
         c.model.add_bias_linear = true;
         c.model.moe_layer_freq = 2;
       },
       "gpt_oss/model.py:54", Kind::cited},
      {"GPT-OSS over TP",
       [](casefile::Case& c) {
         c.model.num_experts = 4;
         c.model.softmax_type = topologies::SoftmaxType::learnable;
         c.model.add_bias_linear = true;
       },
       "topology.tp 2 with experts: tally's worker does not build TP with Automodel's GPT-OSS", Kind::not_built},
      {"DeepSeek-V3 with a dense layer after a MoE one",
       [](casefile::Case& c) {
         deepseek_v3(c);
         c.model.num_layers = 3;
         c.model.moe_layer_pattern = {false, true, false};
       },
       "deepseek_v3/model.py:55", Kind::cited},
      {"expert TP",
       [](casefile::Case& c) {
         deepseek_v3(c);
         c.topology = topologies::ParallelConfig{.world = 4, .ep = 2, .etp = 2};
       },
       "tp_plan_validation.py:79", Kind::cited},
      {"DeepSeek-V3 with MTP",
       [](casefile::Case& c) {
         deepseek_v3(c);
         c.model.mtp_num_layers = 1;
       },
       "model.mtp_num_layers: tally's worker does not build multi-token prediction with Automodel", Kind::not_built},
      {"DeepSeek-V3 with a shared expert not a whole number of experts",
       [](casefile::Case& c) {
         deepseek_v3(c);
         c.model.moe_shared_expert_intermediate_size = 3;
       },
       "deepseek_v3/model.py:152", Kind::not_built},
      {"DeepSeek-V3 without its latent norms",
       [](casefile::Case& c) {
         deepseek_v3(c);
         c.model.qk_layernorm = false;
       },
       "deepseek_v3/layers.py:114", Kind::not_built},
      {"sinks in Qwen3-MoE",
       [](casefile::Case& c) {
         c.model.num_experts = 4;
         c.model.qk_layernorm = true;
         c.model.softmax_type = topologies::SoftmaxType::learnable;
       },
       "model.softmax_type learnable with experts and qk_layernorm:", Kind::not_built},
      {"experts over TP",
       [](casefile::Case& c) {
         c.model.num_experts = 4;
         c.model.qk_layernorm = true;
       },
       "topology.tp 2 with experts:", Kind::not_built},
      {"a shared expert",
       [](casefile::Case& c) {
         c.model.num_experts = 4;
         c.model.qk_layernorm = true;
         c.model.moe_shared_expert_intermediate_size = 8;
       },
       "model.moe_shared_expert_intermediate_size:", Kind::not_built},
      {"stacked experts FSDP2 cannot shard evenly",
       [](casefile::Case& c) {
         c.model.num_experts = 4;
         c.model.qk_layernorm = true;
         c.model.hidden_size = 6;
         c.model.num_attention_heads = 2;
         c.topology = topologies::ParallelConfig{.world = 8, .ep = 2};  // ep_shard 4
       },
       "_fsdp_param.py:377", Kind::cited},
      {"experts with a tied output layer",
       [](casefile::Case& c) {
         c.model.num_experts = 4;
         c.model.qk_layernorm = true;
         c.model.untie_embeddings_and_output_weights = false;
       },
       "tie_word_embeddings.py:61", Kind::cited},
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
       "topology.pp 2:", Kind::not_built},
      {"order", [](casefile::Case& c) { c.topology.order = "cp-tp-ep-dp-pp"; }, "mesh_utils.py:324", Kind::not_built},
      {"distributed-optimizer instances", [](casefile::Case& c) { c.topology.dist_opt_instances = 2; },
       "topology.dist_opt_instances:", Kind::not_built},
      {"EP without experts", [](casefile::Case& c) { c.topology.ep = 2; }, "moe/parallelizer.py:245", Kind::cited},
      {"optimizer model", [](casefile::Case& c) { c.path.optimizer = vocab::OptimizerModel::distributed; },
       "optimizer.model distributed:", Kind::not_built},
      {"p-norms", [](casefile::Case& c) { c.path.p_values = {1.0}; }, "statistics.p_norms:", Kind::not_built},
      {"16-bit gradients", [](casefile::Case& c) { c.path.gradients.generator.dtype = kernels::Dtype::bf16; },
       "gradients.dtype bf16:", Kind::not_built},
      {"unplanted fault", [](casefile::Case& c) { c.path.faults = vocab::FaultSet::of({vocab::Fault::missing_pp_reduction}); },
       "faults:", Kind::not_built},
      {"no automodel section", [](casefile::Case& c) { casefile::keep_only_section(c, ""); },
       "automodel: the case has no Automodel configuration", Kind::tally_terms},
      {"HSDP degree not dividing DP",
       [&](casefile::Case& c) {
         tp(c, 8, 2);  // DP 4
         section(c, 3, false);
       },
       "mesh_utils.py:309", Kind::cited},
      {"HSDP degree not below DP", [&](casefile::Case& c) { section(c, 2, false); }, "mesh_utils.py:311", Kind::cited},
      {"sequence parallelism without TP",
       [&](casefile::Case& c) {
         tp(c, 4, 1);
         section(c, 1, true);
       },
       "parallelizer.py:317", Kind::not_built},
      {"key-value heads over TP",
       [](casefile::Case& c) {
         c.model.num_attention_heads = 4;
         c.model.num_query_groups = 1;
       },
       "parallelizer.py:1040", Kind::cited},
      {"heads over TP",  // key-value heads that TP divides, heads it does not: only a direct call builds it
       [](casefile::Case& c) {
         c.model.hidden_size = 12;
         c.model.num_attention_heads = 3;
         c.model.num_query_groups = 2;
       },
       "parallelizer.py:1042", Kind::cited},
      {"MLP over TP", [](casefile::Case& c) { c.model.ffn_hidden_size = 9; }, "model.ffn_hidden_size 9",
       Kind::not_built},
      {"vocabulary over TP", [](casefile::Case& c) { c.model.vocab_size = 9; }, "model.vocab_size 9", Kind::not_built},
  };
  const std::regex citation("[A-Za-z0-9_/]+\\.py:[0-9]+");
  for (const Row& row : rows) {
    casefile::Case c = llama_case();
    row.change(c);
    const std::string refusal = automodel_refusal(c, "0.7.0", every_plant()).value_or("");
    ASSERT_FALSE(refusal.empty()) << row.name << ": not refused";
    EXPECT_NE(refusal.find(row.expected), std::string::npos) << row.name << ": " << refusal;
    const bool cites = std::regex_search(refusal, citation);
    const bool not_built = refusal.find("tally's worker does not build") != std::string::npos;
    EXPECT_TRUE(row.kind != Kind::cited || cites) << row.name << " names no file:line: " << refusal;
    EXPECT_TRUE(row.kind != Kind::not_built || not_built) << row.name << " does not say what is not built: " << refusal;
    EXPECT_TRUE(row.kind == Kind::tally_terms || cites || not_built) << row.name << ": " << refusal;
  }
}

TEST(AutomodelTarget, EachOtherTargetRefusesAnAutomodelCase) {
  const casefile::Case c = llama_case();
  for (const FrameworkTarget* row : framework_targets()) {
    if (row->name == "automodel") continue;
    EXPECT_TRUE(starts_with(row->refusal_at_release(c, ""), "automodel: a NeMo-Automodel case")) << row->name;
  }
}

TEST(AutomodelTarget, TheSweepTriesLlamaAndQwen3OnFsdpAndHsdpWithAndWithoutSequenceParallelismAndEachMoeFamily) {
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
  const auto moe = automodel_sweep_variants(megatron_gpt);
  ASSERT_EQ(moe.size(), 4u) << "a MoE model as Qwen3-MoE and as GPT-OSS, with FSDP after its reduction and before";
  EXPECT_EQ(moe[0].first, "qwen3-moe-fsdp");
  EXPECT_TRUE(moe[0].second.model.qk_layernorm);
  EXPECT_EQ(moe[0].second.model.num_experts, 4);
  EXPECT_EQ(moe[1].first, "qwen3-moe-fsdp-unreduced");
  EXPECT_TRUE(kAutomodelSection.of(moe[1].second)->before_reduction);
  EXPECT_EQ(moe[2].first, "gpt-oss-fsdp");
  EXPECT_FALSE(moe[2].second.model.qk_layernorm);
  EXPECT_TRUE(moe[2].second.model.add_bias_linear);
  EXPECT_EQ(moe[2].second.model.softmax_type, topologies::SoftmaxType::learnable);
  EXPECT_EQ(automodel_architecture(moe[2].second.model), "GptOssForCausalLM");
  EXPECT_EQ(automodel_architecture(moe[0].second.model), "Qwen3MoeForCausalLM");
  megatron_gpt.model.multi_latent_attention = true;  // a MoE model with MLA: also as DeepSeek-V3
  megatron_gpt.model.num_query_groups.reset();
  megatron_gpt.model.q_lora_rank = 4;
  const auto latent = automodel_sweep_variants(megatron_gpt);
  ASSERT_EQ(latent.size(), 6u);
  EXPECT_EQ(latent[4].first, "deepseek-v3-fsdp");
  EXPECT_TRUE(latent[4].second.model.multi_latent_attention);
  EXPECT_EQ(automodel_architecture(latent[4].second.model), "DeepseekV3ForCausalLM");
  EXPECT_EQ(latent[5].first, "deepseek-v3-fsdp-unreduced");
  EXPECT_FALSE(latent[0].second.model.multi_latent_attention) << "the Qwen3-MoE of its size has GQA attention";
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
  casefile::Case experts = c;
  experts.model.num_experts = 4;
  experts.topology = {.world = 8, .tp = 1, .ep = 2, .etp = 1};
  EXPECT_EQ(automodel_reduction_groups(experts), (ReductionGroups{{8, 4}, 8}))
      << "experts: FSDP2's over ep_shard 4, the recipe's scale then dividing by DP / ep_shard";
  experts.topology.ep = 1;
  EXPECT_EQ(automodel_reduction_groups(experts), (ReductionGroups{{8}, 8})) << "EP 1: the experts are FSDP2's over DP";
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
