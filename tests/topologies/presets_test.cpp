#include "topologies/presets.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "topologies/enumerate.h"
#include "topologies/logical_model.h"

namespace tally::topologies {
namespace {

std::set<std::string> param_suffixes(const ModelSpec& spec, const ParallelConfig& config) {
  std::set<std::string> out;
  const LogicalModel model(spec, config);
  for (const LogicalParam& p : model.params()) {
    const std::size_t module = p.name.rfind('.', p.name.rfind('.') - 1);
    out.insert(p.name.substr(module + 1));
  }
  return out;
}

TEST(Presets, NamesRoundTrip) {
  for (Preset p : kAllPresets) EXPECT_EQ(preset_from_name(preset_name(p)), p);
  EXPECT_EQ(preset_from_name("llama"), std::nullopt);
  EXPECT_EQ(preset_names(), "llama3, mixtral, qwen3-moe, gpt-oss, deepseek-v3");
}

// The kinds of parameters each family has, on one configuration with every axis used.
TEST(Presets, EachFamilyHasItsKindsOfParameters) {
  const ParallelConfig config{.world = 8, .tp = 2, .pp = 2, .ep = 2, .etp = 1};
  ASSERT_EQ(check_config(config), std::nullopt);
  const ParallelConfig dense{.world = 8, .tp = 2, .pp = 2};  // a dense model has no expert parallelism
  const ModelSpec llama = *preset_model(Preset::llama3, dense).model;
  EXPECT_EQ(llama.preset, "llama3");
  EXPECT_EQ(llama.num_experts, 0);
  EXPECT_LT(*llama.num_query_groups, llama.num_attention_heads) << "GQA";
  EXPECT_TRUE(llama.swiglu && llama.untie_embeddings_and_output_weights && !llama.add_bias_linear);
  EXPECT_TRUE(param_suffixes(llama, dense).contains("output_layer.weight"));
  EXPECT_FALSE(param_suffixes(llama, dense).contains("linear_qkv.bias"));

  const ModelSpec qwen = *preset_model(Preset::qwen3_moe, config).model;
  EXPECT_TRUE(param_suffixes(qwen, config).contains("q_layernorm.weight"));
  EXPECT_TRUE(param_suffixes(qwen, config).contains("router.weight"));

  const ModelSpec oss = *preset_model(Preset::gpt_oss, config).model;
  const std::set<std::string> oss_params = param_suffixes(oss, config);
  EXPECT_TRUE(oss_params.contains("core_attention.softmax_offset")) << "attention sinks";
  EXPECT_TRUE(oss_params.contains("linear_fc2.bias")) << "expert biases";
  EXPECT_TRUE(oss_params.contains("linear_qkv.bias"));

  const ModelSpec mixtral = *preset_model(Preset::mixtral, config).model;
  EXPECT_EQ(moe_layer_count(mixtral), mixtral.num_layers) << "every layer MoE";
  EXPECT_FALSE(mixtral.qk_layernorm);
}

TEST(Presets, SayWhyTheyHaveNoModel) {
  const ParallelConfig etp2{.world = 4, .tp = 2, .ep = 2, .etp = 2};
  EXPECT_EQ(preset_model(Preset::gpt_oss, etp2).why_none,
            "gpt-oss: expert biases (add_bias_linear with num_experts 4) need etp 1, got etp 2 (Megatron-LM: bias in "
            "MoE is only supported when ETP==1)");
  EXPECT_EQ(preset_model(Preset::llama3, etp2).why_none,
            "llama3: ep 2 needs num_experts > 0 (expert parallelism needs MoE layers)");
}

// DeepSeek-V3: multi-latent attention with both low-rank projections and their fused norms, no
// linear_qkv, the first layer dense and the next MoE with a shared expert, and an MTP layer.
TEST(Presets, DeepSeekV3HasMultiLatentAttentionAFirstDenseLayerASharedExpertAndMtp) {
  const ParallelConfig config{.world = 8, .tp = 2, .pp = 2, .ep = 2, .etp = 2};
  const PresetModel laid_out = preset_model(Preset::deepseek_v3, config);
  ASSERT_TRUE(laid_out.model) << laid_out.why_none;
  const ModelSpec& v3 = *laid_out.model;
  EXPECT_EQ(v3.num_layers, 4);
  EXPECT_EQ(moe_layer_count(v3), 3) << "the first layer dense";
  EXPECT_FALSE(is_moe_layer(v3, 0));
  const std::set<std::string> params = param_suffixes(v3, config);
  for (const char* name : {"linear_q_down_proj.weight", "linear_q_up_proj.layer_norm_weight", "linear_q_up_proj.weight",
                           "linear_kv_down_proj.weight", "linear_kv_up_proj.layer_norm_weight",
                           "linear_kv_up_proj.weight", "eh_proj.weight"})
    EXPECT_TRUE(params.contains(name)) << name;
  EXPECT_GT(v3.moe_shared_expert_intermediate_size, 0);
  EXPECT_EQ(v3.mtp_num_layers, 1);
  EXPECT_FALSE(params.contains("linear_qkv.weight"));
  EXPECT_FALSE(params.contains("linear_q_proj.weight")) << "q_lora_rank set: down and up instead";
}

// A preset is laid out on every configuration of a world whose axes its family has.
TEST(Presets, FitEveryConfigurationOfWorldEight) {
  int laid_out = 0;
  for_each_config(8, {}, [&](const ParallelConfig& config) {
    for (Preset p : {Preset::mixtral, Preset::qwen3_moe}) {
      const PresetModel m = preset_model(p, config);
      EXPECT_TRUE(m.model) << preset_name(p) << " on " << describe(config) << ": " << m.why_none;
      laid_out += m.model ? 1 : 0;
    }
  });
  EXPECT_GT(laid_out, 1000);
}

}  // namespace
}  // namespace tally::topologies
