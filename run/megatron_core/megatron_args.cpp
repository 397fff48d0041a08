#include "run/megatron_core/megatron_args.h"

#include <nlohmann/json.hpp>

#include "run/megatron_core/section.h"
#include "vocab/faults.h"
#include "kernels/gradient_generator.h"
#include "topologies/model_spec.h"

namespace tally::run {

namespace {

// The shortest text that reads back as `value` ("1.0", "0.5").
std::string number_text(double value) { return nlohmann::json(value).dump(); }

}  // namespace

MegatronArgs megatron_args(const casefile::Case& c) {
  MegatronArgs m;
  auto flag = [&m](std::string name) { m.args.push_back(std::move(name)); };
  auto value = [&m](std::string name, const std::string& text) {
    m.args.push_back(std::move(name));
    m.args.push_back(text);
  };
  auto integer = [&value](std::string name, long long v) { value(std::move(name), std::to_string(v)); };

  const topologies::ParallelConfig& t = c.topology;
  m.notes.push_back("world size " + std::to_string(t.world) + ": set by the launcher (torchrun --nproc-per-node, or nodes x GPUs)");
  integer("--tensor-model-parallel-size", t.tp);
  integer("--context-parallel-size", t.cp);
  integer("--pipeline-model-parallel-size", t.pp);
  integer("--expert-model-parallel-size", t.ep);
  integer("--expert-tensor-parallel-size", t.etp);
  // megatron-core 0.19 spells generalized TP as the total shard count per weight.
  if (t.gtp > 1) integer("--tensor-parallel-num-weight-shards", std::int64_t{t.tp} * t.gtp);
  if (t.egtp > 1)
    integer("--expert-tensor-parallel-num-weight-shards", std::int64_t{t.etp} * t.egtp);
  if (topologies::uses_gtp(t))
    m.notes.push_back("generalized TP needs megatron-core 0.19 or later with Transformer Engine 2.19 or later");
  if (t.vpp > 1) integer("--num-virtual-stages-per-pipeline-rank", t.vpp);
  if (t.dist_opt_instances > 1) integer("--num-distributed-optimizer-instances", t.dist_opt_instances);
  std::string order_error;
  const std::optional<topologies::AxisOrder> order = topologies::parse_order(t.order, &order_error);
  const std::string resolved = order ? topologies::order_string(*order) : t.order;
  if (resolved == "tp-cp-ep-pp-dp")
    flag("--use-tp-pp-dp-mapping");
  else if (resolved != topologies::kDefaultOrder)
    m.notes.push_back("rank order " + t.order +
                      " has no Megatron-LM flag (Megatron-LM spells only tp-cp-ep-dp-pp, the "
                      "default, and tp-cp-ep-pp-dp, --use-tp-pp-dp-mapping); pass it as "
                      "initialize_model_parallel(order=\"" + resolved + "\")");

  const topologies::ModelSpec& s = c.model;
  if (s.kind == topologies::ModelKind::custom) {
    m.notes.push_back("the model is a custom layout of " + std::to_string(s.params.size()) +
                      " params: it has no Megatron-LM model flags (only the parallel and "
                      "optimizer flags are shown)");
  } else {
    integer("--num-layers", s.num_layers);
    integer("--hidden-size", s.hidden_size);
    integer("--num-attention-heads", s.num_attention_heads);
    if (s.num_query_groups) {
      flag("--group-query-attention");
      integer("--num-query-groups", *s.num_query_groups);
    }
    if (s.kv_channels) integer("--kv-channels", *s.kv_channels);
    // Always explicit: Megatron-LM's default differs from 4 * hidden with --swiglu.
    integer("--ffn-hidden-size", topologies::resolved_ffn_hidden(s));
    integer("--vocab-size", s.vocab_size);
    integer("--make-vocab-size-divisible-by", 1);
    if (s.position_embedding == topologies::PositionEmbedding::learned_absolute)
      integer("--max-position-embeddings", s.max_position_embeddings);
    value("--position-embedding-type", std::string(topologies::position_embedding_name(s.position_embedding)));
    value("--normalization", std::string(topologies::normalization_name(s.normalization)));
    if (!s.add_bias_linear) flag("--disable-bias-linear");
    if (s.qk_layernorm) flag("--qk-layernorm");
    if (s.multi_latent_attention) {
      flag("--multi-latent-attention");
      if (s.q_lora_rank) integer("--q-lora-rank", *s.q_lora_rank);
      integer("--kv-lora-rank", s.kv_lora_rank);
      integer("--qk-head-dim", s.qk_head_dim);
      integer("--qk-pos-emb-head-dim", s.qk_pos_emb_head_dim);
      integer("--v-head-dim", s.v_head_dim);
    }
    if (s.softmax_type != topologies::SoftmaxType::vanilla)
      value("--softmax-type", std::string(topologies::softmax_type_name(s.softmax_type)));
    if (s.untie_embeddings_and_output_weights) flag("--untie-embeddings-and-output-weights");
    if (s.swiglu) flag("--swiglu");
    if (s.num_experts > 0) {
      integer("--num-experts", s.num_experts);
      integer("--moe-ffn-hidden-size", topologies::resolved_moe_ffn_hidden(s));
      if (s.moe_layer_freq != 1 || !s.moe_layer_pattern.empty())
        value("--moe-layer-freq", topologies::moe_layer_freq_text(s));
      if (s.moe_shared_expert_intermediate_size > 0) {
        integer("--moe-shared-expert-intermediate-size", s.moe_shared_expert_intermediate_size);
        if (s.moe_shared_expert_gate) flag("--moe-shared-expert-gate");
      }
    }
    if (s.mtp_num_layers > 0) {
      integer("--mtp-num-layers", s.mtp_num_layers);
      if (s.mtp_detach_heads)
        m.notes.push_back("mtp_detach_heads: the MTP params carry grad_norm_group='mtp' "
                          "(TransformerConfig.mtp_detach_heads)");
    }
    if (s.first_stage_layers) integer("--decoder-first-pipeline-num-layers", *s.first_stage_layers);
    if (s.last_stage_layers) integer("--decoder-last-pipeline-num-layers", *s.last_stage_layers);
  }

  const vocab::PathOptions& o = c.path;
  switch (o.optimizer) {
    case vocab::OptimizerModel::plain: break;
    case vocab::OptimizerModel::distributed:
      flag("--use-distributed-optimizer");
      if (o.bucket_elements > 0) integer("--ddp-bucket-size", o.bucket_elements);
      break;
    case vocab::OptimizerModel::layerwise:
      // Megatron-LM 0.19 spells the layer-wise optimizer this way; its parameter layout is the default.
      value("--optimizer", "muon");
      flag("--use-distributed-optimizer");
      if (!o.layer_wise_param_layout) flag("--no-use-layer-wise-param-layout");
      break;
    case vocab::OptimizerModel::muon: value("--optimizer", "muon"); break;
  }
  if (const std::optional<MegatronFsdpConfig> fsdp = kMegatronFsdpSection.of(c)) {
    flag("--use-megatron-fsdp");
    value("--data-parallel-sharding-strategy", std::string(fsdp_sharding_name(fsdp->sharding)));
    if (c.topology.dist_opt_instances > 1)
      value("--outer-dp-sharding-strategy", std::string(fsdp_outer_sharding_name(fsdp->outer_sharding)));
    value("--megatron-fsdp-main-grads-dtype", "fp32");  // as tally's worker builds it: the values it gives stay exact
    value("--ckpt-format", "fsdp_dtensor");  // Megatron-LM requires it with --use-megatron-fsdp
  }
  value("--clip-grad", number_text(o.max_norm));

  std::string gradients = "gradients " + std::string(kernels::mode_name(o.gradients.generator.mode)) +
                          " " + std::string(kernels::dtype_name(o.gradients.generator.dtype)) +
                          " (seed " + std::to_string(o.gradients.generator.seed) + ")";
  if (o.gradients.class_mask != ~std::uint32_t{0}) gradients += " on some param classes only";
  m.notes.push_back(gradients + " and the accumulation are tally's: a Megatron-LM run takes "
                                "its gradients from the data");
  if (!o.faults.empty())
    m.notes.push_back("faults " + vocab::fault_list(o.faults) +
                      ": each is a wrong rule some framework version shipped, not a flag");
  return m;
}

}  // namespace tally::run
