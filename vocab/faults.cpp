#include "vocab/faults.h"

namespace tally::vocab {

namespace {

constexpr std::array<FaultInfo, kFaultCount> kCatalog = {{
    {Fault::expert_dedup_on_dense_tp, "expert-dedup-on-dense-tp",
     "Megatron-LM #6099 (LayerWise/Muon children never received the TP groups); dev #6470",
     "non-TP-marked expert-topology params are de-duplicated on the dense TP rank instead of the "
     "expert TP (ETP) rank",
     "an expert FC2 bias (or another non-TP-marked expert param) on a rank whose dense TP rank "
     "differs from its ETP rank: EP > 1 with TP > 1 and ETP = 1, or TP = 1 with ETP > 1"},
    {Fault::allreduce_flag_lost_on_main_params, "allreduce-flag-lost-on-main-params",
     "Megatron-LM dev #6470 (copy_optimizer_param_metadata did not copy allreduce)",
     "optimizer main copies lose allreduce = false, so the filter treats expert params as dense "
     "and de-duplicates them on the dense TP rank",
     "as expert-dedup-on-dense-tp: a non-TP-marked expert param whose dense TP rank differs from "
     "its ETP rank"},
    {Fault::expert_weights_not_tp_marked, "expert-weights-not-tp-marked",
     "Megatron-LM #5916, common case (TE grouped-GEMM expert layers, fixed in cd4afffa64)",
     "expert weights and column biases are not marked tensor_model_parallel, so they pass the "
     "duplicate filter only where the dense TP rank is 0: whole experts or expert shards dropped",
     "experts with EP > 1 or ETP > 1 on ranks whose dense TP rank is not 0"},
    {Fault::expert_label_from_ep_only, "expert-label-from-ep-only",
     "Megatron-LM #5916, uncommon case (allreduce derived from EP > 1 alone)",
     "experts are labelled dense when EP = 1 even if ETP != TP: dense dedup group, dense stats "
     "group, dense data-parallel sharding",
     "experts with EP = 1 and ETP != TP"},
    {Fault::expert_label_ignores_gtp, "expert-label-ignores-gtp",
     "Megatron-LM #6080 (use_expert_pgs ignored expert GTP != dense GTP; still so in released "
     "megatron-core 0.19.2)",
     "experts are labelled dense when EP = 1 and ETP = TP even if the expert GTP size differs "
     "from the dense one",
     "experts with EP = 1, ETP = TP and EGTP != GTP (megatron-core 0.19.2's own rule)"},
    {Fault::expert_stats_over_dense_mp, "expert-stats-over-dense-mp",
     "Megatron-LM #3024 (non-LayerWise Muon put expert weights in the dense optimizer)",
     "expert linear weights join the dense Muon child, whose stats group is TP x PP: the other "
     "EP ranks are never summed",
     "the muon optimizer model with experts and EP > 1"},
    {Fault::clip_per_child_norm, "clip-per-child-norm",
     "Megatron-LM 2024, issue #785 (fixed in abf10f8590)",
     "each child of a chained optimizer clips with its own norm, and the expert norm is reduced "
     "over TP x PP only",
     "a chained optimizer with a dense and an expert child (plain or muon) and clipping active"},
    {Fault::tied_copy_not_shared, "tied-copy-not-shared",
     "Megatron-LM #7227 and the 2021 T5 fix 5c8238c343",
     "the last-stage copy of a tied embedding / output layer is not marked shared: counted twice",
     "tied embeddings with PP > 1"},
    {Fault::tp_sharded_param_unmarked, "tp-sharded-param-unmarked",
     "Megatron-LM #7452 -> #7530 (learnable attention sink)",
     "a head-sharded param is not marked tensor_model_parallel: only TP rank 0's shard counts",
     "an attention sink (softmax offset) with TP > 1"},
    {Fault::replicated_marked_tp, "replicated-marked-tp",
     "TransformerEngine (ROCm) #715 (a replicated weight in a TE Linear with no parallel mode)",
     "replicated params are marked tensor_model_parallel: counted once per TP rank",
     "replicated params (norms, row biases, router, gate) with TP > 1"},
    {Fault::no_dedup_filter, "no-dedup-filter", "NeMo-RL #3788 (DTensor path)",
     "no duplicate filter at all: every replicated param counted on every TP (and ETP) rank",
     "replicated params with TP > 1, or expert FC2 biases with ETP > 1"},
    {Fault::average_rank_norms, "average-rank-norms", "DeepSpeed #8475 / #8478",
     "the norm is the average of per-rank norms over the stats group instead of the root of the "
     "summed squares",
     "a stats group of two or more ranks whose local norms differ"},
    {Fault::expert_norm_dropped, "expert-norm-dropped", "DeepSpeed #8613 (MoE, fp16 unfused)",
     "the expert part of the norm is discarded", "experts in the expert topology"},
    {Fault::missing_ep_reduction, "missing-ep-reduction", "NeMo-Automodel #3816",
     "expert statistics are not reduced over the EP axis: each EP group computes its own "
     "\"global\" norm and ranks disagree",
     "experts with EP > 1"},
    {Fault::missing_pp_reduction, "missing-pp-reduction", "torchtitan #596",
     "statistics are not reduced across pipeline stages: each stage reports its own norm",
     "PP > 1"},
    {Fault::zero_count_in_float32, "zero-count-in-float32", "Megatron-LM #4015 (a01a6c5fe9)",
     "the zero count is accumulated and reduced in float32: inexact above 2^24",
     "more than 2^24 zero gradient elements"},
    {Fault::empty_rank_skips_collective, "empty-rank-skips-collective",
     "Megatron-LM #5530 (3c4645201a)",
     "a rank with no gradients returns early instead of joining the all-reduce: the others hang",
     "a rank that holds no counted gradient (a distributed-optimizer or layer-wise rank that owns "
     "nothing, or a stage without params)"},
    {Fault::inf_norm_combined_by_l2, "inf-norm-combined-by-l2",
     "Megatron-LM ChainedOptimizer (non-shared path)",
     "inf norms of the children are combined by L2 instead of max",
     "a chained optimizer whose children have different stats groups, both non-empty"},
    {Fault::distopt_padding_counted, "distopt-padding-counted",
     "design hazard of padded distributed-optimizer buckets",
     "padding elements of the flat buffer are counted as zero gradients",
     "the distributed optimizer with a bucket not divisible by the data-parallel size"},
    {Fault::distopt_overlapping_shards, "distopt-overlapping-shards",
     "design hazard of distributed-optimizer shard ranges",
     "each data-parallel rank's range also covers the first element of the next rank's range: "
     "boundary elements counted twice",
     "the distributed optimizer with data-parallel size > 1"},
    {Fault::stats_over_replicas, "stats-over-replicas",
     "design hazard of non-distributed optimizers",
     "statistics are reduced over the whole world while gradients are replicated over DP: "
     "counted DP x CP times",
     "the plain or muon optimizer model with DP x CP > 1 (or EDP > 1 for experts)"},
    {Fault::clip_per_stage_norm, "clip-per-stage-norm",
     "torchtitan #596 / PR #649 review (each model part clipped alone); Modalities #313",
     "the logged norm is reduced over every stage, but each pipeline stage clips with a norm "
     "reduced over its own stage only",
     "PP > 1 with clipping active and gradients on more than one stage"},
    {Fault::clip_per_ep_group_norm, "clip-per-ep-group-norm",
     "ColossalAI #2192 (MoE clip norm not reduced over expert parallel)",
     "the logged norm is right, but the clip norm is reduced over the stats group without its EP "
     "axis: the ranks of each EP position clip with their own norm",
     "experts with EP > 1 and clipping active"},
    {Fault::average_local_norms_over_dp, "average-local-norms-over-dp",
     "DeepSpeed #8475 / PR #8478 (clip_grad_norm_ averages per-rank norms over data parallel)",
     "each rank reduces its whole local norm over the dense model-parallel group (TP x PP) only, "
     "then the norm is the mean of those over the data-parallel group (DP x CP)",
     "data-parallel ranks whose local norms differ: experts with EP > 1, or ETP < TP (a dense "
     "TP group then holds expert shards of several DP positions), or the distributed optimizer "
     "with DP x CP > 1"},
    {Fault::muon_expert_stats_without_egtp, "muon-expert-stats-without-egtp",
     "megatron-core 0.19.2 _get_megatron_emerging_optimizer (expert children get tp_ep_pp, not "
     "the EGTP-merged group; read from source, docs/megatron-reference.md section 9)",
     "the non-layer-wise Muon chain reduces its expert children's statistics over tp-ep-pp, which "
     "does not span expert GTP: each EGTP rank's norm misses the other EGTP shards",
     "the muon optimizer model with experts in the expert topology and EGTP > 1"},
    {Fault::tp_marking_unseen_by_filter, "tp-marking-unseen-by-filter",
     "DeepSpeed 0.19.8 FP16_UnfusedOptimizer (get_weight_norm is given the gradients, which carry no "
     "tensor_model_parallel; docs/findings/deepspeed-0.19.8-unfused-optimizer-drops-tp-shards.md); "
     "the fused optimizer's form was fixed by DeepSpeed PR #5411",
     "the duplicate filter does not see the tensor_model_parallel mark: a TP shard is kept only on "
     "the first rank of its TP (or expert-TP) group, so the other ranks' shards are dropped",
     "TP (or ETP) > 1 with gradients on tensor-parallel shards"},
    {Fault::norm_of_scaled_gradients, "norm-of-scaled-gradients",
     "DeepSpeed PR #8588 (FP16_UnfusedOptimizer's norm of the fp16 gradients still multiplied by the "
     "loss scale); in 0.19.8 the fused FP16_Optimizer divides instead, since the engine never scales "
     "(docs/findings/deepspeed-0.19.8-fp16-zero0-loss-never-scaled.md)",
     "the reported norm is taken of the gradients before they are unscaled: the true norm times the "
     "loss scale (2^16); clipping unscales it and stays right",
     "any gradient not zero"},
    {Fault::layer_wise_unsharded_at_dp_cp_1, "layer-wise-unsharded-at-dp-cp-1",
     "megatron-core 0.16.1 and 0.19.2 LayerWiseDistributedOptimizer.shard_params (returns before "
     "sharding when the dp_cp group has one rank); radixark/Megatron-LM PR #82; "
     "docs/findings/megatron-core-0.19.2-layerwise-expert-weights-dp1.md",
     "with DP x CP = 1 the layer-wise optimizer shards nothing, expert params included: every rank "
     "of an expert-DP group owns and counts the expert params it holds",
     "the layer-wise optimizer with DP x CP = 1 and experts whose expert-DP size, TP / (EP x ETP), "
     "is above 1"},
    // The reduction of gradients that enter before it (gradients.enter before_reduction).
    {Fault::grads_averaged_twice, "grads-averaged-twice",
     "torchtitan #2318 / #2458 (DDP and HSDP gradients divided by the data-parallel size twice: a grad norm "
     "8x below FSDP's)",
     "the data-parallel reduction's average is divided by |DP x CP| once more",
     "gradients before the reduction with DP x CP > 1"},
    {Fault::grads_not_averaged, "grads-not-averaged",
     "no single public report: the counterpart of grads-averaged-twice (megatron-core's gradient_scaling_factor "
     "left at 1 where the loss is not a per-token sum, docs/megatron-reference.md section 10)",
     "each rank's share is summed over DP x CP without the 1/|DP x CP| scaling: the gradients |DP x CP| times "
     "too large",
     "gradients before the reduction with DP x CP > 1"},
    {Fault::expert_grads_averaged_over_edp, "expert-grads-averaged-over-edp",
     "Megatron-LM #5956 (Megatron-FSDP v2: expert gradients ep_size times too large, averaged over the wrong "
     "group)",
     "routed experts' sums over expert DP are scaled by 1/|EDP| instead of megatron-core's 1/|DP x CP| "
     "(distributed_data_parallel.py:212-213 at 0.19.2): |DP x CP| / |EDP| times too large",
     "experts, gradients before the reduction, and |EDP| != |DP x CP| (EP > 1, ETP != TP or CP > 1)"},
    {Fault::tied_embedding_not_synced, "tied-embedding-not-synced",
     "no single public report: the reduction's counterpart of tied-copy-not-shared (finalize_model_grads' "
     "_allreduce_word_embedding_grads skipped)",
     "the tied word embedding's first- and last-stage copies are not summed after the data-parallel "
     "reduction: each stage holds only its own ranks' part",
     "a tied word embedding with PP > 1, gradients before the reduction"},
    {Fault::tied_embedding_synced_twice, "tied-embedding-synced-twice",
     "no single public report: the reduction's counterpart of tied-copy-not-shared (the word-embedding "
     "sync of finalize_model_grads run twice)",
     "the first- and last-stage copies of the tied word embedding are summed twice: both hold twice the "
     "gradient",
     "a tied word embedding with PP > 1, gradients before the reduction"},
    {Fault::tp_replicated_grads_not_summed, "tp-replicated-grads-not-summed",
     "no single public report: finalize_model_grads' _allreduce_non_tensor_model_parallel_grads skipped "
     "(the q/k layernorms' TP all-reduce)",
     "the q/k layernorms' gradients are not summed over TP after the data-parallel reduction: each TP rank "
     "holds only its own part",
     "qk-layernorm with TP > 1, gradients before the reduction"},
    {Fault::tp_replicated_grads_summed_twice, "tp-replicated-grads-summed-twice",
     "no single public report: a TP-replicated gradient all-reduced by two callers (sequence-parallel and "
     "layernorm grads, finalize_model_grads)",
     "the q/k layernorms' gradients are summed over TP twice: |TP| times the gradient",
     "qk-layernorm with TP > 1, gradients before the reduction"},
}};

}  // namespace

const std::array<FaultInfo, kFaultCount>& fault_catalog() { return kCatalog; }

bool is_reduction_fault(Fault fault) {
  return static_cast<int>(fault) >= static_cast<int>(Fault::grads_averaged_twice);
}

bool any_reduction_fault(const FaultSet& faults) {
  for (const FaultInfo& info : kCatalog)
    if (is_reduction_fault(info.fault) && faults.has(info.fault)) return true;
  return false;
}

const FaultInfo& fault_info(Fault fault) { return kCatalog[static_cast<std::size_t>(fault)]; }

std::optional<Fault> fault_from_name(std::string_view name) {
  for (const FaultInfo& info : kCatalog)
    if (info.name == name) return info.fault;
  return std::nullopt;
}

FaultSet FaultSet::of(std::initializer_list<Fault> faults) {
  FaultSet set;
  for (Fault fault : faults) set.bits_.set(static_cast<std::size_t>(fault));
  return set;
}

FaultSet FaultSet::with(Fault fault) const {
  FaultSet set = *this;
  set.bits_.set(static_cast<std::size_t>(fault));
  return set;
}

FaultSet FaultSet::with(const FaultSet& others) const {
  FaultSet set = *this;
  set.bits_ |= others.bits_;
  return set;
}

std::string fault_list(const FaultSet& faults) {
  std::string out;
  for (const FaultInfo& info : kCatalog)
    if (faults.has(info.fault)) out += (out.empty() ? "" : ",") + std::string(info.name);
  return out.empty() ? "none" : out;
}

}  // namespace tally::vocab
