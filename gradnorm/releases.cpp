#include "gradnorm/releases.h"

namespace tally::gradnorm {

namespace {

constexpr std::array<ReleaseInfo, kReleaseCount> kReleases = {{
    {MegatronRelease::v0_16_1, "0.16.1",
     "its source (allreduce from EP alone, the float32 zero count, a duplicate filter given only the "
     "dense TP group) and its runs in tests/fixtures/manifests/megatron-core-0.16.1"},
    {MegatronRelease::v0_19_2, "0.19.2",
     "its source (use_expert_pgs, _get_megatron_emerging_optimizer, the layer-wise children's "
     "groups) and its runs in tests/fixtures/manifests/megatron-core-0.19.2"},
}};

}  // namespace

const std::array<ReleaseInfo, kReleaseCount>& megatron_releases() { return kReleases; }

std::optional<MegatronRelease> release_from_name(std::string_view name) {
  for (const ReleaseInfo& info : kReleases)
    if (info.name == name) return info.release;
  return std::nullopt;
}

// Each fault cites megatron/core's code that does it: 0.16.1 at tag core_v0.16.1, 0.19.2 in its
// PyPI wheel.
vocab::FaultSet release_faults(MegatronRelease release, vocab::OptimizerModel optimizer) {
  vocab::FaultSet faults;
  switch (release) {
    case MegatronRelease::v0_16_1:
      // expert-label-from-ep-only: allreduce = not (is_expert and EP > 1), no ETP term
      // (tensor_parallel/layers.py:829,886,908 and :1149,1209,1227; TE:
      // extensions/transformer_engine.py:590,644 and :1506,1551).
      // zero-count-in-float32: count_zeros_fp32 sums and all-reduces a float32 tensor
      // (optimizer/clip_grads.py:207,228,242-244).
      // allreduce-flag-lost-on-main-params: main copies take the TP attributes and shared only
      // (optimizer/optimizer.py:674-678, distrib_optimizer.py:371-375,401-405,424-428); moreover
      // the filter has no expert TP group (tensor_parallel/layers.py:89-98), and every child gets
      // the dense tp_group (optimizer/__init__.py:468-473), so on every optimizer expert params not
      // marked tensor_model_parallel are de-duplicated on the dense TP rank.
      // Not listed: expert-weights-not-tp-marked, which 0.16.1's TE expert layers have
      // (transformer_engine.py:611-618,1521-1528): tally's worker builds the local layers.
      faults = vocab::FaultSet::of({vocab::Fault::expert_label_from_ep_only, vocab::Fault::zero_count_in_float32,
                             vocab::Fault::allreduce_flag_lost_on_main_params});
      break;
    case MegatronRelease::v0_19_2:
      // expert-label-ignores-gtp: use_expert_pgs = is_expert and (EP > 1 or ETP != TP), no GTP term
      // (tensor_parallel/layers.py:961-964,1379-1382; transformer_engine.py:982-985,1475-1478,
      // 1731-1734,2163-2166), though expert weights are split over the expert GTP group
      // (tensor_parallel/layers.py:1021-1029,1385-1393).
      faults = vocab::FaultSet::of({vocab::Fault::expert_label_ignores_gtp});
      // muon-expert-stats-without-egtp: without layer-wise, the emerging-optimizer chain gives its
      // expert children (Muon's and Adam's) tp_ep_pp (optimizer/__init__.py:817,882,900,954); the
      // standard chain uses the EGTP-merged group (:1209).
      if (optimizer == vocab::OptimizerModel::muon) faults = faults.with(vocab::Fault::muon_expert_stats_without_egtp);
      break;
  }
  // tp-sharded-param-unmarked, #7452 (fix proposed in #7530): in both releases the local
  // DotProductAttention's learnable softmax_offset holds this TP rank's heads
  // (transformer/dot_product_attention.py:80) but is never marked tensor_model_parallel (:126-138),
  // so the grad norm and the zero count take TP rank 0's sinks only.
  faults = faults.with(vocab::Fault::tp_sharded_param_unmarked);
  // Layer-wise, in both releases: the children are wrapped without TP groups, so the filter falls
  // back to the global dense TP rank (expert-dedup-on-dense-tp, #6099; 0.16.1
  // layer_wise_optimizer.py:79-81 with tensor_parallel/layers.py:97-98, 0.19.2
  // layer_wise_optimizer.py:505-515 with tensor_parallel/layers.py:104-110); and shard_params
  // returns before sharding anything when DP x CP is 1 (layer-wise-unsharded-at-dp-cp-1,
  // radixark/Megatron-LM #82; layer_wise_optimizer.py:98-102 at 0.16.1, :550-555 at 0.19.2).
  if (optimizer == vocab::OptimizerModel::layerwise)
    faults = faults.with(vocab::Fault::expert_dedup_on_dense_tp).with(vocab::Fault::layer_wise_unsharded_at_dp_cp_1);
  return faults;
}

std::optional<std::string> check_release_config(MegatronRelease release,
                                                const topologies::ParallelConfig& config) {
  if (release == MegatronRelease::v0_16_1 && topologies::uses_gtp(config))
    return "megatron-core 0.16.1 has no generalized TP (gtp " + std::to_string(config.gtp) +
           ", egtp " + std::to_string(config.egtp) + "; 0.19 added it)";
  return std::nullopt;
}

}  // namespace tally::gradnorm
