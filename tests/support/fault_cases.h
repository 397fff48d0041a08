// For every fault of the catalog, a small named case on which it changes the result, and the
// statistic it shows in. Without the fault each case passes; shared by the path, verdict and
// seed-corpus tests.
#pragma once

#include <string>
#include <vector>

#include "gradnorm/path.h"
#include "tests/support/configs.h"
#include "topologies/model_spec.h"
#include "topologies/parallel_config.h"

namespace tally::testing {

struct FaultCase {
  vocab::Fault fault;
  std::string description;
  topologies::ParallelConfig config;
  topologies::ModelSpec model;
  vocab::PathOptions options;  // without the fault
  topologies::ParamClass miscounted_class;  // the class the diagnosis must name (if counting)
  bool counting = true;  // false: the ledger is right and a value or agreement shows it
};

// The founding case of Megatron-LM #6099: one MoE layer, 2 experts, hidden 8, expert biases.
inline topologies::ModelSpec founding_model() {
  topologies::ModelSpec s;
  s.num_layers = 1;
  s.hidden_size = 8;
  s.num_attention_heads = 4;
  s.ffn_hidden_size = 16;
  s.vocab_size = 16;
  s.num_experts = 2;
  s.moe_ffn_hidden_size = 16;
  s.add_bias_linear = true;
  return s;
}

// The founding model without experts.
inline topologies::ModelSpec dense_model(int layers = 1) {
  topologies::ModelSpec s = founding_model();
  s.num_experts = 0;
  s.moe_ffn_hidden_size.reset();
  s.num_layers = layers;
  return s;
}

inline topologies::ModelSpec small_moe(int experts) {
  topologies::ModelSpec s = founding_model();
  s.num_experts = experts;
  return s;
}

inline topologies::ModelSpec custom_model(std::vector<topologies::CustomParam> params,
                                          int experts = 0) {
  topologies::ModelSpec s;
  s.kind = topologies::ModelKind::custom;
  s.num_experts = experts;
  s.params = std::move(params);
  return s;
}

inline topologies::CustomParam custom_param(std::string name, topologies::ParamClass c,
                                            std::vector<std::int64_t> shape, int stage = 0) {
  topologies::CustomParam p;
  p.name = std::move(name);
  p.param_class = c;
  p.shape = std::move(shape);
  p.stage = stage;
  return p;
}

inline vocab::PathOptions ones(vocab::OptimizerModel model) {
  vocab::PathOptions o;
  o.optimizer = model;
  o.gradients.generator.mode = kernels::GradientMode::ones;
  return o;
}

inline std::vector<FaultCase> fault_cases() {
  using vocab::Fault;
  using vocab::OptimizerModel;
  using topologies::ParamClass;
  std::vector<FaultCase> cases;
  auto add = [&](Fault fault, std::string what, topologies::ParallelConfig c,
                 topologies::ModelSpec m, vocab::PathOptions o, ParamClass cls,
                 bool counting = true) {
    cases.push_back({fault, std::move(what), c, std::move(m), std::move(o), cls, counting});
  };
  vocab::PathOptions bias_only = ones(OptimizerModel::layerwise);
  bias_only.gradients.class_mask = vocab::class_bit(ParamClass::expert_row_bias);

  add(Fault::expert_dedup_on_dense_tp, "#6099: layer-wise, TP 2, EP 2, ETP 1, expert FC2 biases",
      config_of(2, 2, 1, 2, 1), founding_model(), bias_only, ParamClass::expert_row_bias);
  add(Fault::allreduce_flag_lost_on_main_params, "#6470: main copies lose allreduce, TP 2, EP 2",
      config_of(2, 2, 1, 2, 1), founding_model(), ones(OptimizerModel::plain),
      ParamClass::expert_row_bias);
  add(Fault::expert_weights_not_tp_marked, "#5916: EP 2, TP 2, ETP 1: experts of EP rank 1 dropped",
      config_of(2, 2, 1, 2, 1), small_moe(2), ones(OptimizerModel::plain), ParamClass::expert_column);
  add(Fault::expert_label_from_ep_only, "#5916 uncommon: EP 1, TP 2, ETP 1: experts labelled dense",
      config_of(2, 2, 1, 1, 1), small_moe(2), ones(OptimizerModel::plain), ParamClass::expert_column);
  add(Fault::expert_stats_over_dense_mp, "#3024: muon, EP 2: expert weights over TP x PP",
      config_of(2, 1, 1, 2, 1), small_moe(2), ones(OptimizerModel::muon), ParamClass::expert_column);
  {
    vocab::PathOptions o = ones(OptimizerModel::plain);
    o.max_norm = 1.0;
    add(Fault::clip_per_child_norm, "#785: EP 2: expert child over TP x PP, clipped alone",
        config_of(2, 1, 1, 2, 1), small_moe(2), o, ParamClass::expert_column);
  }
  {
    topologies::ModelSpec m = dense_model(2);
    add(Fault::tied_copy_not_shared, "PP 2, tied embeddings: the last stage's copy counted",
        config_of(2, 1, 2, 1, 1), m, ones(OptimizerModel::plain), ParamClass::vocab);
  }
  {
    topologies::ModelSpec m = dense_model();
    m.softmax_type = topologies::SoftmaxType::learnable;
    add(Fault::tp_sharded_param_unmarked, "#7452: TP 2, learnable attention sink",
        config_of(2, 2, 1, 1, 2), m, ones(OptimizerModel::plain), ParamClass::head_sharded);
  }
  {
    topologies::ModelSpec m = dense_model();
    add(Fault::replicated_marked_tp, "TE #715: TP 2, replicated norms marked TP",
        config_of(2, 2, 1, 1, 2), m, ones(OptimizerModel::plain), ParamClass::replicated);
    add(Fault::no_dedup_filter, "NeMo-RL #3788: TP 2 without a duplicate filter",
        config_of(2, 2, 1, 1, 2), m, ones(OptimizerModel::plain), ParamClass::replicated);
    add(Fault::tp_marking_unseen_by_filter, "DeepSpeed 0.19.8 unfused optimizer: TP 2, shards dropped on TP rank 1",
        config_of(2, 2, 1, 1, 2), m, ones(OptimizerModel::plain), ParamClass::column);
    vocab::PathOptions normal = ones(OptimizerModel::plain);
    normal.gradients.generator.mode = kernels::GradientMode::normal;
    normal.gradients.generator.seed = 7;
    add(Fault::average_rank_norms, "DeepSpeed #8475: TP 2, random gradients",
        config_of(2, 2, 1, 1, 2), m, normal, ParamClass::column, false);
    m.num_layers = 2;
    add(Fault::missing_pp_reduction, "torchtitan #596: PP 2", config_of(2, 1, 2, 1, 1), m,
        ones(OptimizerModel::plain), ParamClass::column);
    add(Fault::stats_over_replicas, "plain optimizer over the world, DP 2",
        config_of(2, 1, 1, 1, 1), m, ones(OptimizerModel::plain), ParamClass::column);
  }
  add(Fault::expert_norm_dropped, "DeepSpeed #8613: EP 2, the expert norm discarded",
      config_of(2, 1, 1, 2, 1), small_moe(2), ones(OptimizerModel::plain), ParamClass::expert_column);
  add(Fault::missing_ep_reduction, "NeMo-Automodel #3816: EP 2, expert stats not over EP",
      config_of(2, 1, 1, 2, 1), small_moe(2), ones(OptimizerModel::plain), ParamClass::expert_column);
  {
    // 4097 x 4097 zero gradients: more than 2^24, and odd.
    vocab::PathOptions zeros = ones(OptimizerModel::plain);
    zeros.gradients.generator.mode = kernels::GradientMode::zeros;
    add(Fault::zero_count_in_float32, "#4015: 16,785,409 zero gradients",
        config_of(1, 1, 1, 1, 1),
        custom_model({custom_param("big", ParamClass::replicated, {4097, 4097})}), zeros,
        ParamClass::replicated, false);
  }
  add(Fault::empty_rank_skips_collective,
      "#5530: distributed optimizer, DP 2, one element: rank 1 owns only padding",
      config_of(2, 1, 1, 1, 1), custom_model({custom_param("w", ParamClass::replicated, {1})}),
      ones(OptimizerModel::distributed), ParamClass::replicated, false);
  {
    vocab::PathOptions o = ones(OptimizerModel::plain);
    o.gradients.generator.mode = kernels::GradientMode::normal;
    o.gradients.generator.seed = 3;
    add(Fault::inf_norm_combined_by_l2, "chained dense and expert children, EP 2",
        config_of(2, 1, 1, 2, 1), small_moe(2), o, ParamClass::expert_column, false);
  }
  add(Fault::distopt_padding_counted, "distributed optimizer, DP 2, three elements",
      config_of(2, 1, 1, 1, 1), custom_model({custom_param("w", ParamClass::replicated, {3})}),
      ones(OptimizerModel::distributed), ParamClass::replicated, false);
  {
    vocab::PathOptions clipped = ones(OptimizerModel::plain);
    clipped.max_norm = 1.0;
    add(Fault::clip_per_stage_norm, "torchtitan #649 review: PP 2, each stage clipped alone",
        config_of(2, 1, 2, 1, 1), dense_model(2), clipped, ParamClass::column, false);
    add(Fault::clip_per_ep_group_norm, "ColossalAI #2192: EP 2, the clip norm not reduced over EP",
        config_of(2, 1, 1, 2, 1), small_moe(2), clipped, ParamClass::expert_column, false);
  }
  add(Fault::average_local_norms_over_dp,
      "DeepSpeed #8475: EP 2, each rank's norm averaged over data parallel",
      config_of(2, 1, 1, 2, 1), small_moe(2), ones(OptimizerModel::plain), ParamClass::expert_column,
      false);
  add(Fault::expert_label_ignores_gtp,
      "#6080 / megatron-core 0.19.2: EP 1, ETP = TP = 1, EGTP 2: experts labelled dense",
      with_gtp(config_of(2, 1, 1, 1, 1), 1, 2), small_moe(2), ones(OptimizerModel::plain),
      ParamClass::expert_column);
  add(Fault::muon_expert_stats_without_egtp,
      "megatron-core 0.19.2 muon chain: EGTP 2, expert statistics over tp-ep-pp",
      with_gtp(config_of(2, 1, 1, 1, 1), 1, 2), small_moe(2), ones(OptimizerModel::muon),
      ParamClass::expert_column);
  add(Fault::layer_wise_unsharded_at_dp_cp_1,
      "megatron-core 0.19.2 / radixark #82: layer-wise, TP 2, EP 1, ETP 1, DP 1: expert weights owned twice",
      config_of(2, 2, 1, 1, 1), small_moe(2), ones(OptimizerModel::layerwise), ParamClass::expert_column);
  add(Fault::norm_of_scaled_gradients, "DeepSpeed #8588: DP 2, the norm of gradients still times 2^16",
      config_of(2, 1, 1, 1, 1), dense_model(), ones(OptimizerModel::plain), ParamClass::replicated, false);
  // A bucket is padded to lcm(D, 128): 128 elements give each rank 64, and rank 0's 65th is w's.
  add(Fault::distopt_overlapping_shards, "distributed optimizer, DP 2, 128 elements",
      config_of(2, 1, 1, 1, 1), custom_model({custom_param("w", ParamClass::replicated, {128})}),
      ones(OptimizerModel::distributed), ParamClass::replicated);
  // The reduction of gradients that enter before it: the ledger is right, the values show it.
  vocab::PathOptions unreduced = ones(OptimizerModel::plain);
  unreduced.gradients.generator.mode = kernels::GradientMode::dyadic;
  unreduced.gradients.before_reduction = true;
  add(Fault::grads_averaged_twice, "torchtitan #2318: DP 2, the average divided by 2 again",
      config_of(2, 1, 1, 1, 1), dense_model(), unreduced, ParamClass::replicated, false);
  add(Fault::grads_not_averaged, "DP 2, the shares summed without 1/2", config_of(2, 1, 1, 1, 1), dense_model(),
      unreduced, ParamClass::replicated, false);
  add(Fault::expert_grads_averaged_over_edp, "#5956: DP 4, EP 2 (EDP 2): expert sums divided by 2, not 4",
      config_of(4, 1, 1, 2, 1), small_moe(2), unreduced, ParamClass::expert_column, false);
  add(Fault::tied_embedding_not_synced, "PP 2, DP 2, tied embeddings: each stage keeps its own part",
      config_of(4, 1, 2, 1, 1), dense_model(2), unreduced, ParamClass::vocab, false);
  add(Fault::tied_embedding_synced_twice, "PP 2, tied embeddings: both copies twice the gradient",
      config_of(2, 1, 2, 1, 1), dense_model(2), unreduced, ParamClass::vocab, false);
  {
    topologies::ModelSpec m = dense_model();
    m.qk_layernorm = true;
    add(Fault::tp_replicated_grads_not_summed, "TP 2, qk-layernorm: each TP rank keeps its own part",
        config_of(2, 2, 1, 1, 1), m, unreduced, ParamClass::replicated, false);
    add(Fault::tp_replicated_grads_summed_twice, "TP 2, qk-layernorm: twice the gradient",
        config_of(2, 2, 1, 1, 1), m, unreduced, ParamClass::replicated, false);
  }
  return cases;
}

}  // namespace tally::testing
