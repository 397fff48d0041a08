#include "gradnorm/releases.h"

namespace tally::gradnorm {

namespace {

constexpr std::array<ReleaseInfo, kReleaseCount> kReleases = {{
    {MegatronRelease::v0_16_1, "0.16.1",
     "its source (use_expert_pgs, the float32 zero count, copy_optimizer_param_metadata) and its "
     "runs in tests/fixtures/manifests/megatron-core-0.16.1"},
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

vocab::FaultSet release_faults(MegatronRelease release, vocab::OptimizerModel optimizer) {
  vocab::FaultSet faults;
  switch (release) {
    case MegatronRelease::v0_16_1:
      // Experts labelled by EP alone, a float32 zero count, and main copies without allreduce.
      faults = vocab::FaultSet::of({vocab::Fault::expert_label_from_ep_only, vocab::Fault::zero_count_in_float32,
                             vocab::Fault::allreduce_flag_lost_on_main_params});
      break;
    case MegatronRelease::v0_19_2:
      faults = vocab::FaultSet::of({vocab::Fault::expert_label_ignores_gtp});
      if (optimizer == vocab::OptimizerModel::muon) faults = faults.with(vocab::Fault::muon_expert_stats_without_egtp);
      break;
  }
  // #7452 (fix proposed in #7530): in both releases the local DotProductAttention's learnable
  // softmax_offset holds this TP rank's heads but is never marked tensor_model_parallel
  // (transformer/dot_product_attention.py:126-138 at 0.16.1 and 0.19.2), so the grad norm and the
  // zero count take TP rank 0's sinks only.
  faults = faults.with(vocab::Fault::tp_sharded_param_unmarked);
  // #6099: in both releases the layer-wise optimizer's children receive no TP groups; and neither
  // shards anything when DP x CP is 1 (radixark/Megatron-LM #82).
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
