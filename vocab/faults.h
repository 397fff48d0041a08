// The fault catalog: each fault replaces one rule of the grad-norm path with the wrong rule a
// real framework shipped (docs/megatron-reference.md §6). A fault never changes the oracle.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tally::vocab {

enum class Fault : std::uint8_t {
  expert_dedup_on_dense_tp,
  allreduce_flag_lost_on_main_params,
  expert_weights_not_tp_marked,
  expert_label_from_ep_only,
  expert_label_ignores_gtp,
  expert_stats_over_dense_mp,
  clip_per_child_norm,
  tied_copy_not_shared,
  tp_sharded_param_unmarked,
  replicated_marked_tp,
  no_dedup_filter,
  average_rank_norms,
  expert_norm_dropped,
  missing_ep_reduction,
  missing_pp_reduction,
  zero_count_in_float32,
  empty_rank_skips_collective,
  inf_norm_combined_by_l2,
  distopt_padding_counted,
  distopt_overlapping_shards,
  stats_over_replicas,
  clip_per_stage_norm,
  clip_per_ep_group_norm,
  average_local_norms_over_dp,
  muon_expert_stats_without_egtp,
  tp_marking_unseen_by_filter,
  norm_of_scaled_gradients,
  layer_wise_unsharded_at_dp_cp_1,
  // The reduction of gradients that enter before it (gradients.enter before_reduction, gradnorm/reduction.h).
  grads_averaged_twice,
  grads_not_averaged,
  expert_grads_averaged_over_edp,
  tied_embedding_not_synced,
  tied_embedding_synced_twice,
  tp_replicated_grads_not_summed,
  tp_replicated_grads_summed_twice,
};
inline constexpr int kFaultCount = 35;
// Whether `fault` is one of the reduction's: it changes nothing where the gradients enter after it.
bool is_reduction_fault(Fault fault);
class FaultSet;
bool any_reduction_fault(const FaultSet& faults);
// norm-of-scaled-gradients: the loss scale the reported norm is still multiplied by (DeepSpeed's
// first dynamic fp16 loss scale, 2^16, a power of two: the product is exact).
inline constexpr double kFaultLossScale = 65536.0;

struct FaultInfo {
  Fault fault;
  std::string_view name;        // as in the bug catalog: "expert-dedup-on-dense-tp"
  std::string_view provenance;  // where it shipped
  std::string_view wrong_rule;  // what the path does instead of the right rule
  std::string_view trigger;     // what a case needs for the fault to change anything
};

const std::array<FaultInfo, kFaultCount>& fault_catalog();
const FaultInfo& fault_info(Fault fault);
std::optional<Fault> fault_from_name(std::string_view name);

// The faults enabled for one run. Default: none.
class FaultSet {
 public:
  FaultSet() = default;
  static FaultSet of(std::initializer_list<Fault> faults);
  bool has(Fault fault) const { return bits_.test(static_cast<std::size_t>(fault)); }
  FaultSet with(Fault fault) const;
  FaultSet with(const FaultSet& others) const;  // both sets' faults
  bool empty() const { return bits_.none(); }
  int count() const { return static_cast<int>(bits_.count()); }
  friend bool operator==(const FaultSet&, const FaultSet&) = default;

 private:
  std::bitset<kFaultCount> bits_;
};

// "expert-dedup-on-dense-tp,no-dedup-filter" (catalog order), or "none".
std::string fault_list(const FaultSet& faults);

}  // namespace tally::vocab
