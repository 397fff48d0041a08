#include "topologies/model_spec.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <functional>

#include "tests/support/model_gen.h"
#include "tests/support/configs.h"

namespace tally::topologies {
namespace {

TEST(ModelSpec, DefaultIsASmallValidGpt) {
  EXPECT_EQ(check_model(ModelSpec{}), std::nullopt);
  EXPECT_EQ(check_model(ModelSpec{}, ParallelConfig{}), std::nullopt);
  EXPECT_EQ(describe(ModelSpec{}),
            "gpt: 2 layers, hidden 16, heads 4 (query groups 4, kv_channels 4), vocab 64, ffn 64, "
            "LayerNorm, linear biases, learned_absolute, tied output layer");
}

TEST(ModelSpec, ClassTable) {
  for (ParamClass c : kAllParamClasses) EXPECT_EQ(class_from_name(class_name(c)), c);
  EXPECT_EQ(class_from_name("colum"), std::nullopt);
  EXPECT_EQ(class_name(ParamClass::expert_row_bias), "expert-row-bias");
  EXPECT_EQ(partition_dim(ParamClass::row), 1);
  EXPECT_EQ(partition_dim(ParamClass::expert_row), 1);
  EXPECT_EQ(partition_dim(ParamClass::vocab), 0);
  EXPECT_EQ(partition_dim(ParamClass::head_sharded), 0);
  EXPECT_EQ(partition_dim(ParamClass::replicated), -1);
  EXPECT_EQ(partition_dim(ParamClass::expert_row_bias), -1);
  EXPECT_TRUE(is_expert_class(ParamClass::expert_column_bias));
  EXPECT_FALSE(is_expert_class(ParamClass::head_sharded));
}

struct Rule {
  std::string name;
  std::function<void(ModelSpec&)> edit;
  ParallelConfig config;
  std::string message;
};

CustomParam custom(std::string name, ParamClass c, std::vector<std::int64_t> shape) {
  CustomParam p;
  p.name = std::move(name);
  p.param_class = c;
  p.shape = std::move(shape);
  return p;
}

ModelSpec custom_spec(std::vector<CustomParam> params, int experts = 0) {
  ModelSpec s;
  s.kind = ModelKind::custom;
  s.num_experts = experts;
  s.params = std::move(params);
  return s;
}

// Every rule gives one line naming the sizes and the rule.
TEST(ModelSpec, EveryRuleHasItsMessage) {
  const ParallelConfig one{};
  const std::vector<Rule> rules = {
      {"negative layers", [](ModelSpec& s) { s.num_layers = -3; }, one,
       "num_layers must be at least 1 (got -3)"},
      {"huge hidden", [](ModelSpec& s) { s.hidden_size = 2000000000; }, one,
       "hidden_size 2000000000 is larger than tally supports (at most 1073741824)"},
      {"zero groups", [](ModelSpec& s) { s.num_query_groups = 0; }, one,
       "num_query_groups must be at least 1 (got 0)"},
      {"negative experts", [](ModelSpec& s) { s.num_experts = -1; }, one,
       "num_experts must be at least 0 (got -1)"},
      {"hidden by heads", [](ModelSpec& s) { s.hidden_size = 10; }, one,
       "hidden_size 10 is not divisible by num_attention_heads 4 (kv_channels defaults to their "
       "quotient)"},
      {"heads by groups", [](ModelSpec& s) { s.num_query_groups = 3; }, one,
       "num_attention_heads 4 is not divisible by num_query_groups 3"},
      {"moe ffn without experts", [](ModelSpec& s) { s.moe_ffn_hidden_size = 8; }, one,
       "moe_ffn_hidden_size 8 needs num_experts > 0"},
      {"shared expert without experts",
       [](ModelSpec& s) { s.moe_shared_expert_intermediate_size = 8; }, one,
       "moe_shared_expert_intermediate_size 8 needs num_experts > 0"},
      {"gate without shared expert",
       [](ModelSpec& s) {
         s.num_experts = 2;
         s.moe_shared_expert_gate = true;
       },
       one, "moe_shared_expert_gate needs a shared expert (moe_shared_expert_intermediate_size > 0)"},
      {"shared expert with biases",
       [](ModelSpec& s) {
         s.num_experts = 2;
         s.moe_shared_expert_intermediate_size = 8;
       },
       one,
       "moe_shared_expert_intermediate_size 8 with add_bias_linear: Megatron-LM's shared experts "
       "do not support biases (disable add_bias_linear)"},
      {"detached heads without mtp", [](ModelSpec& s) { s.mtp_detach_heads = true; }, one,
       "mtp_detach_heads needs mtp_num_layers > 0"},
      {"too many params",
       [](ModelSpec& s) {
         s.num_layers = 100000;
         s.num_experts = 100;
       },
       one, "the model has 41000004 parameters; tally supports at most 1000000"},
      {"too many elements in one tensor",
       [](ModelSpec& s) {
         s.vocab_size = 1 << 30;
         s.hidden_size = 1 << 12;
         s.num_attention_heads = 1;
       },
       one,
       "embedding.word_embeddings.weight has more than 1099511627776 elements, more than tally "
       "supports in one model"},
      {"too many elements",
       [](ModelSpec& s) {
         s.vocab_size = 1 << 28;
         s.hidden_size = 1 << 12;
         s.num_attention_heads = 1;
         s.num_layers = 1;
         s.untie_embeddings_and_output_weights = true;
       },
       one, "the model has 2199224774656 elements; tally supports at most 1099511627776"},
      {"vocab by tp", [](ModelSpec& s) { s.vocab_size = 1000; }, testing::config_of(16, 16, 1, 1, 16),
       "vocab_size 1000 is not divisible by tp 16"},
      {"heads by tp", [](ModelSpec& s) { s.vocab_size = 96; }, testing::config_of(3, 3, 1, 1, 3),
       "num_attention_heads 4 is not divisible by tp 3"},
      {"groups by tp",
       [](ModelSpec& s) {
         s.num_attention_heads = 8;
         s.num_query_groups = 2;
       },
       testing::config_of(4, 4, 1, 1, 4), "num_query_groups 2 is not divisible by tp 4"},
      {"ffn by tp", [](ModelSpec& s) { s.ffn_hidden_size = 30; }, testing::config_of(4, 4, 1, 1, 4),
       "ffn_hidden_size 30 is not divisible by tp 4"},
      {"shared expert by tp",
       [](ModelSpec& s) {
         s.num_experts = 4;
         s.add_bias_linear = false;
         s.moe_shared_expert_intermediate_size = 6;
       },
       testing::config_of(4, 4, 1, 1, 4), "moe_shared_expert_intermediate_size 6 is not divisible by tp 4"},
      {"eh_proj by tp",
       [](ModelSpec& s) {
         s.hidden_size = 12;
         s.num_attention_heads = 8;
         s.kv_channels = 4;
         s.mtp_num_layers = 1;
       },
       testing::config_of(8, 8, 1, 1, 8),
       "hidden_size 12 is not divisible by tp 8 (the MTP eh_proj is column-parallel with "
       "hidden_size rows)"},
      {"ep without experts", [](ModelSpec&) {}, testing::config_of(2, 1, 1, 2, 1),
       "ep 2 needs num_experts > 0 (expert parallelism needs MoE layers)"},
      {"experts by ep", [](ModelSpec& s) { s.num_experts = 6; }, testing::config_of(4, 1, 1, 4, 1),
       "num_experts 6 is not divisible by ep 4"},
      {"moe ffn by etp",
       [](ModelSpec& s) {
         s.num_experts = 16;
         s.moe_ffn_hidden_size = 24;
         s.add_bias_linear = false;
       },
       testing::config_of(16, 1, 1, 1, 16), "moe_ffn_hidden_size 24 is not divisible by etp 16"},
      {"more stages than layers", [](ModelSpec&) {}, testing::config_of(4, 1, 4, 1, 1),
       "pp 4 is larger than num_layers 2: every pipeline stage needs a layer"},
      {"layers by pp*vpp", [](ModelSpec& s) { s.num_layers = 3; }, testing::config_of(2, 1, 2, 1, 1, 2),
       "num_layers 3 is not divisible by pp*vpp = 4"},
      {"uneven needs pp", [](ModelSpec& s) { s.first_stage_layers = 1; }, one,
       "decoder_first_pipeline_num_layers needs pp > 1 (uneven stages)"},
      {"uneven too many",
       [](ModelSpec& s) {
         s.first_stage_layers = 2;
         s.last_stage_layers = 2;
       },
       testing::config_of(2, 1, 2, 1, 1),
       "num_layers 2 minus the first/last stage layers (2 + 2) is negative"},
      {"uneven no middle",
       [](ModelSpec& s) {
         s.num_layers = 5;
         s.first_stage_layers = 2;
         s.last_stage_layers = 2;
       },
       testing::config_of(2, 1, 2, 1, 1),
       "num_layers 5 minus the first/last stage layers (2 + 2) leaves 1 layers for no middle "
       "stage (pp 2)"},
      {"uneven middle divisible",
       [](ModelSpec& s) {
         s.num_layers = 6;
         s.first_stage_layers = 1;
       },
       testing::config_of(3, 1, 3, 1, 1),
       "num_layers 6 minus the first/last stage layers (1 + 0) = 5 is not divisible by the 2 "
       "middle stages"},
      {"uneven empty middle",
       [](ModelSpec& s) {
         s.num_layers = 3;
         s.first_stage_layers = 1;
         s.last_stage_layers = 1;
       },
       testing::config_of(4, 1, 4, 1, 1),
       "num_layers 3 minus the first/last stage layers (1 + 1) = 1 leaves a middle stage without "
       "layers (2 middle stages)"},
      {"uneven first by vpp",
       [](ModelSpec& s) {
         s.num_layers = 5;
         s.first_stage_layers = 1;
       },
       testing::config_of(2, 1, 2, 1, 1, 2), "decoder_first_pipeline_num_layers 1 is not divisible by vpp 2"},
  };
  for (const Rule& rule : rules) {
    ModelSpec spec;
    rule.edit(spec);
    EXPECT_EQ(check_model(spec, rule.config), rule.message) << rule.name;
  }
}

TEST(ModelSpec, ExpertBiasesWithExpertTpAreMegatronsRuleNotTheModels) {
  ModelSpec s;
  s.num_experts = 2;
  const ParallelConfig etp2 = testing::config_of(2, 2, 1, 1, 2);
  EXPECT_EQ(check_model(s, etp2), std::nullopt) << "DeepSpeed's MoE layer takes it";
  EXPECT_EQ(check_megatron_expert_bias(s, etp2),
            "expert biases (add_bias_linear with num_experts 2) need etp 1, got etp 2 (Megatron-LM: bias in MoE "
            "is only supported when ETP==1)");
  EXPECT_EQ(check_megatron_expert_bias(s, testing::config_of(2, 2, 1, 1, 1)), std::nullopt);
  s.add_bias_linear = false;
  EXPECT_EQ(check_megatron_expert_bias(s, etp2), std::nullopt);
}

TEST(ModelSpec, EveryCustomRuleHasItsMessage) {
  const ParallelConfig one{};
  auto with = [](std::function<void(CustomParam&)> edit, ParamClass c = ParamClass::column,
                 std::vector<std::int64_t> shape = {8, 4}) {
    CustomParam p = custom("w", c, std::move(shape));
    edit(p);
    return custom_spec({p}, 4);
  };
  const std::vector<std::tuple<std::string, ModelSpec, ParallelConfig, std::string>> rules = {
      {"no params", custom_spec({}), one, "custom layout has no params"},
      {"gpt with params",
       [] {
         ModelSpec s;
         s.params.push_back(custom("w", ParamClass::row, {2, 2}));
         return s;
       }(),
       one, "params is only for a custom layout (kind gpt builds its own parameters)"},
      {"empty name", with([](CustomParam& p) { p.name = ""; }), one, "params[0]: name is empty"},
      {"bad name", with([](CustomParam& p) { p.name = "a b"; }), one,
       "params[0] 'a b': name may use letters, digits and . _ - / : only"},
      {"repeated name",
       custom_spec({custom("w", ParamClass::row, {2, 2}), custom("w", ParamClass::row, {2, 2})}),
       one, "params[1] 'w': name repeats an earlier param"},
      {"no dims", with([](CustomParam& p) { p.shape = {}; }), one,
       "params[0] 'w': shape has 0 dims (1 to 4 allowed)"},
      {"five dims", with([](CustomParam& p) { p.shape = {1, 1, 1, 1, 1}; }), one,
       "params[0] 'w': shape has 5 dims (1 to 4 allowed)"},
      {"zero dim", with([](CustomParam& p) { p.shape = {8, 0}; }), one,
       "params[0] 'w': shape [8, 0] has a dim outside 1..1099511627776"},
      {"negative dim", with([](CustomParam& p) { p.shape = {-2}; }), one,
       "params[0] 'w': shape [-2] has a dim outside 1..1099511627776"},
      {"row needs two dims", with([](CustomParam&) {}, ParamClass::row, {8}), one,
       "params[0] 'w': class row splits dim 1, but shape [8] has 1 dim"},
      {"negative stage", with([](CustomParam& p) { p.stage = -1; }), one,
       "params[0] 'w': stage must be at least 0 (got -1)"},
      {"expert out of range", with([](CustomParam& p) { p.expert = 4; }, ParamClass::expert_row),
       one, "params[0] 'w': expert 4 is out of range (num_experts 4)"},
      {"expert missing", with([](CustomParam&) {}, ParamClass::expert_row_bias, {8}), one,
       "params[0] 'w': expert -1 is out of range (num_experts 4)"},
      {"expert on a dense class", with([](CustomParam& p) { p.expert = 1; }), one,
       "params[0] 'w': expert 1 is only for expert classes (class column)"},
      {"tied not vocab", with([](CustomParam& p) { p.tied = true; }), one,
       "params[0] 'w': tied needs class vocab on stage 0, chunk 0 (the word embedding the output "
       "layer shares)"},
      {"two tied",
       [] {
         CustomParam a = custom("a", ParamClass::vocab, {4, 4}), b = a;
         a.tied = b.tied = true;
         b.name = "b";
         return custom_spec({a, b});
       }(),
       one, "params[1] 'b': only one param may be tied to the output layer"},
      {"too many elements",
       custom_spec({custom("a", ParamClass::replicated, {1 << 20, 1 << 20}),
                    custom("b", ParamClass::replicated, {4})}),
       one, "the model has 1099511627780 elements; tally supports at most 1099511627776"},
      {"one tensor too large", custom_spec({custom("a", ParamClass::replicated, {1 << 30, 1 << 20})}),
       one, "a has more than 1099511627776 elements, more than tally supports in one model"},
      {"stage out of range", with([](CustomParam& p) { p.stage = 2; }), testing::config_of(2, 1, 2, 1, 1),
       "params[0] 'w': stage 2 is out of range (pp 2)"},
      {"chunk out of range", with([](CustomParam& p) { p.chunk = 2; }), testing::config_of(2, 1, 2, 1, 1, 2),
       "params[0] 'w': chunk 2 is out of range (vpp 2)"},
      {"sharded dim by tp", with([](CustomParam& p) { p.shape = {6, 4}; }), testing::config_of(4, 4, 1, 1, 4),
       "params[0] 'w': dim 0 of shape [6, 4] (6) is not divisible by tp 4"},
      {"expert dim by etp",
       with([](CustomParam& p) { p.expert = 0; }, ParamClass::expert_row, {4, 6}),
       testing::config_of(4, 1, 1, 1, 4), "params[0] 'w': dim 1 of shape [4, 6] (6) is not divisible by etp 4"},
      {"experts by ep", with([](CustomParam&) {}), testing::config_of(8, 1, 1, 8, 1),
       "num_experts 4 is not divisible by ep 8"},
      {"ep without experts", custom_spec({custom("w", ParamClass::row, {2, 2})}),
       testing::config_of(2, 1, 1, 2, 1), "ep 2 needs num_experts > 0 (expert parallelism needs experts)"},
  };
  for (const auto& [name, spec, config, message] : rules)
    EXPECT_EQ(check_model(spec, config), message) << name;
}

RC_GTEST_PROP(ModelSpec, GeneratedCasesAreValid, ()) {
  const auto [config, spec] = *testing::valid_case(4);
  RC_ASSERT(check_config(config) == std::nullopt);
  const std::optional<std::string> error = check_model(spec, config);
  RC_ASSERT(error == std::nullopt);
}

}  // namespace
}  // namespace tally::topologies
