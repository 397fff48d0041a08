#include "casefile/model_json.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "tests/support/model_gen.h"

namespace tally::casefile {
namespace {

using topologies::ModelSpec;

RC_GTEST_PROP(ModelJson, RoundTrips, ()) {
  const auto [config, spec] = *testing::valid_case(3);
  const nlohmann::ordered_json j = model_spec_to_json(spec);
  RC_ASSERT(model_spec_from_json(nlohmann::json::parse(j.dump())) == spec);
  RC_ASSERT(model_spec_from_text(j.dump(2), "case.json") == spec);
}

TEST(ModelJson, EmptyObjectIsTheDefaultGpt) {
  EXPECT_EQ(model_spec_from_text("{}", "m.json"), ModelSpec{});
  EXPECT_EQ(model_spec_from_text(R"({"kind": "gpt"})", "m.json"), ModelSpec{});
}

TEST(ModelJson, ReadsMegatronNames) {
  const ModelSpec s = model_spec_from_text(R"({
    "num_layers": 4, "hidden_size": 32, "num_attention_heads": 8, "num_query_groups": 2,
    "kv_channels": 4, "ffn_hidden_size": 48, "vocab_size": 128, "add_bias_linear": false,
    "normalization": "RMSNorm", "qk_layernorm": true, "position_embedding_type": "rope",
    "softmax_type": "learnable", "untie_embeddings_and_output_weights": true, "swiglu": true,
    "num_experts": 8, "moe_ffn_hidden_size": 16, "moe_shared_expert_intermediate_size": 32,
    "moe_shared_expert_gate": true, "moe_layer_freq": 2, "mtp_num_layers": 1,
    "mtp_detach_heads": true, "decoder_first_pipeline_num_layers": 1,
    "decoder_last_pipeline_num_layers": 3})",
                                           "m.json");
  EXPECT_EQ(s.num_layers, 4);
  EXPECT_EQ(s.num_query_groups, 2);
  EXPECT_FALSE(s.add_bias_linear);
  EXPECT_EQ(s.normalization, topologies::Normalization::rms_norm);
  EXPECT_EQ(s.position_embedding, topologies::PositionEmbedding::rope);
  EXPECT_EQ(s.softmax_type, topologies::SoftmaxType::learnable);
  EXPECT_EQ(s.moe_layer_freq, 2);
  EXPECT_EQ(s.first_stage_layers, 1);
  EXPECT_EQ(s.last_stage_layers, 3);
  EXPECT_EQ(topologies::check_model(s), std::nullopt);
}

TEST(ModelJson, ReadsACustomLayout) {
  const ModelSpec s = model_spec_from_text(R"({"kind": "custom", "num_experts": 2, "params": [
    {"name": "emb", "class": "vocab", "shape": [8, 4], "tied": true},
    {"name": "b", "class": "expert-row-bias", "shape": [4], "stage": 1, "expert": 1, "mtp": true}]})",
                                           "m.json");
  ASSERT_EQ(s.params.size(), 2u);
  EXPECT_TRUE(s.params[0].tied);
  EXPECT_EQ(s.params[1].param_class, topologies::ParamClass::expert_row_bias);
  EXPECT_EQ(s.params[1].stage, 1);
  EXPECT_EQ(s.params[1].expert, 1);
  EXPECT_TRUE(s.params[1].mtp);
}

TEST(ModelJson, StrictReadingNamesTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"num_layers": -3})", "model.num_layers: expected a positive integer, got -3"},
      {R"({"num_layers": 0})", "model.num_layers: expected a positive integer, got 0"},
      {R"({"num_layers": 2.5})", "model.num_layers: expected a positive integer, got 2.5"},
      {R"({"num_layers": "4"})", "model.num_layers: expected a positive integer, got \"4\""},
      {R"({"hidden_size": 99999999999999999999})",
       "model.hidden_size: expected a positive integer, got 1e+20"},
      {R"({"hidden_size": 4294967296})",
       "model.hidden_size: expected a positive integer at most 1073741824, got 4294967296"},
      {R"({"num_experts": -1})", "model.num_experts: expected an integer >= 0, got -1"},
      {R"({"add_bias_linear": 1})", "model.add_bias_linear: expected true or false, got 1"},
      {R"({"normalization": "layernorm"})",
       "model.normalization: expected one of LayerNorm, RMSNorm, got \"layernorm\""},
      {R"({"kind": "bert"})", "model.kind: expected one of gpt, custom, got \"bert\""},
      {R"({"num_layer": 2})", "model.num_layer: unknown key for a gpt model"},
      {R"({"kv_lora_rank": 4})",
       "model.kv_lora_rank: is a size of multi-latent attention: set multi_latent_attention true, or leave it out"},
      {R"({"multi_latent_attention": true, "q_lora_rank": 0})",
       "model.q_lora_rank: expected a positive integer, got 0"},
      {R"({"kind": "custom", "hidden_size": 2, "params": []})",
       "model.hidden_size: unknown key for a custom layout"},
      {R"({"kind": "custom"})", "model: missing key 'params' for a custom layout"},
      {R"({"kind": "custom", "params": {}})", "model.params: expected an array, got an object"},
      {R"({"kind": "custom", "params": [{"name": "w", "shape": [2]}]})",
       "model.params[0]: missing key 'class' for a custom param"},
      {R"({"kind": "custom", "params": [{"name": "w", "class": "colum", "shape": [2]}]})",
       "model.params[0].class: expected a class (column, column-bias, row, replicated, vocab, "
       "head-sharded, expert-column, expert-column-bias, expert-row, expert-row-bias), got "
       "\"colum\""},
      {R"({"kind": "custom", "params": [{"name": "w", "class": "row", "shape": [2, -1]}]})",
       "model.params[0].shape[1]: expected a positive integer, got -1"},
      {R"({"kind": "custom", "params": [{"name": "w", "class": "row", "shape": []}]})",
       "model.params[0].shape: expected an array of 1 to 4 positive integers, got []"},
      {R"({"kind": "custom", "params": [{"name": "w", "class": "row", "shape": [2], "stage": -1}]})",
       "model.params[0].stage: expected an integer >= 0, got -1"},
      {R"({"kind": "custom", "params": [{"name": "w", "class": "row", "shape": [2], "x": 1}]})",
       "model.params[0].x: unknown key for a custom param"},
      {R"([1, 2])", "model: expected an object, got an array"},
      {R"({"num_layers": 2, "num_layers": 3})", "m.json: key 'num_layers' appears twice in one object"},
  };
  for (const auto& [text, message] : cases) {
    try {
      model_spec_from_text(text, "m.json");
      ADD_FAILURE() << "accepted " << text;
    } catch (const ModelJsonError& error) {
      EXPECT_EQ(error.what(), message) << text;
    }
  }
}

TEST(ModelJson, MalformedTextIsOneLine) {
  try {
    model_spec_from_text("{\n\"num_layers\": \n", "m.json");
    FAIL();
  } catch (const ModelJsonError& error) {
    const std::string what = error.what();
    EXPECT_TRUE(what.starts_with("m.json: invalid JSON: ")) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
  EXPECT_THROW(load_model_spec("/nonexistent/model.json"), ModelJsonError);
}

TEST(ModelJson, HostileTextIsAnErrorNotACrash) {
  // Found by libFuzzer (tests/casefile/case_reader_crashes/model-number-overflow-5e555): nlohmann
  // reports a literal beyond double as out_of_range, not parse_error, and it escaped.
  try {
    model_spec_from_text(R"({"num_layers": 1e400})", "m.json");
    ADD_FAILURE() << "no error";
  } catch (const ModelJsonError& error) {
    EXPECT_EQ(std::string(error.what()).rfind("m.json: invalid JSON: ", 0), 0u) << error.what();
  }
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  try {
    model_spec_from_text(deep, "m.json");
    ADD_FAILURE() << "no error";
  } catch (const ModelJsonError& error) {
    EXPECT_STREQ(error.what(), "m.json: nested deeper than 64 levels");
  }
}

}  // namespace
}  // namespace tally::casefile
