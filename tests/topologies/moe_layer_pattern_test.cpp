#include "topologies/moe_layer_pattern.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "topologies/logical_model.h"
#include "topologies/model_spec.h"

namespace tally::topologies {
namespace {

std::vector<bool> layers(std::initializer_list<int> values) {
  std::vector<bool> out;
  for (int v : values) out.push_back(v == 1);
  return out;
}

std::string error_of(std::string_view text) {
  try {
    parse_moe_layer_pattern(text);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

// The forms Megatron-LM's --moe-layer-freq help gives (megatron/training/arguments.py).
TEST(MoeLayerPattern, ReadsMegatronLmsExpressions) {
  EXPECT_EQ(parse_moe_layer_pattern("([0]+[1]*3)"), layers({0, 1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_pattern("([1]*3+[0]*1)*2"), layers({1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(parse_moe_layer_pattern("[1, 0, 1]"), layers({1, 0, 1}));
  EXPECT_EQ(parse_moe_layer_pattern("2*[0]+[1]"), layers({0, 0, 1}));
  EXPECT_EQ(parse_moe_layer_pattern(" ( [0]*1 + [1]*1 ) "), layers({0, 1}));
}

TEST(MoeLayerPattern, WritesTheRunLengthFormItReadsBack) {
  const std::vector<bool> deepseek = parse_moe_layer_pattern("[0]*3+[1]*58");
  EXPECT_EQ(moe_layer_pattern_text(deepseek), "([0]*3+[1]*58)");
  EXPECT_EQ(parse_moe_layer_pattern(moe_layer_pattern_text(deepseek)), deepseek);
  EXPECT_EQ(moe_layer_pattern_text(layers({1, 0, 1})), "([1]*1+[0]*1+[1]*1)");
}

TEST(MoeLayerPattern, NamesTheTextThePositionAndTheRule) {
  EXPECT_NE(error_of("[2]").find("moe_layer_freq '[2]' at position 2: a layer is 0 (dense) or 1 (MoE), not 2"),
            std::string::npos)
      << error_of("[2]");
  EXPECT_NE(error_of("[1]*[1]").find("a list times a list"), std::string::npos);
  EXPECT_NE(error_of("([1]").find("expected ')'"), std::string::npos);
  EXPECT_NE(error_of("[1]]").find("unexpected ']'"), std::string::npos);
  EXPECT_NE(error_of("3").find("a number, not a list"), std::string::npos);
  EXPECT_NE(error_of("[]").find("no layers"), std::string::npos);
  EXPECT_NE(error_of("__import__('os')").find("expected a number, a list or '('"), std::string::npos);
}

TEST(MoeLayerPattern, AHostilePatternIsRefusedBeforeItIsExpanded) {
  EXPECT_NE(error_of("[1]*1000000000").find("larger than 65536"), std::string::npos);
  EXPECT_NE(error_of("([1]*65536)*2").find("more than 65536 layers"), std::string::npos);
  EXPECT_NE(error_of("[1]*65536+[1]").find("more than 65536 layers"), std::string::npos);
}

ModelSpec first_dense(int dense, int total) {
  ModelSpec s;
  s.num_layers = total;
  s.num_experts = 4;
  s.moe_layer_pattern.assign(total, true);
  for (int i = 0; i < dense; ++i) s.moe_layer_pattern[i] = false;
  return s;
}

TEST(MoeLayerPattern, DecidesWhichLayersHaveExperts) {
  const ModelSpec s = first_dense(1, 3);
  ASSERT_EQ(check_model(s), std::nullopt);
  EXPECT_FALSE(is_moe_layer(s, 0));
  EXPECT_TRUE(is_moe_layer(s, 1));
  EXPECT_EQ(moe_layer_count(s), 2);
  EXPECT_EQ(moe_layer_freq_text(s), "([0]*1+[1]*2)");
  const LogicalModel model(s);
  int routers = 0, dense_fc1 = 0;
  for (const LogicalParam& p : model.params()) {
    routers += p.name.ends_with("mlp.router.weight") ? 1 : 0;
    dense_fc1 += p.name == "decoder.layers.0.mlp.linear_fc1.weight" ? 1 : 0;
  }
  EXPECT_EQ(routers, 2);
  EXPECT_EQ(dense_fc1, 1);
  EXPECT_NE(describe(s).find("layers ([0]*1+[1]*2)"), std::string::npos) << describe(s);
}

TEST(MoeLayerPattern, MustHaveOneEntryPerLayerAndExperts) {
  ModelSpec s = first_dense(1, 3);
  s.num_layers = 4;
  EXPECT_EQ(check_model(s), "moe_layer_freq ([0]*1+[1]*2) has 3 layers, num_layers is 4 (Megatron-LM: \"Invalid "
                            "length of moe_layer_pattern\", gpt_layer_specs.py)");
  s = first_dense(1, 3);
  s.moe_layer_freq = 2;
  EXPECT_TRUE(check_model(s)->starts_with("moe_layer_freq 2 and a layer pattern"));
  s = first_dense(1, 3);
  s.num_experts = 0;
  EXPECT_EQ(check_model(s), "moe_layer_freq ([0]*1+[1]*2) needs num_experts > 0");
}

}  // namespace
}  // namespace tally::topologies
