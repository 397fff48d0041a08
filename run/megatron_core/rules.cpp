#include "run/megatron_core/rules.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <vector>

#include "vocab/faults.h"
#include "run/megatron_core/section.h"
#include "run/target.h"
#include "topologies/logical_model.h"
#include "topologies/parallel_config.h"
#include "topologies/rank_layout.h"

namespace tally::run {

bool megatron_core_older_than(std::string_view version, int major, int minor) {
  int got_major = 0, got_minor = 0;
  const char* end = version.data() + version.size();
  auto [after_major, e1] = std::from_chars(version.data(), end, got_major);
  if (e1 != std::errc{} || after_major == end || *after_major != '.') return false;
  auto [after_minor, e2] = std::from_chars(after_major + 1, end, got_minor);
  if (e2 != std::errc{}) return false;
  return got_major < major || (got_major == major && got_minor < minor);
}

namespace {

// Where a refusal names megatron-core's own code: `path`:`line_0161` at 0.16.1 for the releases
// before 0.19, `path`:`line_0192` at 0.19.2 from 0.19 on, both for "" (the rules of every release).
std::string cite(std::string_view path, std::string_view line_0161, std::string_view line_0192,
                 std::string_view version) {
  const std::string at_0161 = ":" + std::string(line_0161) + " at 0.16.1";
  const std::string at_0192 = ":" + std::string(line_0192) + " at 0.19.2";
  if (version.empty()) return std::string(path) + at_0161 + ", " + at_0192;
  return std::string(path) + (megatron_core_older_than(version, 0, 19) ? at_0161 : at_0192);
}

// megatron-core before 0.19: get_megatron_muon_optimizer without LayerWise removes the expert
// param groups with list.remove (muon.py:287 at 0.16.1), which compares the dense group's dict with
// the expert one's and so their `params` lists: where a rank holds as many dense matrices as expert
// ones it compares tensors and raises (RuntimeError), elsewhere it runs. tally's worker builds
// neither there.
bool muon_refuses_experts(std::string_view version) { return megatron_core_older_than(version, 0, 19); }

// Both uneven stages set, no middle stage, several chunks per stage: Megatron computes the
// layers of a middle-stage chunk as 0 and divides by them.
bool uneven_without_middle_chunks(const casefile::Case& c) {
  return c.model.first_stage_layers && c.model.last_stage_layers && c.topology.pp == 2 && c.topology.vpp > 1;
}

// The releases whose worker build of attention sinks has run on a GPU and agreed with tally's model
// of the release: 0.19.2 (an H100 on 2026-12-06: sink-only gradients of 1 give 1.4142135 for 2 at
// TP 2 and 1.0 at TP 4, and pass at TP 1; docs/real-targets.md). "" (the rules of every release):
// some release runs them.
bool sinks_built_on_a_gpu(std::string_view version) { return version.empty() || version == "0.19.2"; }

// Whether the case's rank order gives Megatron-FSDP's adapter other groups than the default order
// does. The adapter lays its meshes out as the default order does (TP innermost, then EP, then
// DP x CP, the instances outermost: mcore_fsdp_adapter.py _get_dp_tp_mesh, _get_hsdp_tp_mesh) and
// asserts, rank by rank, that the groups it reads (DP x CP and TP; the expert DP and TP with
// experts; their parts within an instance with several) are the mesh's.
bool fsdp_groups_leave_the_default_order(const casefile::Case& c) {
  using topologies::Family;
  topologies::ParallelConfig same = c.topology;
  same.order = std::string(topologies::kDefaultOrder);
  try {
    const topologies::RankLayout layout(c.topology), default_layout(same);
    std::vector<Family> families{Family::tp, Family::dp_cp};
    if (c.model.num_experts > 0) families.insert(families.end(), {Family::expt_tp, Family::expt_dp});
    if (c.topology.dist_opt_instances > 1) families.push_back(Family::dist_opt);
    for (Family family : families)
      for (int rank = 0; rank < c.topology.world; ++rank)
        if (!std::ranges::equal(layout.group_ranks(family, rank), default_layout.group_ranks(family, rank)))
          return true;
  } catch (const std::invalid_argument&) {
    return true;  // a configuration check_case refuses first
  }
  return false;
}

// Megatron-FSDP: tally's worker records it from 0.19's buffers (param_and_grad_buffer's
// optimizer_named_parameters and the DataParallelBuffer shard of each item).
bool fsdp_not_recorded(std::string_view version) { return megatron_core_older_than(version, 0, 19); }

std::optional<std::string> megatron_fsdp_refusal(const casefile::Case& c, const MegatronFsdpConfig& f,
                                                 std::string_view version) {
  const topologies::ParallelConfig& t = c.topology;
  if (fsdp_not_recorded(version))
    return "megatron_fsdp: tally's worker does not build Megatron-FSDP with megatron-core " + std::string(version) +
           ": it records 0.19's buffers (each param's shard of its main-grad buffer)";
  // Einops fails in the adapter's first step (_init_dist_index): the world is not DP x CP x EP x TP.
  if (t.pp > 1)
    return "topology.pp " + std::to_string(t.pp) + " with megatron_fsdp: Megatron-FSDP's adapter lays the world out "
           "as (DP x CP, EP, TP) with no pipeline axis, and einops raises EinopsError "
           "(megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:561 in _get_dp_tp_mesh, :490 in _get_hsdp_tp_mesh "
           "with several instances, at 0.19.2)";
  if (!topologies::has_default_order(t)) {
    const std::string field = "topology.order " + t.order + " with megatron_fsdp: ";
    if (fsdp_groups_leave_the_default_order(c))
      return field + "Megatron-FSDP's adapter lays its meshes out in the default order (TP innermost, then EP, then "
             "DP x CP) and asserts that the groups are the mesh's, which this order's are not "
             "(megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:604 at 0.19.2: \"does not match the group ranks\")";
    // Megatron-FSDP would run it: the order's groups are the default order's here (it moves an axis
    // of size 1, say).
    return field + "tally's worker does not build Megatron-FSDP in another order than " +
           std::string(topologies::kDefaultOrder) + " (this one gives its adapter the default order's groups)";
  }
  if (c.path.optimizer == vocab::OptimizerModel::plain)
    return "optimizer.model plain with megatron_fsdp: tally's worker does not build Megatron-FSDP without the "
           "distributed optimizer: Megatron-LM switches it on for Megatron-FSDP "
           "(megatron/training/arguments.py:1112 at 0.19.2), so such a case is optimizer.model distributed";
  // The layer-wise model and Muon are Megatron-LM's --optimizer muon.
  if (c.path.optimizer != vocab::OptimizerModel::distributed)
    return "optimizer.model " + std::string(vocab::optimizer_model_name(c.path.optimizer)) +
           " with megatron_fsdp: Megatron-LM asserts adam or sgd with Megatron-FSDP "
           "(megatron/training/arguments.py:1127 at 0.19.2: \"Megatron-FSDP does not support the muon optimizer "
           "yet.\")";
  if (c.path.bucket_elements > 0)
    return "optimizer.bucket_elements " + std::to_string(c.path.bucket_elements) +
           " with megatron_fsdp: tally's worker does not build Megatron-FSDP with a bucket size: it leaves its "
           "bucketing at its default (its FSDP units, with DDP's bucket size only a suggestion for the params "
           "outside them)";
  // Megatron-FSDP has no check here: it builds the outer strategy's helper buffers only for hybrid
  // FSDP, yet reads the strategy on other paths too; what it then does is not known.
  if (f.outer_sharding == FsdpOuterSharding::optim && t.dist_opt_instances == 1)
    return "megatron_fsdp.outer_dp_sharding_strategy optim with topology.dist_opt_instances 1: tally's worker does "
           "not build an outer strategy without hybrid FSDP: megatron-core lays out the outer strategy's buffers "
           "only over several instances (megatron/core/distributed/fsdp/src/megatron_fsdp/"
           "param_and_grad_buffer.py:2491 at 0.19.2)";
  if (f.outer_sharding == FsdpOuterSharding::optim && f.sharding != FsdpSharding::optim_grads_params)
    return "megatron_fsdp.outer_dp_sharding_strategy optim with data_parallel_sharding_strategy " +
           std::string(fsdp_sharding_name(f.sharding)) +
           ": megatron-core shards the optimizer across instances only with optim_grads_params "
           "(megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:2501 at 0.19.2: "
           "NotImplementedError \"Optimizer fully-sharded HFSDP is only supported with full-sharding on DP-Shard\")";
  return std::nullopt;
}

// Multi-token prediction: the worker builds 0.19's MTP block from the local spec on one stage, and
// reports its separate grad-norm group (mtp_detach_heads) as 0.19 computes it.
std::optional<std::string> mtp_refusal(const casefile::Case& c, std::string_view version) {
  const int layers = c.model.mtp_num_layers;
  if (layers == 0) return std::nullopt;
  const std::string field = "model.mtp_num_layers " + std::to_string(layers);
  if (megatron_core_older_than(version, 0, 19))
    return field + ": tally's worker does not build multi-token prediction with megatron-core " +
           std::string(version) + ": it builds 0.19's MTP layer (mtp_model_layer) and reads its grad-norm group "
           "(grad_norms_by_group)";
  if (c.topology.pp > 1)
    return field + " with topology.pp " + std::to_string(c.topology.pp) +
           ": tally's worker does not build MTP across pipeline stages: the MTP stage builds embeddings of its "
           "own (a word embedding and, with learned_absolute, a position embedding) that it does not map to "
           "tally's params";
  if (kMegatronFsdpSection.held_by(c))
    return field + " with megatron_fsdp: tally's worker does not build MTP with Megatron-FSDP: it records MTP's "
           "separate grad-norm group on DistributedDataParallel's buffers only";
  // megatron-core runs it; tally's model of the case would not be the model it builds.
  const topologies::ModelSpec& m = c.model;
  if (m.num_experts > 0 && !topologies::is_moe_layer(m, m.num_layers - 1))
    return field + " with model.moe_layer_freq " + topologies::moe_layer_freq_text(m) +
           ": tally's worker does not build an MTP layer after a dense last decoder layer: megatron-core builds "
           "it from that layer's spec (megatron/core/models/gpt/gpt_layer_specs.py:769 at 0.19.2), which is "
           "dense here, and tally's model gives it experts";
  if (m.mtp_detach_heads && c.path.layer_wise_param_layout)
    return "model.mtp_detach_heads with optimizer.layer_wise_param_layout: tally's worker does not build detached "
           "MTP heads over the layer-wise parameter layout: megatron-core reduces the chained optimizer's MTP "
           "norm over the model-parallel group but its main norm over the world "
           "(ChainedOptimizer._get_grad_norm_for_group, megatron/core/optimizer/optimizer.py:1823 at 0.19.2), "
           "and a manifest gives a child one stats group; "
           "docs/findings/megatron-core-0.19.2-layerwise-layout-mtp-norm.md shows the miscount";
  return std::nullopt;
}

// The layer-wise optimizer over Megatron-LM 0.19's parameter layout: LayerWise keeps Muon's
// matrices, a DistributedOptimizer the rest (get_megatron_optimizer's
// use_separate_distributed_optimizer path).
bool layer_wise_layout_missing(std::string_view version) { return megatron_core_older_than(version, 0, 19); }

std::optional<std::string> layer_wise_layout_refusal(const casefile::Case& c, std::string_view version) {
  if (layer_wise_layout_missing(version))
    return "optimizer.layer_wise_param_layout: tally's worker does not build the layer-wise parameter layout with "
           "megatron-core " + std::string(version) +
           ", which has none (LayerWiseDistributedOptimizer.compute_full_param_layout came with 0.19)";
  if (c.path.bucket_elements > 0)
    return "optimizer.bucket_elements " + std::to_string(c.path.bucket_elements) +
           " with optimizer.layer_wise_param_layout: tally's worker does not build a bucket size here: it does not "
           "overlap the gradient reduction, and without --overlap-grad-reduce Megatron-LM lays out one bucket per "
           "buffer (resolve_ddp_bucket_size, megatron/training/training.py:1565 at 0.19.2)";
  // Its expert biases are Adam's, so the DistributedOptimizer's, which has no expert-DP group there.
  if (c.model.num_experts > 0 && c.model.add_bias_linear)
    return "optimizer.layer_wise_param_layout with expert biases (model.add_bias_linear, num_experts " +
           std::to_string(c.model.num_experts) +
           "): megatron-core asserts that no non-Muon expert-parallel param goes to the chained "
           "DistributedOptimizer (megatron/core/optimizer/__init__.py:914 at 0.19.2: \"Non-emerging "
           "expert-parallel param groups are not yet supported\")";
  return std::nullopt;
}

// Megatron's reduction of the gradients, run by the worker where they enter before it: measured at
// 0.19.2 (docs/megatron-reference.md §10); "" (the rules of every release): some release runs it.
bool reduction_measured(std::string_view version) { return version.empty() || version == "0.19.2"; }

int dp_cp_size(const topologies::ParallelConfig& t) { return t.world / (std::max(1, t.tp) * std::max(1, t.pp)); }

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

std::optional<std::string> before_reduction_refusal(const casefile::Case& c, std::string_view version,
                                                    const std::map<std::string, std::string>& cannot_run) {
  const std::string field = "gradients.enter before_reduction";
  if (const auto it = cannot_run.find("gradients.enter"); it != cannot_run.end())
    return field + ": tally's worker does not build megatron-core's own gradient reduction on this machine: " +
           it->second;
  if (!reduction_measured(version))
    return field + ": tally's worker does not build it with megatron-core " + std::string(version) +
           ": tally deals each rank's share by 0.19.2's reduction (the factors and groups "
           "docs/megatron-reference.md §10 measured), and " + std::string(version) + "'s is not measured";
  // Not megatron-core's limit but tally's: its shares would not be exact.
  if (const int dp_cp = dp_cp_size(c.topology); !power_of_two(dp_cp))
    return field + " at DP x CP " + std::to_string(dp_cp) + ": megatron-core multiplies each rank's share by 1/" +
           std::to_string(dp_cp) + " before it sums them (distributed_data_parallel.py:206-213, "
           "param_and_grad_buffer.py:656-661 at 0.19.2), which rounds, so tally's shares are exact only where "
           "DP x CP is a power of two";
  return std::nullopt;
}

}  // namespace

std::optional<ReductionGroups> megatron_core_reduction_groups(const casefile::Case& c) {
  if (!c.path.gradients.before_reduction) return std::nullopt;
  const topologies::ParallelConfig& t = c.topology;
  const int dp_cp = dp_cp_size(t);
  ReductionGroups groups{{dp_cp}, dp_cp};
  if (c.model.num_experts > 0) groups.add(topologies::edp(t));
  if (t.pp > 1 && !c.model.untie_embeddings_and_output_weights) groups.add(2 * dp_cp);
  if (t.tp > 1 && c.model.qk_layernorm) groups.add(t.tp * dp_cp);
  return groups;
}

std::optional<std::string> megatron_core_refusal(const casefile::Case& c, std::string_view version,
                                                     const FaultPlants& plants,
                                                     const std::map<std::string, std::string>& cannot_run) {
  const topologies::ModelSpec& m = c.model;
  const vocab::PathOptions& o = c.path;
  const std::string release = "megatron-core " + std::string(version);
  if (m.kind != topologies::ModelKind::gpt)
    return "model.kind custom: tally's worker does not build a custom layout: it builds Megatron's GPTModel, and a "
           "custom layout has no Megatron module";
  if (auto why = other_frameworks_section(c, "megatron-core")) return why;
  if (auto why = mtp_refusal(c, version)) return why;
  // The local spec's MLA passes k_channels and v_channels to the local DotProductAttention, whose
  // __init__ takes neither; only Transformer Engine's core attention builds it.
  if (m.multi_latent_attention)
    return "model.multi_latent_attention with " + release + ": the local layer spec, which tally's worker builds "
           "(no Transformer Engine), cannot build it: MLASelfAttention passes k_channels and v_channels to the "
           "local DotProductAttention (" + cite("megatron/core/transformer/multi_latent_attention.py", "162", "214", version) +
           "), whose __init__ takes neither (" +
           cite("megatron/core/transformer/dot_product_attention.py", "42-52", "42-52", version) + "): a TypeError";
  // Not megatron-core's limit: tally does not judge the worker's build before it has run on a GPU.
  if (m.softmax_type != topologies::SoftmaxType::vanilla && !sinks_built_on_a_gpu(version))
    return "model.softmax_type learnable with " + release + ": the worker builds attention sinks (the local "
           "DotProductAttention's learnable softmax_offset, megatron/core/transformer/dot_product_attention.py:126-138 "
           "at 0.16.1 and 0.19.2), but that build has run on a GPU only with 0.19.2, so tally does not judge it "
           "with " + release + " yet; tally's model of the release counts them as the release does, TP rank 0's only";
  if (topologies::uses_gtp(c.topology))
    return megatron_core_older_than(version, 0, 19)
               ? "topology.gtp/egtp: tally's worker does not build generalized TP with " + release +
                     ", which has none (tensor_parallel_num_weight_shards came with 0.19)"
               : "topology.gtp/egtp: tally's worker does not build generalized TP: megatron-core's needs Transformer "
                 "Engine >= 2.19 (megatron/core/tensor_parallel/generalized_tensor_parallelism.py:43 at 0.19.2), "
                 "and the worker builds the local layer spec, without Transformer Engine";
  if (!o.p_values.empty())
    return "statistics.p_norms: Megatron reports the L2 norm and the zero count only (its optimizer calls "
           "get_grad_norm_fp32 at the default norm_type 2, " +
           cite("megatron/core/optimizer/optimizer.py", "210", "386", version) +
           "), so tally's worker does not build p-norms";
  if (std::string why = unplantable(o.faults, plants); !why.empty())
    return "faults: tally's worker does not build a counterpart of " + why;
  const std::optional<MegatronFsdpConfig> fsdp = kMegatronFsdpSection.of(c);
  // Megatron-FSDP's cases meet their own rules (megatron_fsdp_refusal); a layout case before 0.19
  // meets the layout's.
  const bool layout_built = o.layer_wise_param_layout && !layer_wise_layout_missing(version);
  if (const int k = c.topology.dist_opt_instances;
      k > 1 && o.optimizer != vocab::OptimizerModel::distributed && !fsdp &&
      (!o.layer_wise_param_layout || layout_built)) {
    const std::string field = "topology.dist_opt_instances " + std::to_string(k) + " with optimizer.model " +
                              std::string(vocab::optimizer_model_name(o.optimizer));
    if (layout_built)
      return field + " and optimizer.layer_wise_param_layout: megatron-core asserts one instance where it chains "
             "the layer-wise optimizer with a DistributedOptimizer (megatron/core/optimizer/__init__.py:835 at "
             "0.19.2: \"Layer-wise + DistributedOptimizer split path does not yet support "
             "num_distributed_optimizer_instances > 1\")";
    return field + ": megatron-core's DistributedDataParallel asserts the distributed optimizer with several "
           "instances (" + cite("megatron/core/distributed/distributed_data_parallel.py", "227", "293", version) +
           ": \"Partial DistOpt cannot be used without DistOpt\")";
  }
  if (uneven_without_middle_chunks(c))
    return "model.decoder_first_pipeline_num_layers and decoder_last_pipeline_num_layers with pp 2 and vpp " +
           std::to_string(c.topology.vpp) +
           ": megatron-core's get_transformer_layer_offset divides by the middle stages, which are none, on the "
           "last stage (ZeroDivisionError, " +
           cite("megatron/core/transformer/transformer_layer.py", "138", "158", version) + ")";
  if (const auto it = cannot_run.find("megatron_fsdp"); fsdp && it != cannot_run.end())
    return "megatron_fsdp: tally's worker does not build Megatron-FSDP on this machine: " + it->second;
  if (fsdp)
    if (auto why = megatron_fsdp_refusal(c, *fsdp, version)) return why;
  if (const auto it = cannot_run.find("optimizer.layer_wise_param_layout");
      o.layer_wise_param_layout && it != cannot_run.end())
    return "optimizer.layer_wise_param_layout: tally's worker does not build the layer-wise parameter layout on "
           "this machine: " + it->second;
  if (o.layer_wise_param_layout)
    if (auto why = layer_wise_layout_refusal(c, version)) return why;
  if (o.bucket_elements > 0)
    return "optimizer.bucket_elements " + std::to_string(o.bucket_elements) +
           ": tally's worker does not build DDP buckets: it does not overlap the gradient reduction, and without "
           "overlap_grad_reduce megatron-core's DDP lays out one bucket per buffer whatever the bucket size "
           "(megatron/core/distributed/distributed_data_parallel.py:66-68 at 0.16.1, :70-72 at 0.19.2)";
  if (o.gradients.before_reduction)
    if (auto why = before_reduction_refusal(c, version, cannot_run)) return why;
  if (o.optimizer == vocab::OptimizerModel::muon && m.num_experts > 0 && muon_refuses_experts(version))
    return "optimizer.model muon with experts: tally's worker does not build Muon without LayerWise over experts "
           "with " + release + ": its get_megatron_muon_optimizer takes the expert param groups out with list.remove "
           "(megatron/core/optimizer/muon.py:287 at 0.16.1), which compares the groups' tensors and raises "
           "(RuntimeError) where a rank holds as many dense matrices as expert ones; 0.19 builds it";
  return std::nullopt;
}

namespace {

// `c` laid out as Megatron-FSDP runs it: one pipeline stage (its PP folded into DP, so the world
// stays), the default order, the distributed optimizer, no DDP buckets, an outer strategy only
// over several instances and only where the release shards across them. nullopt where the model
// does not fit one stage.
std::optional<casefile::Case> as_megatron_fsdp(casefile::Case c) {
  topologies::ParallelConfig& t = c.topology;
  t.pp = 1;
  t.vpp = 1;
  t.order = std::string(topologies::kDefaultOrder);
  c.model.first_stage_layers.reset();
  c.model.last_stage_layers.reset();
  if (topologies::check_config(t) || topologies::check_model(c.model, t)) return std::nullopt;
  c.path.optimizer = vocab::OptimizerModel::distributed;
  c.path.bucket_elements = 0;
  MegatronFsdpConfig f = *kMegatronFsdpSection.of(c);
  if (t.dist_opt_instances == 1 || f.sharding != FsdpSharding::optim_grads_params)
    f.outer_sharding = FsdpOuterSharding::no_shard;
  kMegatronFsdpSection.set(c, f);
  return c;
}

}  // namespace

casefile::Case within_megatron_core(casefile::Case c, std::string_view version, const FaultPlants& plants,
                                    std::uint64_t draw, const std::map<std::string, std::string>& cannot_run) {
  topologies::ModelSpec& m = c.model;
  vocab::PathOptions& o = c.path;
  if (m.kind != topologies::ModelKind::gpt) return c;
  const bool fsdp_runs = !fsdp_not_recorded(version) && !cannot_run.contains("megatron_fsdp");
  casefile::keep_only_section(c, fsdp_runs ? kMegatronFsdpSection.key : "");
  if (!sinks_built_on_a_gpu(version)) m.softmax_type = topologies::SoftmaxType::vanilla;
  c.topology.gtp = 1;
  c.topology.egtp = 1;
  o.p_values.clear();
  if (!unplantable(o.faults, plants).empty()) o.faults = {};
  // A fifth of the drawn cases are Megatron-FSDP, about as often as each optimizer model; each
  // strategy as often as the others, and the outer one where instances allow it. Drawn before the
  // instances of other optimizer models are dropped, so hybrid FSDP keeps the drawn instances.
  const bool holds_fsdp = kMegatronFsdpSection.held_by(c);
  if (!holds_fsdp && fsdp_runs && draw % 5 == 0) {
    casefile::Case fsdp = c;
    const MegatronFsdpConfig drawn{
        .sharding = kFsdpShardings[(draw / 5) % 4],
        .outer_sharding = (draw / 20) % 2 ? FsdpOuterSharding::optim : FsdpOuterSharding::no_shard};
    kMegatronFsdpSection.set(fsdp, drawn);
    if (std::optional<casefile::Case> laid_out = as_megatron_fsdp(std::move(fsdp))) {
      c = std::move(*laid_out);
      // Hybrid FSDP needs several optimizer instances, which the topology draws rarely: a drawn
      // outer `optim` takes two where the laid-out DP x CP and expert DP allow them.
      topologies::ParallelConfig two = c.topology;
      two.dist_opt_instances = 2;
      if (drawn.outer_sharding == FsdpOuterSharding::optim && drawn.sharding == FsdpSharding::optim_grads_params &&
          c.topology.dist_opt_instances == 1 && !topologies::check_config(two)) {
        c.topology = two;
        kMegatronFsdpSection.set(c, drawn);
      }
    }
  } else if (holds_fsdp) {
    // A shrink whose model no longer fits one stage runs on DDP instead.
    if (std::optional<casefile::Case> laid_out = as_megatron_fsdp(c)) c = std::move(*laid_out);
    else casefile::keep_only_section(c, "");
  }
  if (o.optimizer != vocab::OptimizerModel::distributed) c.topology.dist_opt_instances = 1;
  // Half the layer-wise cases take Megatron-LM 0.19's default parameter layout, where it runs; a
  // shrink keeps it only while it still may.
  const bool layout_runs = !layer_wise_layout_missing(version) && !cannot_run.contains("optimizer.layer_wise_param_layout");
  if (o.optimizer == vocab::OptimizerModel::layerwise && !c.path.layer_wise_param_layout && layout_runs &&
      (draw / 40) % 2 == 1)
    o.layer_wise_param_layout = true;
  // One bucket per buffer, as megatron-core lays it out without overlapped gradient reduction.
  o.bucket_elements = 0;
  if (o.layer_wise_param_layout &&
      (o.optimizer != vocab::OptimizerModel::layerwise || !layout_runs || layer_wise_layout_refusal(c, version)))
    o.layer_wise_param_layout = false;
  // MTP's own norm is not recorded under the parameter layout (mtp_refusal): its heads stay
  // attached there, counted in the main norm.
  if (o.layer_wise_param_layout) m.mtp_detach_heads = false;
  if (mtp_refusal(c, version)) {
    m.mtp_num_layers = 0;
    m.mtp_detach_heads = false;
  }
  if (uneven_without_middle_chunks(c)) {
    // The last stage keeps its layers, now as "the rest" (a multiple of vpp, as it was).
    m.last_stage_layers.reset();
  }
  if (o.optimizer == vocab::OptimizerModel::muon && m.num_experts > 0 && muon_refuses_experts(version))
    o.optimizer = vocab::OptimizerModel::layerwise;
  // Half the cases the worker can reduce take their gradients before megatron-core's reduction (a
  // case with a reduction fault always does: fuzz/generators.cpp); a shrink keeps that only while it
  // still may.
  if (!o.gradients.before_reduction && (draw / 80) % 2 == 1) o.gradients.before_reduction = true;
  if (o.gradients.before_reduction && before_reduction_refusal(c, version, cannot_run))
    o.gradients.before_reduction = false;
  casefile::drop_stated_gradients_without_a_param(c, c.topology);
  return c;
}

}  // namespace tally::run
