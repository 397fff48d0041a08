#include "run/deepspeed/rules.h"

#include <algorithm>
#include <array>
#include <iterator>

#include "vocab/faults.h"
#include "run/deepspeed/section.h"
#include "run/target.h"
#include "vocab/gradients.h"
#include "record/text.h"
#include "run/megatron_core/rules.h"
#include "topologies/logical_model.h"
#include "topologies/model_spec.h"

namespace tally::run {

namespace {

using kernels::Dtype;

int data_parallel(const topologies::ParallelConfig& t) { return t.world / std::max(1, t.tp * t.pp); }

bool computes_in(const std::vector<std::string>& dtypes, Dtype dtype) {
  return dtypes.empty() || std::find(dtypes.begin(), dtypes.end(), kernels::dtype_name(dtype)) != dtypes.end();
}

// The largest value DeepSpeed's fp16 gradients reach: the worker feeds a gradient times the DP
// size on one rank of each reduction group (an expert of AutoEP folded over TP times TP more, as
// the folded forward would), and DeepSpeed multiplies it by the loss scale.
double largest_fp16_gradient(const casefile::Case& c, const DeepSpeedConfig& d) {
  const bool folded = d.autoep && d.autotp;
  return vocab::largest_gradient(c.path.gradients) * data_parallel(c.topology) * (folded ? c.topology.tp : 1) *
         d.loss_scale;
}
constexpr double kFp16Max = 65504.0;

// What DeepSpeed 0.19 does with a precision, a ZeRO stage and the gradient accumulation dtype. Each
// of DeepSpeed's own checks is cited at 0.19.8 (issue 50), in the order its engine makes them;
// what DeepSpeed would run but the worker does not is said so.
std::optional<std::string> engine_refuses(const DeepSpeedConfig& d, Dtype dtype, int experts, int pp) {
  // ZeRO 3's optimizer is built in DeepSpeedEngine.__init__, before PipelineEngine's own assert.
  if (d.zero_stage == 3 && experts > 0 && !d.autoep)
    return "deepspeed.zero_stage 3 with experts: DeepSpeed asserts that its native MoE layer is not supported with "
           "ZeRO stage 3 (AssertionError \"Native DeepSpeed MoE is not supported with ZeRO Stage 3\", "
           "deepspeed/runtime/engine.py:2215 at 0.19.8); AutoEP's layers are: set deepspeed.autoep";
  if (pp > 1 && d.zero_stage > 1)
    return "deepspeed.zero_stage " + std::to_string(d.zero_stage) +
           " with topology.pp > 1: DeepSpeed's PipelineEngine asserts that ZeRO 2 and 3 are incompatible "
           "with pipeline parallelism (AssertionError, deepspeed/runtime/pipe/engine.py:76 at 0.19.8)";
  if (d.zero_stage == 3 && d.grad_accum_fp32)
    return "deepspeed.grad_accum_fp32 with zero_stage 3: tally's worker does not build ZeRO 3 with fp32 "
           "accumulation (DeepSpeed runs it)";
  // Not a limit of DeepSpeed's: with fp32 gradients the flag changes nothing it computes.
  if (d.grad_accum_fp32 && dtype == Dtype::fp32)
    return "deepspeed.grad_accum_fp32 with gradients.dtype fp32: the gradients are fp32 already, so the flag "
           "changes nothing; tally's worker does not build it as a case of its own";
  // DeepSpeed hands offload_optimizer only to its ZeRO optimizers: at ZeRO 0 it offloads nothing.
  if (d.offload_optimizer && d.zero_stage == 0)
    return "deepspeed.offload_optimizer with zero_stage 0: DeepSpeed gives offload_optimizer only to a ZeRO "
           "optimizer (deepspeed/runtime/engine.py:2688 at 0.19.8) and ZeRO 0 builds none, so nothing would be "
           "offloaded; tally's worker does not build it";
  if (d.offload_optimizer && d.zero_stage == 3)
    return "deepspeed.offload_optimizer with zero_stage 3: tally's worker does not build ZeRO 3's offload (it "
           "offloads at ZeRO 1 and 2: DeepSpeedZeroOptimizer's CPU-offload norm)";
  if (d.offload_optimizer && pp > 1)
    return "deepspeed.offload_optimizer with topology.pp > 1: tally's worker does not build ZeRO-Offload in a "
           "pipeline";
  if (d.grad_accum_fp32 && d.zero_stage == 0)
    return "deepspeed.grad_accum_fp32 with zero_stage 0: DeepSpeed raises NotImplementedError (\"unsupported mix "
           "of model_dtype and grad_accum_dtype\") for a 16-bit model with fp32 gradient accumulation without ZeRO "
           "(deepspeed/runtime/engine.py:2323 at 0.19.8)";
  return std::nullopt;
}

// What the worker's AutoTP model (adapters/tally_adapters/deepspeed/models.py, build_autotp_model)
// cannot be: AutoTP shards a plain module's linear layers over TP. DeepSpeed itself refuses none of
// these.
std::optional<std::string> autotp_refuses(const DeepSpeedConfig& d, const topologies::ParallelConfig& t,
                                          int experts) {
  if (!d.autotp) return std::nullopt;
  // DeepSpeed would run it, unsharded: not a case of AutoTP.
  if (t.tp == 1)
    return "deepspeed.autotp with topology.tp 1: DeepSpeed applies AutoTP only above autotp_size 1 "
           "(deepspeed/runtime/engine.py:595 at 0.19.8), so nothing would be sharded; set tp > 1 or leave "
           "autotp out";
  if (t.pp > 1)
    return "deepspeed.autotp with topology.pp > 1: tally's worker does not build AutoTP in a PipelineModule (it "
           "shards a plain module; the pipeline's grid makes its own TP groups)";
  if (experts > 0 && !d.autoep)
    return "deepspeed.autotp with experts: tally's worker does not build DeepSpeed's MoE layer in an AutoTP model; "
           "set deepspeed.autoep (AutoEP folded over AutoTP)";
  return std::nullopt;
}

// What the worker's AutoEP model (adapters/tally_adapters/deepspeed/experts.py, build_autoep_model)
// cannot be: AutoEP replaces Hugging Face-style MoE blocks whose experts are SwiGLU projections.
// DeepSpeed's own checks, at deepspeed.initialize, in the order it makes them (tally's campaigns once
// ended at the offload one).
std::optional<std::string> autoep_refuses(const DeepSpeedConfig& d, const topologies::ParallelConfig& t,
                                          const topologies::ModelSpec& m) {
  if (!d.autoep) return std::nullopt;
  // Without an AutoTP of TP > 1, the worker's TP would come from its mpu.
  if (t.tp > 1 && !d.autotp)
    return "deepspeed.autoep with topology.tp " + std::to_string(t.tp) +
           " without deepspeed.autotp: DeepSpeed raises ValueError \"AutoEP does not currently support tensor model "
           "parallelism from mpu\" (deepspeed/runtime/engine.py:836 at 0.19.8); AutoEP takes TP only folded over "
           "AutoTP";
  // tally's expert TP would be AutoEP's expert_tensor_parallel_size (autotp_refuses has made TP > 1).
  if (d.autotp && t.etp != 1)
    return "deepspeed.autoep with deepspeed.autotp and topology.etp " + std::to_string(t.etp) +
           ": DeepSpeed raises ValueError for an expert_tensor_parallel_size other than 1 (\"reserved for "
           "expert-internal tensor parallelism\", deepspeed/module_inject/auto_ep_folding.py:215 at 0.19.8): "
           "folded experts are whole";
  if (d.autotp && t.ep == 1)
    return "deepspeed.autoep with deepspeed.autotp and topology.ep 1: DeepSpeed raises ValueError \"AutoEP+AutoTP "
           "folding requires expert_parallel.autoep_size > 1\" (deepspeed/module_inject/auto_ep_folding.py:241 at "
           "0.19.8)";
  if (d.autotp && t.tp > 1 && d.offload_optimizer)
    return "deepspeed.offload_optimizer with deepspeed.autoep folded over deepspeed.autotp (topology.tp " +
           std::to_string(t.tp) + "): DeepSpeed raises ValueError, ZeRO offload with AutoEP+AutoTP folding \"is "
           "not validated yet\" (deepspeed/module_inject/auto_ep_folding.py:249 at 0.19.8)";
  // The worker's engine config names its blocks (moe_layer_pattern): DeepSpeed must find one.
  if (m.num_experts == 0)
    return "deepspeed.autoep without experts: DeepSpeed raises ValueError \"AutoEP: no MoE layers detected\" for the "
           "worker's moe_layer_pattern (deepspeed/module_inject/auto_ep.py:760 at 0.19.8); set model.num_experts";
  if (t.pp > 1)
    return "deepspeed.autoep with topology.pp > 1: tally's worker does not build AutoEP in a PipelineModule (it "
           "replaces layers of a plain module)";
  if (!m.swiglu)
    return "deepspeed.autoep without model.swiglu: tally's worker does not build AutoEP's experts from an ungated "
           "MLP: AutoEP's GroupedExperts are gated, w1, w3 and w2 (deepspeed/moe/ep_experts.py:423 at 0.19.8)";
  if (m.add_bias_linear)
    return "deepspeed.autoep with model.add_bias_linear: tally's worker does not build expert biases for AutoEP: "
           "its GroupedExperts hold weights only (deepspeed/moe/ep_experts.py:423 at 0.19.8)";
  return std::nullopt;
}

// What accelerate (and the Trainer, which prepares through it) cannot give DeepSpeed, cited at
// accelerate 1.15.0 and DeepSpeed 0.19.8. accelerate fills only a config's "auto" values
// (accelerate/utils/dataclasses.py:1363 fill_match) and tally's engine config has none, so what it
// adds (steps_per_print, fp16/bf16 "enabled": false where absent, zero_allow_untested_optimizer)
// changes no norm code.
std::optional<std::string> launcher_refuses(const DeepSpeedConfig& d, const topologies::ParallelConfig& t, Dtype dtype,
                                            int experts) {
  if (d.launcher == DeepSpeedLauncher::deepspeed) return std::nullopt;
  const std::string launcher = "deepspeed.launcher " + std::string(deepspeed_launcher_name(d.launcher));
  if (t.pp > 1)
    return launcher + " with topology.pp > 1: accelerate's backward calls the engine's backward and step "
           "(accelerate/utils/deepspeed.py:270-281 at 1.15.0), which DeepSpeed's PipelineEngine refuses "
           "(PipelineError \"Only train_batch() is accessible in pipeline mode.\", deepspeed/runtime/pipe/engine.py:1302 "
           "at 0.19.8)";
  if (t.tp > 1 && !d.autotp)
    return launcher + " with topology.tp " + std::to_string(t.tp) + " without deepspeed.autotp: accelerate's "
           "prepare passes deepspeed.initialize no mpu (only Ulysses sequence parallelism's, "
           "accelerate/accelerator.py:2394-2433 at 1.15.0), so DeepSpeed has no Megatron-style TP groups; "
           "through accelerate TP is AutoTP's (set deepspeed.autotp)";
  // The Trainer's deepspeed_init drops any optimizer given and makes its own from its arguments
  // (transformers/integrations/deepspeed.py:630, 559 at 5.18.0): one AdamW without MoE groups.
  if (d.launcher == DeepSpeedLauncher::trainer && d.fused_adam)
    return launcher + " with deepspeed.fused_adam: the Trainer's deepspeed_init makes its own optimizer from its "
           "arguments (trainer.create_optimizer, transformers/integrations/deepspeed.py:630, 559 at 5.18.0), a torch "
           "AdamW; tally's worker does not build DeepSpeed's FusedAdam there";
  if (d.launcher == DeepSpeedLauncher::trainer && d.autotp)
    return launcher + " with deepspeed.autotp: the Trainer's deepspeed_init shards the model with "
           "deepspeed.tp_model_init before prepare (transformers/integrations/deepspeed.py:631-640 at 5.18.0), which "
           "finds no policy for the worker's AutoTP model (AssertionError \"Not able to determine model policy "
           "automatically\", deepspeed/module_inject/auto_tp.py:300 at 0.19.8); tally's worker does not build it";
  if (d.launcher == DeepSpeedLauncher::trainer && experts > 0 && !d.autoep)
    return launcher + " with DeepSpeed's MoE layer (model.num_experts without deepspeed.autoep): the Trainer's "
           "deepspeed_init makes its own optimizer (transformers/integrations/deepspeed.py:630, 559 at 5.18.0) without "
           "the MoE param groups DeepSpeed requires (AssertionError \"The model has moe layers, but None of the param "
           "groups are marked as MoE\", deepspeed/runtime/zero/stage_1_and_2.py:874, bf16_optimizer.py:140 at 0.19.8); "
           "tally's worker does not build it at the other paths either";
  if (dtype == Dtype::fp32 && d.zero_stage == 0)
    return launcher + " with gradients.dtype fp32 at zero_stage 0: accelerate's clip_grad_norm_ returns the "
           "engine's get_global_grad_norm() (accelerate/accelerator.py:3023-3026 at 1.15.0), which DeepSpeed leaves "
           "None on this path (clip_fp32_gradients keeps no norm; only an optimizer's _global_grad_norm sets it, "
           "deepspeed/runtime/engine.py:3502-3519 at 0.19.8): there is no reported norm to judge";
  return std::nullopt;
}

// DeepSpeed's checks of EP, in the order it makes them: AutoEP's (`autoep`) sizes its groups before it
// finds the layers whose experts it counts; its MoE layer counts the experts when it is built, and
// makes its groups in the engine. Where none fires, ep_fits holds.
std::optional<std::string> ep_refuses(const topologies::ParallelConfig& t, const topologies::ModelSpec& m,
                                      bool autoep) {
  if (m.num_experts == 0 || t.ep < 1) return std::nullopt;
  const std::string ep = "topology.ep " + std::to_string(t.ep);
  const std::string experts = std::to_string(m.num_experts);
  const int stage_ranks = t.world / std::max(1, t.pp);
  if (autoep) {
    if (stage_ranks % t.ep != 0)
      return ep + " with deepspeed.autoep: DeepSpeed raises ValueError unless autoep_size divides the ranks of a "
                  "pipeline stage (" + std::to_string(stage_ranks) +
             "; deepspeed/module_inject/auto_ep_folding.py:112 at 0.19.8)";
    if (t.ep > m.num_experts)
      return ep + " with deepspeed.autoep: DeepSpeed raises ValueError, autoep_size exceeds num_experts=" + experts +
             " (deepspeed/module_inject/auto_ep_config.py:371 at 0.19.8)";
    if (m.num_experts % t.ep != 0)
      return ep + " with deepspeed.autoep: DeepSpeed raises ValueError, num_experts=" + experts +
             " is not divisible by autoep_size (deepspeed/module_inject/auto_ep_config.py:380 at 0.19.8)";
    return std::nullopt;
  }
  if (m.num_experts % t.ep != 0)
    return ep + ": DeepSpeed's MoE layer asserts that EP divides the experts (" + experts +
           "; deepspeed/moe/layer.py:59 at 0.19.8)";
  if (t.etp == 1 && stage_ranks % t.ep != 0)
    return ep + ": without expert TP DeepSpeed's expert groups are consecutive ranks of a pipeline stage (they span "
                "TP), and it asserts that EP divides them (" + std::to_string(stage_ranks) +
           "; deepspeed/utils/groups.py:417 at 0.19.8)";
  if (t.etp != 1 && data_parallel(t) % t.ep != 0)
    return ep + ": with expert TP DeepSpeed asserts that EP divides the data-parallel size (" +
           std::to_string(data_parallel(t)) + "; deepspeed/utils/groups.py:634 at 0.19.8)";
  return std::nullopt;
}

// The MoE layer's expert groups: without expert TP, DeepSpeed's legacy groups are consecutive
// ranks of the whole world (they span TP; they must not span pipeline stages, whose MoE layers
// differ); with it, EP groups lie within a DP group.
bool ep_fits(const topologies::ParallelConfig& t, const topologies::ModelSpec& m) {
  if (m.num_experts == 0) return t.ep == 1;
  const int ranks = t.etp == 1 ? t.world / std::max(1, t.pp) : data_parallel(t);
  return ranks % t.ep == 0 && m.num_experts % t.ep == 0;
}

// Whether every pipeline stage of `stages` holds a MoE layer of `m` (`stages` passes check_model).
bool every_stage_holds_experts(const topologies::ModelSpec& m, const topologies::ParallelConfig& stages) {
  const topologies::LogicalModel model(m, stages);
  std::vector<bool> holds(static_cast<std::size_t>(stages.pp), false);
  for (const topologies::LogicalParam& p : model.params())
    if (p.expert >= 0) holds[static_cast<std::size_t>(p.stage)] = true;
  return std::all_of(holds.begin(), holds.end(), [](bool h) { return h; });
}

// One of DeepSpeed's norm codes, as a ZeRO stage, a precision, the accumulation dtype and the
// client optimizer choose it.
struct EnginePath {
  int zero_stage;
  Dtype dtype;
  bool grad_accum_fp32;
  bool fused_adam = false;
  bool offload_optimizer = false;
};
constexpr std::array<EnginePath, 14> kEnginePaths = {{
    {0, Dtype::fp32, false},        // clip_grad_norm_
    {0, Dtype::bf16, false},        // FP16_UnfusedOptimizer
    {0, Dtype::fp16, false},        // FP16_UnfusedOptimizer
    {0, Dtype::bf16, false, true},  // FP16_Optimizer
    {0, Dtype::fp16, false, true},  // FP16_Optimizer
    {1, Dtype::bf16, true},         // BF16_Optimizer
    {1, Dtype::bf16, false},        // DeepSpeedZeroOptimizer
    {1, Dtype::fp32, false},
    {2, Dtype::bf16, false},
    {2, Dtype::fp16, false},
    {1, Dtype::bf16, false, false, true},  // DeepSpeedZeroOptimizer's CPU-offload norm
    {2, Dtype::fp32, false, false, true},
    {3, Dtype::bf16, false},  // DeepSpeedZeroOptimizer_Stage3 (experts: AutoEP's where it fits, else ZeRO 2)
    {3, Dtype::fp32, false},
}};

// Whether DeepSpeed takes `path` with pipeline parallelism (its PipelineEngine runs ZeRO 0 and 1),
// as a norm code of its own: bf16 at ZeRO 0 in a pipeline is BF16_Optimizer whatever the optimizer.
bool pipelines(const EnginePath& path) {
  return path.zero_stage <= 1 && !(path.fused_adam && path.dtype == Dtype::bf16) && !path.offload_optimizer;
}

// Whether a planted fault can change what `path` computes, where the unplanted path counts right
// (tally mutants scores a fault only on a case that passes without it).
bool shows(const vocab::FaultSet& faults, const EnginePath& path, bool pipelined) {
  using vocab::Fault;
  // With pipeline parallelism, bf16 at ZeRO 0 is BF16_Optimizer too (DeepSpeed's sanity check).
  const bool bf16_optimizer =
      (path.zero_stage == 1 && path.grad_accum_fp32) || (pipelined && path.zero_stage == 0 && path.dtype == Dtype::bf16);
  const bool zero = path.zero_stage > 0 && path.zero_stage < 3 && !bf16_optimizer;
  const bool fp16_optimizer = path.zero_stage == 0 && path.dtype != Dtype::fp32 && !bf16_optimizer;
  const bool unfused = fp16_optimizer && !path.fused_adam;
  const bool fused = fp16_optimizer && path.fused_adam;
  // The fp32 clip of a pipeline counts only the first stage (docs/findings): no fault shows there.
  if (pipelined && path.zero_stage == 0 && path.dtype == Dtype::fp32 && !faults.empty()) return false;
  if (faults.has(Fault::tied_copy_not_shared) && !(pipelined && (bf16_optimizer || zero || fused))) return false;
  if (faults.has(Fault::missing_pp_reduction) && !pipelined) return false;
  // ZeRO 3 with experts is AutoEP's (DeepSpeed refuses its own MoE layer there).
  if (faults.has(Fault::missing_ep_reduction) && !bf16_optimizer && !fused && path.zero_stage != 3) return false;
  if (faults.has(Fault::expert_norm_dropped) && !bf16_optimizer && !fused && !zero) return false;
  if ((faults.has(Fault::no_dedup_filter) || faults.has(Fault::tp_marking_unseen_by_filter)) && unfused) return false;
  // The worker plants the reduction faults in the engine's bucket all-reduce, which ZeRO 0 runs.
  if ((faults.has(Fault::grads_averaged_twice) || faults.has(Fault::grads_not_averaged) ||
       faults.has(Fault::expert_grads_averaged_over_edp)) &&
      path.zero_stage != 0)
    return false;
  return true;
}

}  // namespace

bool builds_family(const casefile::Case& c, const DeepSpeedConfig& d) {
  const topologies::ModelSpec& m = c.model;
  const topologies::ParallelConfig& t = c.topology;
  // tally_adapters.hf_families.FAMILIES: every preset has a transformers class of its family.
  static constexpr std::array<std::string_view, 5> kFamilies = {"llama3", "mixtral", "qwen3-moe", "gpt-oss",
                                                                "deepseek-v3"};
  return std::find(kFamilies.begin(), kFamilies.end(), m.preset) != kFamilies.end() && t.pp == 1 && !d.autoep &&
         (t.tp == 1 || d.autotp) && (m.num_experts == 0 || t.ep == 1) && d.zero_stage != 3;
}

std::optional<std::string> deepspeed_refusal(const casefile::Case& c, std::string_view,
                                                 const FaultPlants& plants, const std::vector<std::string>& dtypes,
                                                 bool megatron_model_rules,
                                                 const std::map<std::string, std::string>& cannot_run) {
  const topologies::ModelSpec& m = c.model;
  const topologies::ParallelConfig& t = c.topology;
  const vocab::PathOptions& o = c.path;
  // Each text names the input and either DeepSpeed's own check at 0.19.8 (file:line) or says that
  // tally's worker does not build the case (issue 50).
  if (m.kind != topologies::ModelKind::gpt)
    return "model.kind custom: tally's worker does not build a custom layout (it has no module); it builds "
           "tally's GPT/MoE family";
  if (auto why = other_frameworks_section(c, "deepspeed"))
    return *why + "; tally's worker does not build another framework's case";
  if (c.path.gradients.before_reduction)
    return "gradients.enter before_reduction: the field says where gradients enter Megatron-LM's path (tally's "
           "model and megatron-core); tally's worker does not build that choice for DeepSpeed: it always gives "
           "each rank's share to DeepSpeed's own reduction (docs/real-targets.md)";
  const std::optional<DeepSpeedConfig> d = kDeepSpeedSection.of(c);
  // The preset's transformers class holds sinks and multi-latent attention; the worker's own model does not.
  const bool family = d && builds_family(c, *d);
  if (m.mtp_num_layers > 0)
    return "model.mtp_num_layers: tally's worker does not build multi-token-prediction layers for DeepSpeed: "
           "transformers' DeepseekV3ForCausalLM, the class DeepSpeed's users train deepseek-v3 as, has none "
           "(transformers 5.18.0 builds them only for speculative decoding, MtpModel, modeling_layers.py:360)";
  if (m.softmax_type != topologies::SoftmaxType::vanilla && !family)
    return "model.softmax_type learnable: tally's worker does not build attention sinks outside a preset's "
           "transformers class (GptOssForCausalLM's, without PP, AutoEP or ZeRO 3, TP through AutoTP)";
  if (m.multi_latent_attention && !family)
    return "model.multi_latent_attention: tally's worker does not build multi-latent attention outside a preset's "
           "transformers class (DeepseekV3ForCausalLM's, without PP, AutoEP or ZeRO 3, TP through AutoTP)";
  if (topologies::uses_gtp(t))
    return "topology.gtp/egtp: generalized TP is megatron-core's; tally's worker does not build it for DeepSpeed";
  if (t.cp > 1)
    return "topology.cp: tally's worker does not build context (or DeepSpeed's Ulysses sequence) parallelism: it "
           "runs TP x DP x EP and PP";
  if (t.vpp > 1)
    return "topology.vpp: tally's worker does not build virtual pipeline stages: DeepSpeed's PipelineModule gives "
           "each stage one contiguous range of layers (deepspeed/runtime/pipe/module.py:447 at 0.19.8)";
  // DeepSpeed's grid is TP fastest, then DP, then PP (PipeModelDataParallelTopology), its expert
  // groups consecutive ranks of a DP group: tally's default order with CP 1.
  if (!topologies::has_default_order(t))
    return "topology.order " + t.order + ": tally's worker does not build other orders: its groups are TP "
           "fastest, then DP (tally's default order), and DeepSpeed makes its expert groups from them";
  if (t.dist_opt_instances > 1)
    return "topology.dist_opt_instances: Megatron's distributed-optimizer instances have no DeepSpeed counterpart; "
           "tally's worker does not build them";
  if (t.etp != 1 && t.etp != t.tp)
    return "topology.etp " + std::to_string(t.etp) + " with tp " + std::to_string(t.tp) +
           ": tally's worker does not build it: DeepSpeed's MoE layer holds its experts whole on every TP rank "
           "(etp 1) or splits them over the whole TP group (etp = tp, enable_expert_tensor_parallelism, "
           "deepspeed/moe/layer.py:52 at 0.19.8)";
  if (auto why = ep_refuses(t, m, d && d->autoep)) return why;
  if (o.optimizer != vocab::OptimizerModel::plain)
    return "optimizer.model " + std::string(vocab::optimizer_model_name(o.optimizer)) +
           ": Megatron's optimizers; tally's worker does not build them for DeepSpeed, whose optimizer the "
           "deepspeed section chooses (leave plain)";
  if (!o.p_values.empty())
    return "statistics.p_norms: tally's worker does not build other p-norms: DeepSpeed's engine reports the L2 "
           "norm";
  if (std::string why = unplantable(o.faults, plants); !why.empty())
    return "faults: tally's worker does not build a counterpart of " + why;
  // The worker's hello lists the dtypes DeepSpeed's accelerator supports, as the engine asks it.
  if (!computes_in(dtypes, o.gradients.generator.dtype)) {
    const std::string dtype(kernels::dtype_name(o.gradients.generator.dtype));
    const std::string where = o.gradients.generator.dtype == Dtype::fp16   ? "2004"
                              : o.gradients.generator.dtype == Dtype::bf16 ? "2007"
                                                                           : "";
    if (where.empty()) return "gradients.dtype " + dtype + ": tally's worker does not build it on this machine";
    return "gradients.dtype " + dtype + ": DeepSpeed's accelerator on this machine does not support it: the engine "
           "raises ValueError \"Type " + dtype + " is not supported on your device.\" (deepspeed/runtime/engine.py:" +
           where + " at 0.19.8)";
  }
  if (!d)
    return "deepspeed: the case has no DeepSpeed configuration (zero_stage, grad_accum_fp32, loss_scale); tally's "
           "worker does not build an engine without one";
  if (const auto it = cannot_run.find("deepspeed.fused_adam"); d->fused_adam && it != cannot_run.end())
    return "deepspeed.fused_adam: tally's worker does not build DeepSpeed's FusedAdam on this machine (" + it->second +
           ")";
  // A CPU worker's Trainer takes no bf16 (its hello says why: TrainingArguments' own check).
  if (const auto it = cannot_run.find("deepspeed.launcher");
      d->launcher == DeepSpeedLauncher::trainer && o.gradients.generator.dtype == Dtype::bf16 && it != cannot_run.end())
    return "deepspeed.launcher trainer with gradients.dtype bf16: not on this machine: " + it->second;
  if (megatron_model_rules)
    if (auto why = topologies::check_megatron_expert_bias(m, t))
      return "model: this worker builds models under Megatron-LM's rules (its hello's model_rules), so tally's "
             "worker does not build this one: " + *why;
  // Not a limit of DeepSpeed's: it would run the case, skip the step, and leave no norm to judge.
  if (o.gradients.generator.dtype == Dtype::fp16 &&
      largest_fp16_gradient(c, *d) >= kFp16Max)
    return "deepspeed.loss_scale " + std::to_string(d->loss_scale) +
           " with gradients.dtype fp16: the gradients (up to " + record::all_digits(vocab::largest_gradient(o.gradients)) +
           ") times the data-parallel size (" + std::to_string(data_parallel(t)) +
           ") times the loss scale exceed fp16's 65504, so DeepSpeed would skip the step on its overflow check "
           "(e.g. deepspeed/runtime/zero/stage_1_and_2.py:3050 at 0.19.8) and leave no norm to judge; lower the "
           "loss scale or use bf16";
  if (auto why = autotp_refuses(*d, t, m.num_experts)) return why;
  if (auto why = autoep_refuses(*d, t, m)) return why;
  if (auto why = launcher_refuses(*d, t, o.gradients.generator.dtype, m.num_experts)) return why;
  return engine_refuses(*d, o.gradients.generator.dtype, m.num_experts, t.pp);
}

casefile::Case within_deepspeed(casefile::Case c, std::string_view, const FaultPlants& plants, std::uint64_t draw,
                                const std::vector<std::string>& dtypes, bool megatron_model_rules,
                                const std::map<std::string, std::string>& cannot_run) {
  topologies::ModelSpec& m = c.model;
  topologies::ParallelConfig& t = c.topology;
  vocab::PathOptions& o = c.path;
  if (m.kind != topologies::ModelKind::gpt) return c;
  casefile::keep_only_section(c, kDeepSpeedSection.key);
  o.gradients.before_reduction = false;  // the worker always runs DeepSpeed's own reduction on shares
  // Sinks and multi-latent attention stay where the case becomes a preset's transformers class (below).
  const topologies::SoftmaxType softmax = m.softmax_type;
  const bool latent = m.multi_latent_attention;
  m.mtp_num_layers = 0;
  m.mtp_detach_heads = false;
  m.softmax_type = topologies::SoftmaxType::vanilla;
  m.multi_latent_attention = false;
  t.gtp = t.egtp = 1;
  t.tp *= t.cp;  // the ranks stay: CP folds into TP
  t.cp = 1;
  t.vpp = 1;
  t.order = std::string(topologies::kDefaultOrder);
  t.dist_opt_instances = 1;
  o.optimizer = vocab::OptimizerModel::plain;
  o.p_values.clear();
  if (!unplantable(o.faults, plants).empty()) o.faults = {};
  // Named on the stages alone: logical names do not depend on the sharding, and TP is not settled
  // yet. A generated case's stages hold (VPP 1 only loosens them); another's fold into DP.
  topologies::ParallelConfig stages{.world = t.pp, .pp = t.pp};
  if (topologies::check_model(m, stages)) {
    t.pp = 1;
    m.first_stage_layers.reset();
    m.last_stage_layers.reset();
    stages = {};
  }
  // A pipeline stage without MoE layers deadlocks DeepSpeed's norm at ZeRO 1, in BF16_Optimizer and FP16_Optimizer
  // (docs/findings/deepspeed-0.19.8-pipeline-stage-without-moe-deadlocks-norm.md): each such case
  // would cost a campaign its case timeout, so PP folds into DP for such a model.
  if (t.pp > 1 && m.num_experts > 0 && !every_stage_holds_experts(m, stages)) {
    t.pp = 1;
    m.first_stage_layers.reset();
    m.last_stage_layers.reset();
    stages = {};
  }
  casefile::drop_stated_gradients_without_a_param(c, stages);
  const bool pipelined = t.pp > 1;
  const bool fused_adam_runs = !cannot_run.contains("deepspeed.fused_adam");
  std::uint64_t path_draws = 1;  // how many engine paths `draw` chose among (its later bits draw the rest)
  const bool drawn_section = !kDeepSpeedSection.of(c);
  if (drawn_section) {
    std::vector<EnginePath> paths;
    for (const EnginePath& path : kEnginePaths)
      if (computes_in(dtypes, path.dtype) && (fused_adam_runs || !path.fused_adam) && (!pipelined || pipelines(path)) &&
          shows(o.faults, path, pipelined))
        paths.push_back(path);
    if (paths.empty()) paths.push_back(kEnginePaths[0]);  // fp32 at ZeRO 0 runs everywhere
    path_draws = paths.size();
    const EnginePath& path = paths[draw % path_draws];
    o.gradients.generator.dtype = path.dtype;
    // Half of the cases AutoTP (or AutoEP) can take shard with it (the other half with the worker's
    // mpu, or DeepSpeed's MoE layer).
    const bool auto_sharded = (draw / path_draws) % 2 == 1;
    // In the case before it settles: a DeepSpeed case is not held to Megatron-LM's model rules.
    kDeepSpeedSection.set(c, {.zero_stage = path.zero_stage,
                             .grad_accum_fp32 = path.grad_accum_fp32,
                             .autotp = auto_sharded,
                             .autoep = auto_sharded,
                             .fused_adam = path.fused_adam,
                             .offload_optimizer = path.offload_optimizer});
  }
  // TP (and ETP, where the experts are split) must divide the model's split dims as Megatron's
  // would: with expert TP if the case had it, else without, else halve TP.
  const auto settle = [&](int etp) {
    t.etp = etp;
    if (m.num_experts == 0) t.ep = 1;
    while (t.ep > 1 && !ep_fits(t, m)) t.ep /= 2;
    return !casefile::check_case(c);
  };
  const bool expert_tp = t.etp != 1;
  while (!(expert_tp && settle(t.tp)) && !settle(1) && t.tp > 1) t.tp /= 2;
  // Expert biases with expert TP: Megatron refuses them (so tally's generator makes none), DeepSpeed's
  // MoE layer takes them (FC1's bias split over TP, FC2's whole on every TP rank). Half such cases
  // get them.
  if (!megatron_model_rules && m.num_experts > 0 && t.etp > 1 && !m.add_bias_linear &&
      (draw / path_draws / 2) % 2 == 1) {
    m.add_bias_linear = true;
    if (casefile::check_case(c)) m.add_bias_linear = false;
  }
  // A case that came with them, for a worker under Megatron's rules: without them.
  if (megatron_model_rules && topologies::check_megatron_expert_bias(m, t)) {
    m.add_bias_linear = false;
    casefile::drop_stated_gradients_without_a_param(c, stages);
  }
  DeepSpeedConfig d = *kDeepSpeedSection.of(c);
  if (!fused_adam_runs) d.fused_adam = false;
  if (autotp_refuses(d, t, m.num_experts)) d.autotp = false;
  // DeepSpeed runs experts at ZeRO 3 only with AutoEP. AutoEP's experts are SwiGLU without
  // biases: a model it would take but for those becomes one. With TP it folds over AutoTP.
  if (d.zero_stage == 3 && m.num_experts > 0) {
    d.autoep = true;
    if (t.tp > 1 && t.etp == 1 && t.ep > 1) d.autotp = true;
  }
  topologies::ModelSpec with_autoep_experts = m;
  with_autoep_experts.swiglu = true;
  with_autoep_experts.add_bias_linear = false;
  if (d.autoep && with_autoep_experts != m && !autoep_refuses(d, t, with_autoep_experts)) {
    m = with_autoep_experts;
    casefile::drop_stated_gradients_without_a_param(c, stages);
  }
  if (autoep_refuses(d, t, m)) d.autoep = false;
  if (autotp_refuses(d, t, m.num_experts)) d.autotp = false;  // AutoTP takes experts only folded with AutoEP
  if (d.zero_stage == 3 && m.num_experts > 0 && !d.autoep) d.zero_stage = 2;
  if (pipelined) d.zero_stage = std::min(d.zero_stage, 1);
  // fp16 within range: a lower loss scale (a power of two), else bf16.
  while (o.gradients.generator.dtype == Dtype::fp16 && d.loss_scale > 1 &&
         largest_fp16_gradient(c, d) >= kFp16Max)
    d.loss_scale /= 2;
  if (o.gradients.generator.dtype == Dtype::fp16 && largest_fp16_gradient(c, d) >= kFp16Max)
    o.gradients.generator.dtype = Dtype::bf16;
  if (!computes_in(dtypes, o.gradients.generator.dtype)) o.gradients.generator.dtype = Dtype::bf16;
  if (!computes_in(dtypes, o.gradients.generator.dtype)) o.gradients.generator.dtype = Dtype::fp32;
  if (engine_refuses(d, o.gradients.generator.dtype, m.num_experts, t.pp)) d.grad_accum_fp32 = false;
  // A Hugging Face user's engine (accelerate's prepare, the Trainer's) where accelerate builds the case.
  if (drawn_section) d.launcher = static_cast<DeepSpeedLauncher>((draw / path_draws / 4) % std::size(kDeepSpeedLauncherNames));
  if (launcher_refuses(d, t, o.gradients.generator.dtype, m.num_experts) ||
      (d.launcher == DeepSpeedLauncher::trainer && o.gradients.generator.dtype == Dtype::bf16 &&
       cannot_run.contains("deepspeed.launcher")))
    d.launcher = DeepSpeedLauncher::deepspeed;
  kDeepSpeedSection.set(c, d);
  // A preset built as its transformers class keeps the sinks (GptOssForCausalLM) and multi-latent
  // attention (DeepseekV3ForCausalLM) the worker's own model lacks; its MTP stays out, as the class has none.
  if (builds_family(c, d) && (softmax != m.softmax_type || latent != m.multi_latent_attention)) {
    casefile::Case with = c;
    with.model.softmax_type = softmax;
    with.model.multi_latent_attention = latent;
    if (!casefile::check_case(with)) return with;
  }
  return c;
}

std::string deepspeed_norm_code(const casefile::Case& c) {
  const DeepSpeedConfig d = kDeepSpeedSection.of(c).value_or(DeepSpeedConfig{});
  const bool sixteen = c.path.gradients.generator.dtype != Dtype::fp32;
  // With pipeline parallelism, bf16 at ZeRO 0 is BF16_Optimizer too (DeepSpeed's sanity check).
  const bool pipelined_bf16 = c.topology.pp > 1 && d.zero_stage == 0 && c.path.gradients.generator.dtype == Dtype::bf16;
  std::string code = (d.zero_stage == 1 && d.grad_accum_fp32 && sixteen) || pipelined_bf16 ? "BF16_Optimizer"
                     : d.zero_stage == 0 ? (!sixteen ? "clip_grad_norm_" : d.fused_adam ? "FP16_Optimizer" : "FP16_UnfusedOptimizer")
                     : d.zero_stage == 3 ? "DeepSpeedZeroOptimizer_Stage3"
                     : d.offload_optimizer ? "DeepSpeedZeroOptimizer CPU offload"
                                           : "DeepSpeedZeroOptimizer";
  // AutoTP and AutoEP shard the model with DeepSpeed's own code: a defect there is theirs.
  if (d.autotp) code += " with AutoTP";
  if (d.autoep) code += d.autotp ? " and AutoEP" : " with AutoEP";
  // The same code through a Hugging Face user's engine: a finding of the code's matches it too.
  if (d.launcher == DeepSpeedLauncher::accelerate) code += " through accelerate";
  if (d.launcher == DeepSpeedLauncher::trainer) code += " through the Trainer";
  return code;
}

std::vector<std::pair<std::string, casefile::Case>> deepspeed_sweep_variants(const casefile::Case& base) {
  std::vector<std::pair<std::string, casefile::Case>> out;
  for (int stage = 0; stage <= 3; ++stage)
    for (kernels::Dtype dtype : {kernels::Dtype::fp32, kernels::Dtype::bf16}) {
      casefile::Case c = base;
      c.path.optimizer = vocab::OptimizerModel::plain;
      c.path.gradients.generator.dtype = dtype;
      kDeepSpeedSection.set(c, {.zero_stage = stage});
      out.emplace_back("zero" + std::to_string(stage) + "-" + std::string(kernels::dtype_name(dtype)), std::move(c));
    }
  return out;
}

}  // namespace tally::run
