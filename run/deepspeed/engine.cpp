#include "run/deepspeed/engine.h"

#include <algorithm>

#include "run/deepspeed/rules.h"
#include "run/deepspeed/section.h"
#include "topologies/logical_model.h"

namespace tally::run {

nlohmann::ordered_json deepspeed_engine_config(const casefile::Case& c) {
  const DeepSpeedConfig d = kDeepSpeedSection.of(c).value_or(DeepSpeedConfig{});
  const int dp = c.topology.world / std::max(1, c.topology.tp * c.topology.pp);
  nlohmann::ordered_json j = {{"train_micro_batch_size_per_gpu", 1},
                              {"gradient_accumulation_steps", 1},
                              {"train_batch_size", dp},
                              {"gradient_clipping", c.path.max_norm > 0 ? c.path.max_norm : 1.0},
                              // ZeRO 3 partitions every param, however small (its default keeps small ones whole)
                              {"zero_optimization", {{"stage", d.zero_stage}, {"stage3_param_persistence_threshold", 0}}},
                              {"zero_allow_untested_optimizer", true},
                              {"steps_per_print", 1 << 30}};
  switch (c.path.gradients.generator.dtype) {
    case kernels::Dtype::bf16: j["bf16"] = {{"enabled", true}}; break;
    case kernels::Dtype::fp16:
      j["fp16"] = {{"enabled", true}, {"loss_scale", d.loss_scale}, {"initial_scale_power", 7}};
      break;
    case kernels::Dtype::fp32: break;
  }
  if (d.grad_accum_fp32) j["data_types"] = {{"grad_accum_dtype", "fp32"}};
  if (d.offload_optimizer) {
    j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    j["zero_force_ds_cpu_optimizer"] = false;  // the worker's AdamW, not DeepSpeedCPUAdam
  }
  if (d.autoep) {
    j["expert_parallel"] = {{"enabled", true},
                            {"autoep_size", c.topology.ep},
                            {"moe_layer_pattern", "moe\\.\\w+"},
                            {"router_pattern", "gate"},
                            {"expert_pattern", "experts"},
                            {"expert_w1", "gate_proj"},
                            {"expert_w2", "down_proj"},
                            {"expert_w3", "up_proj"},
                            {"top_k", 1},
                            {"score_func", "softmax"},
                            {"score_apply", "post"},
                            {"route_norm", false},
                            {"use_grouped_mm", false}};
    j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 0.0}, {"weight_decay", 0.0}, {"torch_adam", !d.fused_adam}}}};
  }
  if (d.autotp) {
    // DeepSpeed derives the batch size after making AutoTP's groups: the worker states none.
    j.erase("train_batch_size");
    const auto spec = [](std::string pattern, std::string type) {
      return nlohmann::ordered_json{{"patterns", {std::move(pattern)}}, {"partition_type", std::move(type)}};
    };
    // A preset's transformers class is cut by its own tensor-parallel plan, as DeepSpeed's users
    // have it (families.py): only the size.
    if (builds_family(c, d)) {
      j["tensor_parallel"] = {{"autotp_size", c.topology.tp}};
      return j;
    }
    nlohmann::ordered_json summed = spec("^tp_summed\\..*", "skip");
    summed["grad_allreduce"] = true;
    j["tensor_parallel"] = {
        {"autotp_size", c.topology.tp},
        {"partition_config",
         {{"use_default_specs", false},
          {"layer_specs", {spec("^column\\..*", "column"), spec("^row\\..*", "row"), summed}}}}};
  }
  return j;
}

namespace {

std::string model_line(const casefile::Case& c) {
  const topologies::ParallelConfig& t = c.topology;
  const DeepSpeedConfig d = kDeepSpeedSection.of(c).value_or(DeepSpeedConfig{});
  const std::string adam = d.fused_adam ? "DeepSpeed's FusedAdam at lr 0" : "torch's AdamW at lr 0";
  const std::string autoep_blocks =
      "each MoE layer a block of a router 'gate' (torch.nn.Linear) and 'experts' holding every expert's SwiGLU "
      "gate, up and down projections as 3-D tensors, which DeepSpeed's AutoEP replaces with its AutoEPMoELayer "
      "over EP " + std::to_string(t.ep);
  if (d.autoep && d.autotp)
    return "model: tally's column- and row-parallel params as whole torch.nn.Linear layers that DeepSpeed's AutoTP "
           "shards over TP " + std::to_string(t.tp) + ", the q/k norms with grad_allreduce, other dense params "
           "whole; " + autoep_blocks + ", folded over TP (its EP groups span TP ranks, each expert whole; the "
           "worker gives an expert's gradient times TP, as the folded forward does); the engine's own optimizer, " + adam;
  if (d.autoep)
    return "model: tally's params whole (TP 1), " + autoep_blocks +
           "; the engine's own optimizer, " + adam;
  std::string line;
  if (t.pp > 1) {
    line = "model: a deepspeed.pipe.PipelineModule of " + std::to_string(t.pp) +
           " stages (PipeModelDataParallelTopology(num_pp=" + std::to_string(t.pp) + ", num_mp=" +
           std::to_string(t.tp) + ", num_dp=" + std::to_string(t.world / (t.tp * t.pp)) +
           ")), each stage a layer of the params tally places there (TP shards marked tensor_model_parallel)";
    if (topologies::LogicalModel(c.model, t).last_stage_copy() == topologies::SharedCopy::output_layer)
      line += ", the word embedding a TiedLayerSpec on the first and last stage";
  } else if (d.autotp) {
    line = "model: tally's column- and row-parallel params as whole torch.nn.Linear layers (the output "
           "layer column-parallel) that DeepSpeed's AutoTP shards over TP " + std::to_string(t.tp) +
           ", the q/k norms replicated with their gradients summed over TP (grad_allreduce), every other "
           "param whole (the word embedding too)";
  } else {
    line = "model: tally's params with a Megatron-style mpu of TP " + std::to_string(t.tp) +
           " (TP shards marked tensor_model_parallel)";
  }
  if (c.model.num_experts > 0)
    line += "; each MoE layer deepspeed.moe.layer.MoE(num_experts=" + std::to_string(c.model.num_experts) +
            ", ep_size=" + std::to_string(t.ep) + ", enable_expert_tensor_parallelism=" +
            (t.tp > 1 && t.etp == t.tp ? "True" : "False") + ")";
  return line + "; " + adam + (t.pp > 1 ? "; one train_batch" : "");
}

}  // namespace

std::string deepspeed_model_description(const casefile::Case& c) {
  const DeepSpeedConfig d = kDeepSpeedSection.of(c).value_or(DeepSpeedConfig{});
  switch (d.launcher) {
    case DeepSpeedLauncher::accelerate:
      return model_line(c) + "; the engine built by accelerate's Accelerator(deepspeed_plugin=DeepSpeedPlugin("
             "hf_ds_config=this config)).prepare(model, optimizer), stepped by accelerator.backward, the norm what "
             "accelerator.clip_grad_norm_ returns";
    case DeepSpeedLauncher::trainer:
      return model_line(c) + "; the engine built by the accelerator of a transformers Trainer with "
             "TrainingArguments(deepspeed=this config), prepared as Trainer.train does (deepspeed_init with the "
             "Trainer's own AdamW at lr 0, accelerator.prepare), the norm what Trainer._get_grad_norm returns";
    case DeepSpeedLauncher::deepspeed: break;
  }
  return model_line(c);
}

ReductionGroups deepspeed_reduction_groups(const casefile::Case& c) {
  const topologies::ParallelConfig& t = c.topology;
  const DeepSpeedConfig d = kDeepSpeedSection.of(c).value_or(DeepSpeedConfig{});
  const int stage_ranks = t.world / std::max(1, t.pp);
  const int dp = stage_ranks / std::max(1, t.tp);
  ReductionGroups groups{{dp}, dp};
  if (c.model.num_experts == 0 || t.ep < 1) return groups;
  // With expert TP, DeepSpeed's MoE layer makes its expert-DP groups within each TP lane
  // (utils/groups.py:607 _create_expert_data_and_model_parallel); without it, and for AutoEP, over
  // every rank of a stage, TP ranks included (:370 _create_expert_and_data_parallel): its MoE
  // layer gives each TP rank other tokens (moe/sharded_moe.py drops the duplicates), so their
  // sums add up.
  const bool expert_tp = t.tp > 1 && t.etp == t.tp && !d.autoep;
  const int expert_dp = (expert_tp ? dp : stage_ranks) / t.ep;
  if (expert_dp >= 1) groups.add(expert_dp);
  return groups;
}

}  // namespace tally::run
