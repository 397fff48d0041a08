#include "topologies/logical_model.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "tests/support/model_gen.h"
#include "topologies/detail/model_params.h"
#include "tests/support/configs.h"

namespace tally::topologies {
namespace {

const LogicalParam* find(const LogicalModel& model, std::string_view name) {
  for (const LogicalParam& p : model.params())
    if (p.name == name) return &p;
  return nullptr;
}

// N of a dense GPT with LayerNorm, linear biases, a learned position table and tied
// embeddings, written out by hand.
TEST(LogicalModel, DenseGptElementCountMatchesTheFormula) {
  ModelSpec s;
  s.num_layers = 3;
  s.hidden_size = 12;
  s.num_attention_heads = 6;
  s.num_query_groups = 2;
  s.kv_channels = 4;
  s.ffn_hidden_size = 20;
  s.vocab_size = 50;
  s.max_position_embeddings = 7;
  const std::int64_t h = 12, heads = 6, g = 2, kv = 4, f = 20, V = 50, P = 7, L = 3;
  const std::int64_t qkv_rows = (heads + 2 * g) * kv;
  const std::int64_t layer = 2 * h                    // input_layernorm weight + bias
                             + h * heads * kv + h     // linear_proj weight + bias
                             + qkv_rows * h + qkv_rows  // linear_qkv weight + bias
                             + 2 * h                  // pre_mlp_layernorm
                             + f * h + f              // linear_fc1
                             + h * f + h;             // linear_fc2
  const std::int64_t expected = V * h + P * h + L * layer + 2 * h;  // + final_layernorm
  const LogicalModel model(s);
  EXPECT_EQ(model.total_elements(), expected);
  EXPECT_EQ(model.size(), 2 + 3 * 12 + 2);

  // Untied: the output layer adds V * h.
  s.untie_embeddings_and_output_weights = true;
  EXPECT_EQ(LogicalModel(s).total_elements(), expected + V * h);
}

TEST(LogicalModel, MoeGptElementCountMatchesTheFormula) {
  ModelSpec s;
  s.num_layers = 2;
  s.hidden_size = 8;
  s.num_attention_heads = 2;  // kv_channels 4
  s.vocab_size = 16;
  s.normalization = Normalization::rms_norm;
  s.position_embedding = PositionEmbedding::rope;
  s.add_bias_linear = false;
  s.num_experts = 4;
  s.moe_ffn_hidden_size = 6;
  s.swiglu = true;
  s.moe_shared_expert_intermediate_size = 10;
  s.moe_shared_expert_gate = true;
  s.qk_layernorm = true;
  s.softmax_type = SoftmaxType::learnable;
  const std::int64_t h = 8, heads = 2, kv = 4, E = 4, f = 6, S = 10, V = 16;
  const std::int64_t attention = h                          // input_layernorm (RMSNorm)
                                 + heads                    // softmax_offset
                                 + h * heads * kv           // linear_proj
                                 + 3 * heads * kv * h       // linear_qkv (no GQA)
                                 + 2 * kv                   // q/k layernorm
                                 + h;                       // pre_mlp_layernorm
  const std::int64_t moe = E * h                            // router
                           + E * (2 * f * h + h * f)        // swiglu experts
                           + 2 * S * h + h * S + h;         // shared expert + gate
  const std::int64_t expected = V * h + 2 * (attention + moe) + h;
  EXPECT_EQ(LogicalModel(s).total_elements(), expected);
}

// Multi-latent attention as megatron-core's Transformer Engine spec builds it: the down projections
// whole on every TP rank, the up projections split over TP with their norms fused in, no linear_qkv.
TEST(LogicalModel, MultiLatentAttentionElementCountAndClassesMatchTheSpec) {
  ModelSpec s;
  s.num_layers = 1;
  s.hidden_size = 8;
  s.num_attention_heads = 2;
  s.vocab_size = 16;
  s.ffn_hidden_size = 4;
  s.normalization = Normalization::layer_norm;
  s.position_embedding = PositionEmbedding::rope;
  s.multi_latent_attention = true;
  s.qk_layernorm = true;
  s.q_lora_rank = 6;
  s.kv_lora_rank = 4;
  s.qk_head_dim = 3;
  s.qk_pos_emb_head_dim = 2;
  s.v_head_dim = 5;
  const std::int64_t h = 8, heads = 2, q = 6, kv = 4, qk = 3, rope = 2, v = 5, f = 4, V = 16;
  const std::int64_t attention = 2 * h                          // input_layernorm (LayerNorm)
                                 + h * heads * v + h            // linear_proj and its bias
                                 + q * h                        // linear_q_down_proj
                                 + 2 * q + heads * (qk + rope) * q  // linear_q_up_proj: norm, weight
                                 + (kv + rope) * h              // linear_kv_down_proj
                                 + 2 * kv + heads * (qk + v) * kv   // linear_kv_up_proj: norm, weight
                                 + 2 * h;                       // pre_mlp_layernorm
  const std::int64_t mlp = f * h + f + h * f + h;
  const LogicalModel model(s, testing::config_of(2, 2, 1, 1, 1));
  EXPECT_EQ(model.total_elements(), V * h + attention + mlp + 2 * h);
  EXPECT_EQ(find(model, "decoder.layers.0.self_attention.linear_qkv.weight"), nullptr);
  const auto class_of = [&](const char* name) {
    const LogicalParam* p = find(model, std::string("decoder.layers.0.self_attention.") + name);
    EXPECT_NE(p, nullptr) << name;
    return p ? p->param_class : ParamClass::replicated;
  };
  EXPECT_EQ(class_of("linear_q_down_proj.weight"), ParamClass::replicated);
  EXPECT_EQ(class_of("linear_kv_down_proj.weight"), ParamClass::replicated);
  EXPECT_EQ(class_of("linear_q_up_proj.layer_norm_weight"), ParamClass::replicated);
  EXPECT_EQ(class_of("linear_kv_up_proj.layer_norm_bias"), ParamClass::replicated);
  EXPECT_EQ(class_of("linear_q_up_proj.weight"), ParamClass::column);
  EXPECT_EQ(class_of("linear_kv_up_proj.weight"), ParamClass::column);
  EXPECT_EQ(class_of("linear_proj.weight"), ParamClass::row);
  // Without a query rank one column-parallel projection takes the query.
  s.q_lora_rank.reset();
  const LogicalModel direct(s, testing::config_of(2, 2, 1, 1, 1));
  ASSERT_NE(find(direct, "decoder.layers.0.self_attention.linear_q_proj.weight"), nullptr);
  EXPECT_EQ(find(direct, "decoder.layers.0.self_attention.linear_q_proj.weight")->param_class, ParamClass::column);
  EXPECT_EQ(find(direct, "decoder.layers.0.self_attention.linear_q_down_proj.weight"), nullptr);
}

TEST(LogicalModel, NamesUseGlobalLayerAndExpertIds) {
  ModelSpec s;
  s.num_layers = 4;
  s.num_experts = 8;
  s.mtp_num_layers = 1;
  const LogicalModel model(s, testing::config_of(16, 1, 2, 4, 1));
  EXPECT_EQ(model.param(0).name, "embedding.word_embeddings.weight");
  EXPECT_EQ(model.param(0).param_class, ParamClass::vocab);
  EXPECT_TRUE(model.param(0).tied);
  EXPECT_EQ(model.param(1).name, "embedding.position_embeddings.weight");
  const LogicalParam* bias = find(model, "decoder.layers.3.mlp.experts.local_experts.5.linear_fc2.bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->param_class, ParamClass::expert_row_bias);
  EXPECT_EQ(bias->expert, 5);
  EXPECT_EQ(bias->layer, 3);
  EXPECT_EQ(bias->stage, 1);
  // On its rank (EP rank 2 of 4 holds experts 4 and 5; stage 1 starts at layer 2).
  EXPECT_EQ(model.local_name(bias->id, 1), "decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.bias");
  EXPECT_NE(find(model, "decoder.final_layernorm.weight"), nullptr);
  const LogicalParam* eh = find(model, "mtp.layers.0.eh_proj.weight");
  ASSERT_NE(eh, nullptr);
  EXPECT_EQ(eh->param_class, ParamClass::column);
  EXPECT_EQ(eh->shape, (Shape{{16, 32}, 2}));
  EXPECT_EQ(eh->stage, 1);
  EXPECT_EQ(eh->grad_norm_group, GradNormGroup::main);  // not detached
  EXPECT_NE(find(model, "mtp.layers.0.transformer_layer.mlp.experts.local_experts.7.linear_fc1.weight"), nullptr);
  EXPECT_EQ(find(model, "output_layer.weight"), nullptr);  // tied
  for (int i = 0; i < model.size(); ++i) {
    EXPECT_EQ(model.param(i).id, i);
    EXPECT_EQ(model.param(i).numel, model.param(i).shape.numel());
  }
}

// Megatron-LM's get_transformer_layer_offset: chunk c on stage s starts at
// c*L/vpp + s*L/(pp*vpp).
TEST(LogicalModel, VirtualChunksInterleaveLayers) {
  ModelSpec s;
  s.num_layers = 8;
  const ParallelConfig config = testing::config_of(2, 1, 2, 1, 1, 2);
  const LogicalModel model(s, config);
  const std::array<std::array<int, 2>, 8> home = {{{0, 0}, {0, 0}, {1, 0}, {1, 0},
                                                   {0, 1}, {0, 1}, {1, 1}, {1, 1}}};
  for (int layer = 0; layer < 8; ++layer) {
    const LogicalParam* p =
        find(model, "decoder.layers." + std::to_string(layer) + ".input_layernorm.weight");
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->stage, home[layer][0]) << layer;
    EXPECT_EQ(p->chunk, home[layer][1]) << layer;
    EXPECT_EQ(model.local_name(p->id, -1), "decoder.layers." + std::to_string(layer % 2) +
                                               ".input_layernorm.weight");
  }
  EXPECT_EQ(model.param(0).stage, 0);
  EXPECT_EQ(model.param(0).chunk, 0);
  const LogicalParam* final_norm = find(model, "decoder.final_layernorm.weight");
  EXPECT_EQ(final_norm->stage, 1);
  EXPECT_EQ(final_norm->chunk, 1);
}

TEST(LogicalModel, UnevenFirstAndLastStages) {
  ModelSpec s;
  s.num_layers = 10;
  s.first_stage_layers = 2;
  s.last_stage_layers = 4;
  // pp 3, vpp 2: per chunk 1 (first), 2 (middle), 2 (last) layers; 5 layers per chunk round.
  const std::array<LayerRange, 6> expected = {{{0, 1}, {1, 2}, {3, 2}, {5, 1}, {6, 2}, {8, 2}}};
  for (int chunk = 0; chunk < 2; ++chunk)
    for (int stage = 0; stage < 3; ++stage) {
      const LayerRange r = layers_of(s, 3, 2, stage, chunk);
      EXPECT_EQ(r.first, expected[chunk * 3 + stage].first) << stage << "," << chunk;
      EXPECT_EQ(r.count, expected[chunk * 3 + stage].count) << stage << "," << chunk;
    }
  // Without vpp: 2 | 4 | 4.
  EXPECT_EQ(layers_of(s, 3, 1, 1, 0).first, 2);
  EXPECT_EQ(layers_of(s, 3, 1, 2, 0).first, 6);
  EXPECT_EQ(layers_of(s, 3, 1, 2, 0).count, 4);
  // Only a first stage given: the rest split evenly.
  s.last_stage_layers.reset();
  s.first_stage_layers = 1;
  s.num_layers = 7;
  EXPECT_EQ(layers_of(s, 4, 1, 1, 0).first, 1);
  EXPECT_EQ(layers_of(s, 4, 1, 3, 0).first, 5);
  EXPECT_EQ(layers_of(s, 4, 1, 3, 0).count, 2);
}

TEST(LogicalModel, MtpGroupWhenHeadsAreDetached) {
  ModelSpec s;
  s.mtp_num_layers = 2;
  s.mtp_detach_heads = true;
  const LogicalModel model(s);
  std::int64_t mtp = 0;
  for (const LogicalParam& p : model.params()) {
    EXPECT_EQ(p.grad_norm_group == GradNormGroup::mtp, p.name.starts_with("mtp.")) << p.name;
    if (p.grad_norm_group == GradNormGroup::mtp) mtp += p.numel;
  }
  EXPECT_GT(mtp, 0);
  EXPECT_EQ(model.total_elements(GradNormGroup::mtp), mtp);
  EXPECT_EQ(model.total_elements(GradNormGroup::main) + mtp, model.total_elements());
}

TEST(LogicalModel, CustomLayoutKeepsItsOrderAndPlacement) {
  ModelSpec s;
  s.kind = ModelKind::custom;
  s.num_experts = 4;
  s.params = {
      {"emb", ParamClass::vocab, {8, 4}, 0, 0, -1, false, true},
      {"bias", ParamClass::expert_row_bias, {8}, 1, 0, 3, false, false},
      {"norm", ParamClass::replicated, {4}, 1, 0, -1, true, false},
  };
  const LogicalModel model(s, testing::config_of(4, 2, 2, 1, 2));
  ASSERT_EQ(model.size(), 3);
  EXPECT_EQ(model.param(1).name, "bias");
  EXPECT_EQ(model.param(1).stage, 1);
  EXPECT_EQ(model.param(1).expert, 3);
  EXPECT_EQ(model.param(2).grad_norm_group, GradNormGroup::mtp);
  EXPECT_EQ(model.total_elements(), 32 + 8 + 4);
  EXPECT_EQ(model.tied_embedding(), 0);
  EXPECT_EQ(model.last_stage_copy(), SharedCopy::output_layer);
  EXPECT_EQ(model.local_name(1, 0), "bias");
}

// The parameter list, and so N, depends on the spec only: the configuration moves params
// between stages, never changes them.
RC_GTEST_PROP(LogicalModel, ParamsDoNotDependOnTheTopology, ()) {
  const auto [config, spec] = *testing::valid_case(3);
  const LogicalModel model(spec, config);
  ModelSpec unplaced = spec;  // the same model on one rank
  unplaced.first_stage_layers.reset();
  unplaced.last_stage_layers.reset();
  for (CustomParam& p : unplaced.params) p.stage = p.chunk = 0;
  const LogicalModel single(unplaced);
  RC_ASSERT(model.size() == single.size());
  RC_ASSERT(model.total_elements() == single.total_elements());
  std::int64_t sum = 0;
  for (int i = 0; i < model.size(); ++i) {
    const LogicalParam& a = model.param(i);
    const LogicalParam& b = single.param(i);
    RC_ASSERT(a.name == b.name);
    RC_ASSERT(a.param_class == b.param_class);
    RC_ASSERT(a.shape == b.shape);
    RC_ASSERT(a.expert == b.expert);
    RC_ASSERT(a.grad_norm_group == b.grad_norm_group);
    sum += a.numel;
  }
  RC_ASSERT(sum == model.total_elements());
}

RC_GTEST_PROP(LogicalModel, ParamCountFormulaMatchesTheWalk, ()) {
  const auto [config, spec] = *testing::valid_case(3);
  RC_ASSERT(detail::param_count(spec) == LogicalModel(spec, config).size());
}

RC_GTEST_PROP(LogicalModel, LayersFillStagesInOrder, ()) {
  const topologies::ParallelConfig config = *testing::valid_config_with_vpp(3);
  const ModelSpec spec = *testing::gpt_spec_for(config);
  // Every decoder layer in exactly one (stage, chunk); chunk rounds in order.
  int next = 0;
  for (int chunk = 0; chunk < config.vpp; ++chunk)
    for (int stage = 0; stage < config.pp; ++stage) {
      const LayerRange r = layers_of(spec, config.pp, config.vpp, stage, chunk);
      RC_ASSERT(r.first == next);
      RC_ASSERT(r.count >= 1);
      next += r.count;
    }
  RC_ASSERT(next == spec.num_layers);
}

}  // namespace
}  // namespace tally::topologies
