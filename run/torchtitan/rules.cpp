#include "run/torchtitan/rules.h"

#include <algorithm>

#include "run/target.h"
#include "run/torchtitan/section.h"
#include "topologies/logical_model.h"
#include "topologies/model_spec.h"
#include "vocab/faults.h"

namespace tally::run {

namespace {


// The ranks torchtitan's sparse mesh splits into EP x efsdp: dp_shard x cp x tp (ParallelDims:
// efsdp = dp_shard * cp * tp / ep); dp_replicate stays outside.
int expert_ranks(const topologies::ParallelConfig& t, int dp_replicate) {
  return topologies::dp(t) / std::max(1, dp_replicate) * t.cp * t.tp;
}

bool ep_fits(const topologies::ParallelConfig& t, const topologies::ModelSpec& m, int dp_replicate) {
  if (m.num_experts == 0) return t.ep == 1;
  return m.num_experts % t.ep == 0 && expert_ranks(t, dp_replicate) % t.ep == 0;
}

// FSDP2 shards routed experts on dim 1 where the ranks of their FSDP and EP meshes outnumber the
// experts (torchtitan/distributed/fsdp.py, apply_fsdp_to_decoder), and fully_shard refuses a dim
// other than 0 that its shard ranks do not divide. The first expert param that would be split so,
// as one line; nullopt when none.
std::optional<std::string> fsdp_refuses_experts(const casefile::Case& c, const TorchTitanConfig& d) {
  const topologies::ModelSpec& m = c.model;
  const topologies::ParallelConfig& t = c.topology;
  if (m.num_experts == 0) return std::nullopt;
  const int dp_replicate = d.dp_replicate;
  const int dp_shard = topologies::dp(t) / std::max(1, dp_replicate);
  const bool full = d.spmd_backend == SpmdBackend::full_dtensor;
  // The FSDP-and-EP ranks torchtitan compares with the experts, and the ranks FSDP shards over.
  const int efsdp_ep = t.ep > 1 ? dp_shard * t.cp * t.tp : dp_replicate * dp_shard * t.cp * (full ? t.tp : 1);
  const int shard = t.ep > 1 ? dp_shard * t.cp * t.tp / t.ep : dp_shard * t.cp;
  if (efsdp_ep <= m.num_experts || shard == 1) return std::nullopt;
  const topologies::LogicalModel model(m, topologies::ParallelConfig{.world = t.pp, .pp = t.pp});
  // torchtitan's own qwen3 and deepseek_v3 models hold a gated linear_fc1 as two stacked params, its
  // gate and up halves (w1_EFD, w3_EFD: torchtitan/models/common/moe.py:45-56); gpt_oss's mlp1 and
  // the worker's own decoder hold it whole.
  const std::string_view family = torchtitan_family(c);
  const bool fc1_halves = m.swiglu && (family == "qwen3" || family == "deepseek_v3");
  for (const topologies::LogicalParam& p : model.params()) {
    if (p.expert != 0) continue;
    // Each expert's first dim in the stacked tensor, as this rank holds it: split over TP without EP.
    const bool tp_split_rows = t.ep == 1 && (p.param_class == topologies::ParamClass::expert_column ||
                                             p.param_class == topologies::ParamClass::expert_column_bias);
    const bool halves = fc1_halves && p.param_class == topologies::ParamClass::expert_column;
    const std::int64_t rows = p.shape[0] / (halves ? 2 : 1) / (tp_split_rows ? t.tp : 1);
    if (rows % shard != 0)
      return "model: " + p.name + " (" + std::to_string(rows) + " rows per expert on each rank" +
             (halves ? " in each of torchtitan's w1_EFD and w3_EFD, its halves" : "") + "): torchtitan has FSDP2 "
             "shard the routed experts on dim 1 where the FSDP and EP ranks (" + std::to_string(efsdp_ep) +
             ") outnumber the experts (" + std::to_string(m.num_experts) + ") (torchtitan/distributed/fsdp.py:230), "
             "and fully_shard raises NotImplementedError (\"FSDP does not support uneven sharding on dim 1\", "
             "torch/distributed/fsdp/_fully_shard/_fsdp_param.py:344) where its " + std::to_string(shard) +
             " shard ranks do not divide them";
  }
  return std::nullopt;
}

bool pipeline_fault(vocab::Fault f) {
  using vocab::Fault;
  return f == Fault::missing_pp_reduction || f == Fault::average_rank_norms || f == Fault::clip_per_stage_norm;
}

bool expert_fault(vocab::Fault f) {
  using vocab::Fault;
  return f == Fault::expert_norm_dropped || f == Fault::missing_ep_reduction || f == Fault::clip_per_child_norm;
}

template <typename Pred>
bool any_fault(const vocab::FaultSet& faults, Pred pred) {
  for (const vocab::FaultInfo& info : vocab::fault_catalog())
    if (faults.has(info.fault) && pred(info.fault)) return true;
  return false;
}

// Where the case asks for torch.nn.utils.clip_grad_norm_ and cannot have it: DTensor refuses it with EP;
// with PP torch's clip runs, but per stage (a known misuse, not a case); a fault planted in torchtitan's
// clip is not in torch's.
std::optional<std::string> torch_clip_refuses(const casefile::Case& c, const TorchTitanConfig& d) {
  if (d.clip != DTensorClip::torch) return std::nullopt;
  if (c.topology.pp > 1)
    return "torchtitan.clip torch with topology.pp " + std::to_string(c.topology.pp) +
           ": tally's worker does not build it: torch.nn.utils.clip_grad_norm_ runs but has no pipeline group, so "
           "each stage would clip by its own norm (torchtitan #596, the reason torchtitan has its own "
           "clip_grad_norm_, torchtitan/distributed/utils.py:599); use clip torchtitan";
  if (c.topology.ep > 1)
    return "torchtitan.clip torch with topology.ep " + std::to_string(c.topology.ep) +
           ": torch.nn.utils.clip_grad_norm_ stacks the norms of DTensors on two meshes (the experts' sparse mesh "
           "and the dense one), and DTensor raises RuntimeError (\"All operands in aten.stack.default must have the "
           "same mesh\": torch/nn/utils/clip_grad.py:106, torch/distributed/tensor/_ops/_tensor_ops.py:721); "
           "torchtitan's clip splits them (clip torchtitan)";
  // The pipeline and expert faults are planted in torchtitan's clip; grads-averaged-twice in FSDP2's
  // reduction, which runs under either clip.
  for (const vocab::FaultInfo& info : vocab::fault_catalog())
    if (c.path.faults.has(info.fault) && (pipeline_fault(info.fault) || expert_fault(info.fault)))
      return "faults " + std::string(info.name) + " with torchtitan.clip torch: tally's worker does not build it "
             "into torch's clip (it plants it in torchtitan's clip_grad_norm_)";
  return std::nullopt;
}

}  // namespace

std::optional<std::string> torchtitan_refusal(const casefile::Case& c, std::string_view,
                                                  const FaultPlants& plants) {
  const topologies::ModelSpec& m = c.model;
  const topologies::ParallelConfig& t = c.topology;
  const vocab::PathOptions& o = c.path;
  if (m.kind != topologies::ModelKind::gpt)
    return "model.kind custom: tally's worker does not build a custom layout as a torchtitan decoder (it builds "
           "tally's GPT/MoE family)";
  if (auto why = other_frameworks_section(c, "torchtitan")) return why;
  if (c.path.gradients.before_reduction)
    return "gradients.enter before_reduction: the field says where gradients enter Megatron-LM's path (tally's "
           "model and megatron-core); torchtitan's is torchtitan.gradients_enter";
  // MTP and multi-latent attention are torchtitan's deepseek_v3 model's, which the worker builds for
  // the deepseek-v3 preset on one stage; its own decoder has neither. Attention sinks it places as
  // gpt_oss shards them, Shard(0) over TP (models/gpt_oss/sharding.py:104), the split of their class.
  const bool deepseek_v3 = torchtitan_family(c) == "deepseek_v3";
  if (m.mtp_num_layers > 0 && !deepseek_v3)
    return "model.mtp_num_layers " + std::to_string(m.mtp_num_layers) +
           ": tally's worker does not build a multi-token-prediction block in its torchtitan decoder; it builds "
           "torchtitan's own deepseek_v3 model, which has one, for model.preset deepseek-v3 on one pipeline stage";
  if (m.multi_latent_attention && !deepseek_v3)
    return "model.multi_latent_attention: tally's worker does not build multi-latent attention in its torchtitan "
           "decoder; it builds torchtitan's own deepseek_v3 model, which has it, for model.preset deepseek-v3 on "
           "one pipeline stage";
  // Megatron's own fields, with no torchtitan counterpart: not a torchtitan limit.
  if (topologies::uses_gtp(t))
    return "topology.gtp/egtp: generalized TP is megatron-core's (torchtitan's parallelism has no such degree); "
           "tally's worker does not build it";
  if (t.vpp > 1)
    return "topology.vpp " + std::to_string(t.vpp) + ": tally's worker does not build torchtitan's looped pipeline "
           "schedules (several model parts per rank) yet; it builds one part per pipeline rank";
  // torchtitan has no order option: ParallelDims unflattens the world as (pp, dp_replicate, dp_shard, cp, tp).
  if (!topologies::has_default_order(t))
    return "topology.order " + t.order + ": torchtitan's ParallelDims.build_mesh unflattens the world as (pp, "
           "dp_replicate, dp_shard, cp, tp), TP fastest, whatever the job (torchtitan/distributed/"
           "parallel_dims.py:297; :330 under partial_dtensor): tally's default order";
  if (t.dist_opt_instances > 1)
    return "topology.dist_opt_instances: Megatron's distributed-optimizer instances, which tally's worker does not "
           "build for torchtitan; HSDP's replicate degree is torchtitan.dp_replicate";
  if (o.optimizer != vocab::OptimizerModel::plain)
    return "optimizer.model " + std::string(vocab::optimizer_model_name(o.optimizer)) +
           ": Megatron's optimizers, which tally's worker does not build for torchtitan; the norm is torchtitan's "
           "or torch's clip over the DTensor params (leave plain)";
  if (!o.p_values.empty())
    return "statistics.p_norms: tally's worker does not build norms other than L2 yet (torchtitan's "
           "clip_grad_norm_ takes a norm_type)";
  // torchtitan holds fp32 gradients by default and bf16 ones under training.dtype bfloat16: the limit is
  // tally's tolerance, not torchtitan.
  if (o.gradients.generator.dtype != kernels::Dtype::fp32)
    return "gradients.dtype " + std::string(kernels::dtype_name(o.gradients.generator.dtype)) +
           ": tally's worker does not build 16-bit gradients: torchtitan's FSDP2 holds them in fp32 by default "
           "(mixed_precision_reduce float32), 16-bit only under training.dtype bfloat16, where torch computes "
           "their norm in 16 bits, a rounding tally's relative tolerance does not model";
  if (std::string why = unplantable(o.faults, plants); !why.empty())
    return "faults: tally's worker does not build (plant) a counterpart of " + why;
  const std::optional<TorchTitanConfig> d = kTorchTitanSection.of(c);
  if (!d) return "torchtitan: the case has no torchtitan configuration (clip, spmd_backend, dp_replicate)";
  const int dp_replicate = d->dp_replicate;
  // tally writes dp_shard = DP / dp_replicate into the job config, as torchtitan's ParallelDims takes it.
  if (topologies::dp(t) % dp_replicate != 0)
    return "torchtitan.dp_replicate " + std::to_string(dp_replicate) + ": must divide the data-parallel size " +
           std::to_string(topologies::dp(t)) + " (HSDP: dp_replicate x dp_shard): torchtitan's ParallelDims "
           "asserts dp_replicate x dp_shard x cp x tp x pp == WORLD_SIZE (\"Invalid parallel dims\", "
           "torchtitan/distributed/parallel_dims.py:186; \"dp_shard must -1 or >=1\", :181, where it exceeds DP)";
  // torchtitan 0.3 has no expert-TP degree: its MoE sharding places the experts by whether EP is on.
  if (m.num_experts > 0 && t.ep > 1 && t.etp != 1)
    return "topology.etp " + std::to_string(t.etp) + " with ep " + std::to_string(t.ep) +
           ": torchtitan 0.3 has no expert-TP degree; with EP it places each routed expert whole on its EP rank "
           "(Shard(0) over ep alone: torchtitan/models/common/moe_sharding.py:208); set etp 1";
  if (m.num_experts > 0 && t.ep == 1 && t.etp != t.tp)
    return "topology.etp " + std::to_string(t.etp) + " with ep 1 and tp " + std::to_string(t.tp) +
           ": torchtitan 0.3 has no expert-TP degree; without EP it splits the routed experts over TP as the dense "
           "MLP (torchtitan/models/common/moe_sharding.py:215): etp = tp";
  if (m.num_experts > 0 && t.ep > 1 && expert_ranks(t, dp_replicate) % t.ep != 0)
    return "topology.ep " + std::to_string(t.ep) + ": must divide dp_shard x cp x tp (" +
           std::to_string(expert_ranks(t, dp_replicate)) + "), the ranks torchtitan's sparse mesh splits into "
           "efsdp x ep: ParallelDims.build_mesh unflattens the world as (pp, dp_replicate, efsdp, ep) "
           "(torchtitan/distributed/parallel_dims.py:336), and torch raises ValueError (\"The product of "
           "mesh_sizes ... must be equal\", torch/distributed/device_mesh.py:1463)";
  // torchtitan checks it nowhere; its EP token dispatch fails in the forward.
  if (m.num_experts > 0 && t.ep > 1 && m.num_experts % t.ep != 0)
    return "topology.ep " + std::to_string(t.ep) + ": must divide the experts (" + std::to_string(m.num_experts) +
           "): torchtitan's all-to-all token dispatch views the per-expert token counts as (ep, experts / ep), a "
           "RuntimeError in the forward (torchtitan/models/common/token_dispatcher.py:262)";
  if (t.pp > 1 && !m.untie_embeddings_and_output_weights)
    return "model.untie_embeddings_and_output_weights false with topology.pp " + std::to_string(t.pp) +
           ": torchtitan raises NotImplementedError (\"Weight tying is not supported with Pipeline Parallel.\", "
           "torchtitan/models/common/decoder.py:140)";
  if (auto why = fsdp_refuses_experts(c, *d)) return why;
  return torch_clip_refuses(c, *d);
}

casefile::Case within_torchtitan(casefile::Case c, const FaultPlants& plants, std::uint64_t draw) {
  topologies::ModelSpec& m = c.model;
  topologies::ParallelConfig& t = c.topology;
  vocab::PathOptions& o = c.path;
  if (m.kind != topologies::ModelKind::gpt) return c;
  casefile::keep_only_section(c, kTorchTitanSection.key);
  c.path.gradients.before_reduction = false;  // torchtitan's stage is its section's gradients_enter
  // The deepseek-v3 preset keeps its MTP and multi-latent attention on one stage (torchtitan's own
  // deepseek_v3 model builds them); any other case is the worker's decoder, which has neither.
  const bool deepseek_v3 = m.preset == "deepseek-v3";
  if (!deepseek_v3) {
    m.mtp_num_layers = 0;
    m.mtp_detach_heads = false;
    m.multi_latent_attention = false;
  }
  t.gtp = t.egtp = 1;
  t.vpp = 1;
  t.order = std::string(topologies::kDefaultOrder);
  t.dist_opt_instances = 1;
  o.optimizer = vocab::OptimizerModel::plain;
  o.p_values.clear();
  o.gradients.generator.dtype = kernels::Dtype::fp32;
  if (!unplantable(o.faults, plants).empty()) o.faults = {};
  // A planted pipeline fault shows only across stages: two where the world and the layers allow.
  if (t.pp == 1 && any_fault(o.faults, pipeline_fault) && t.world % 2 == 0 && t.tp * t.cp * 2 <= t.world) {
    topologies::ParallelConfig piped = t;
    piped.pp = 2;
    if (!topologies::check_model(m, topologies::ParallelConfig{.world = 2, .pp = 2})) t = piped;
  }
  // Named on the stages alone: logical names do not depend on the sharding.
  topologies::ParallelConfig stages{.world = t.pp, .pp = t.pp};
  if (topologies::check_model(m, stages)) {
    t.pp = 1;
    m.first_stage_layers.reset();
    m.last_stage_layers.reset();
    stages = {};
  }
  if (deepseek_v3 && t.pp > 1) {
    t.pp = 1;
    m.first_stage_layers.reset();
    m.last_stage_layers.reset();
    stages = {};
  }
  if (t.pp > 1) m.untie_embeddings_and_output_weights = true;
  casefile::drop_stated_gradients_without_a_param(c, stages);
  std::uint64_t rest = draw;
  const std::optional<TorchTitanConfig> stated = kTorchTitanSection.of(c);
  const bool drawn = !stated;
  TorchTitanConfig d = stated.value_or(TorchTitanConfig{});
  if (drawn) {
    // A quarter of the cases torch's clip runs, as most FSDP2 users call it.
    d.clip = rest % 4 == 3 ? DTensorClip::torch : DTensorClip::torchtitan;
    rest /= 4;
    d.spmd_backend = rest % 2 == 1 ? SpmdBackend::partial_dtensor : SpmdBackend::full_dtensor;
    rest /= 2;
  }
  // A planted expert fault shows only across EP ranks.
  if (m.num_experts > 0 && t.ep == 1 && any_fault(o.faults, expert_fault)) t.ep = 2;
  // TP must divide the model's split dims, EP the experts and the ranks its mesh splits; torchtitan's
  // experts are whole per EP rank with EP, and split over TP without it.
  const auto settle = [&]() {
    if (topologies::dp(t) % d.dp_replicate != 0) d.dp_replicate = 1;
    if (m.num_experts == 0) t.ep = 1;
    while (t.ep > 1 && !ep_fits(t, m, d.dp_replicate)) t.ep /= 2;
    t.etp = t.ep > 1 || m.num_experts == 0 ? 1 : t.tp;
    return !casefile::check_case(c);
  };
  while (!settle() && t.tp > 1) t.tp /= 2;
  // HSDP: a drawn section replicates over a divisor of DP, where EP keeps the ranks a fault needs.
  if (drawn) {
    const int dp = topologies::dp(t);
    std::vector<int> divisors;
    for (int r = 1; r <= dp; ++r)
      if (dp % r == 0) divisors.push_back(r);
    const int replicate = divisors[rest % divisors.size()];
    rest /= divisors.size();
    if (ep_fits(t, m, replicate) || !any_fault(o.faults, expert_fault)) {
      d.dp_replicate = replicate;
      settle();
    }
    // Half the cases give FSDP2 each rank's contribution, for its own reduce-scatter to sum; a
    // reduction fault changes nothing otherwise.
    d.before_reduction = rest % 2 == 1 || vocab::any_reduction_fault(o.faults);
  }
  // Experts FSDP would split unevenly on dim 1: replicate over more of DP (HSDP), which shards over
  // fewer ranks, until it divides them.
  while (fsdp_refuses_experts(c, d) && d.dp_replicate < topologies::dp(t)) {
    d.dp_replicate *= 2;
    if (topologies::dp(t) % d.dp_replicate != 0) d.dp_replicate = topologies::dp(t);
    settle();
  }
  // Else as many experts as those ranks: FSDP then shards them on dim 0, which may be uneven.
  if (fsdp_refuses_experts(c, d)) {
    const int dp_shard = topologies::dp(t) / d.dp_replicate;
    m.num_experts = t.ep > 1 ? dp_shard * t.cp * t.tp : d.dp_replicate * dp_shard * t.cp *
                    (d.spmd_backend == SpmdBackend::full_dtensor ? t.tp : 1);
  }
  if (torch_clip_refuses(c, d)) d.clip = DTensorClip::torchtitan;
  kTorchTitanSection.set(c, d);
  return c;
}

std::string torchtitan_norm_code(const casefile::Case& c) {
  const TorchTitanConfig d = kTorchTitanSection.of(c).value_or(TorchTitanConfig{});
  const std::string code = d.clip == DTensorClip::torch ? "torch.nn.utils.clip_grad_norm_"
                           : c.topology.ep > 1          ? "torchtitan _clip_grad_norm_with_ep"
                                                        : "torchtitan clip_grad_norm_";
  return code + " on " + std::string(spmd_backend_name(d.spmd_backend));
}

std::vector<std::pair<std::string, casefile::Case>> torchtitan_sweep_variants(const casefile::Case& base) {
  std::vector<std::pair<std::string, casefile::Case>> out;
  for (DTensorClip clip : {DTensorClip::torchtitan, DTensorClip::torch})
    for (SpmdBackend backend : {SpmdBackend::full_dtensor, SpmdBackend::partial_dtensor})
      for (int dp_replicate : {1, 2})  // FSDP, and HSDP replicating over two (refused where DP is odd)
        for (bool before_reduction : {false, true}) {
          casefile::Case c = base;
          c.path.optimizer = vocab::OptimizerModel::plain;
          c.path.gradients.generator.dtype = kernels::Dtype::fp32;
          kTorchTitanSection.set(c, {.clip = clip,
                                    .spmd_backend = backend,
                                    .dp_replicate = dp_replicate,
                                    .before_reduction = before_reduction});
          out.emplace_back(std::string(dtensor_clip_name(clip)) + "-" +
                               std::string(spmd_backend_name(backend)) + (dp_replicate > 1 ? "-hsdp" : "") +
                               (before_reduction ? "-unreduced" : ""),
                           std::move(c));
        }
  return out;
}

std::optional<ReductionGroups> torchtitan_reduction_groups(const casefile::Case& c) {
  const std::optional<TorchTitanConfig> d = kTorchTitanSection.of(c);
  if (!d || !d->before_reduction) return std::nullopt;
  const topologies::ParallelConfig& t = c.topology;
  const int stage_ranks = t.world / std::max(1, t.pp);
  const int fsdp_ranks = stage_ranks / std::max(1, t.tp);
  ReductionGroups groups{{fsdp_ranks}, 1};
  // A param TP replicates has a Partial gradient under torchtitan's sequence parallelism, which
  // FSDP2 all-reduces over TP before its reduce-scatter: its group is the stage's every rank.
  if (t.tp > 1) groups.add(stage_ranks);
  if (c.model.num_experts > 0 && t.ep > 1) groups.add(stage_ranks / t.ep);
  return groups;
}

nlohmann::ordered_json torchtitan_job_config(const casefile::Case& c) {
  const TorchTitanConfig d = kTorchTitanSection.of(c).value_or(TorchTitanConfig{});
  const topologies::ParallelConfig& t = c.topology;
  const int dp = topologies::dp(t);
  return {{"parallelism",
           {{"data_parallel_replicate_degree", d.dp_replicate},
            {"data_parallel_shard_degree", dp / std::max(1, d.dp_replicate)},
            {"context_parallel_degree", t.cp},
            {"tensor_parallel_degree", t.tp},
            {"pipeline_parallel_degree", t.pp},
            {"expert_parallel_degree", t.ep},
            {"spmd_backend", std::string(spmd_backend_name(d.spmd_backend))}}},
          {"training", {{"max_norm", c.path.max_norm}}},
          {"clip", std::string(dtensor_clip_name(d.clip))}};
}

std::string_view torchtitan_family(const casefile::Case& c) {
  if (c.topology.pp != 1) return {};
  const std::string& preset = c.model.preset;
  if (preset == "llama3") return "llama3";
  if (preset == "qwen3-moe") return "qwen3";
  if (preset == "gpt-oss") return "gpt_oss";
  if (preset == "deepseek-v3") return "deepseek_v3";
  return {};  // mixtral: torchtitan 0.3.0 has no such family (torchtitan/models)
}

std::string torchtitan_model_description(const casefile::Case& c) {
  const TorchTitanConfig d = kTorchTitanSection.of(c).value_or(TorchTitanConfig{});
  const int dp = topologies::dp(c.topology);
  if (const std::string_view family = torchtitan_family(c); !family.empty())
    return "torchtitan's own " + std::string(family) + " model (preset " + c.model.preset +
           ") by its sharding config and parallelize on " + std::string(spmd_backend_name(d.spmd_backend)) +
           " meshes (dp_replicate " + std::to_string(d.dp_replicate) + ", dp_shard " +
           std::to_string(dp / std::max(1, d.dp_replicate)) + ", cp " + std::to_string(c.topology.cp) + ", tp " +
           std::to_string(c.topology.tp) + ", ep " + std::to_string(c.topology.ep) + "), FSDP2 by " +
           (family == "deepseek_v3" ? "apply_fsdp_to_mtp_decoder" : "apply_fsdp_to_decoder") + ", the norm by " +
           torchtitan_norm_code(c);
  return "tally's GPT/MoE as a torchtitan decoder on " + std::string(spmd_backend_name(d.spmd_backend)) +
         " meshes (dp_replicate " + std::to_string(d.dp_replicate) + ", dp_shard " +
         std::to_string(dp / std::max(1, d.dp_replicate)) + ", cp " + std::to_string(c.topology.cp) + ", tp " +
         std::to_string(c.topology.tp) + ", pp " + std::to_string(c.topology.pp) + ", ep " +
         std::to_string(c.topology.ep) + "), FSDP2 by apply_fsdp_to_decoder, the norm by " + torchtitan_norm_code(c);
}

}  // namespace tally::run
