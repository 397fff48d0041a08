// Sharding: what one rank holds of a LogicalModel, with the attributes Megatron-LM gives its
// main copies (docs/megatron-reference.md §1 and §3). Dense classes are split by the dense
// TP coordinate, expert classes by the ETP coordinate on the EP rank that owns the expert; the
// stage is the pp coordinate; every DP/CP (dense) or EDP (expert) replica holds the same
// shards. With generalized TP (megatron-core 0.19) the linear and embedding weights are split
// again along dim 0 of the TP shard over GTP (expert weights over EGTP). Placement travels with the value: a LocalParam carries every attribute the duplicate
// filter reads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::topologies {

// A box of a logical tensor: offset[d] .. offset[d] + extent[d] on every dim.
struct Slice {
  std::array<std::int64_t, kMaxDims> offset{};
  std::array<std::int64_t, kMaxDims> extent{};
  int rank = 0;
  std::int64_t numel() const;
  friend bool operator==(const Slice&, const Slice&) = default;
};
std::string slice_string(const Slice& slice);  // "[0:24, 0:16]"

struct LocalParam {
  int logical_id = 0;  // for a shared copy: the param it copies (the word embedding)
  ParamClass param_class = ParamClass::replicated;
  Slice slice;
  int vpp_chunk = 0;
  int local_expert = -1;  // index among this EP rank's experts; -1 for non-experts
  // Megatron-LM's attributes on the main copy.
  bool tensor_model_parallel = false;
  int partition_dim = -1;  // -1: attribute absent
  bool allreduce = true;   // false: expert topology (EP > 1 or ETP != TP); absent means true
  bool shared = false;     // a duplicate copy, never counted
  bool gtp_weight_remat = false;  // is_gtp_weight_remat: a distinct GTP shard
  bool embedding_or_output = false;  // LogicalParam::embedding_or_output
  GradNormGroup grad_norm_group = GradNormGroup::main;
  SharedCopy copy = SharedCopy::none;
  // Megatron-LM's shared_embedding (pp > 1 with a last-stage copy): the first stage's word
  // embedding and that copy, each in a bucket of its own of the distributed optimizer's buffer.
  bool shared_embedding = false;
  friend bool operator==(const LocalParam&, const LocalParam&) = default;
};

// Megatron-LM's use_expert_pgs: expert params live in the expert topology exactly when EP > 1,
// ETP != TP or (with Megatron-LM #6080) EGTP != GTP; otherwise the expert grid is the dense one
// and treating them as dense is correct. megatron-core 0.19.2 lacks the GTP term
// (gradnorm's expert-label-ignores-gtp).
bool expert_topology(const ModelPlacement& placement);

// Whether `param_class` carries is_gtp_weight_remat when its GTP size is above 1: the weights
// of column-, row- and vocab-parallel layers, expert ones included; never biases, norms or
// replicated params.
bool gtp_sharded(ParamClass param_class);

// The rows [begin, begin + count) of a TP shard's `rows` rows that GTP rank `index` of `size`
// holds: megatron-core 0.19 pads the rows to a multiple of 16 * size (GTP_CONFIG's default
// pad_for_alignment) and gives each rank an equal block, so the last ranks hold fewer real
// rows, or none. The padding rows are not gradient elements of the model, and a rank whose
// shard is padding only does not list the param (local_params).
struct GtpRows {
  std::int64_t begin = 0, count = 0;
};
GtpRows gtp_rows(std::int64_t rows, int index, int size);
inline constexpr int kGtpPadForAlignment = 16;

// The rank's local main-copy parameters, in the model's order (a shared copy last). O(params
// of the rank's stage), remote experts skipped by whole blocks. Throws std::invalid_argument
// when `layout` does not have the sizes `model` was validated for, std::out_of_range for a
// rank outside the world.
std::vector<LocalParam> local_params(const LogicalModel& model, const RankLayout& layout,
                                     int rank);
// The same into `out` (cleared first), so a caller sharding many ranks reuses one buffer.
void local_params(const LogicalModel& model, const RankLayout& layout, int rank,
                  std::vector<LocalParam>& out);

// The family whose rank 0 keeps a param that is not a GTP shard in megatron-core 0.19's
// param_is_not_gtp_duplicate: expert GTP for allreduce = false, dense GTP otherwise.
Family gtp_replication_family(const LocalParam& param);

// megatron-core 0.19's param_is_not_gtp_duplicate, the filter's second test on `rank`: a param
// that is not a GTP shard counts only on rank 0 of the rank's global GTP group, or of its expert
// GTP group when allreduce = false (read from `param`: a main copy's attributes, where they
// differ). `applies` is false for GTP shards and for configurations without generalized TP
// (where every rank is rank 0 of a singleton).
struct GtpCheck {
  bool applies = false;
  Family family = Family::gtp;  // gtp or expt_gtp
  bool keeps = true;
};
GtpCheck gtp_check(const LocalParam& param, const RankLayout& layout, int rank);

// The group family whose rank 0 keeps a replicated (not tensor_model_parallel) param in the
// duplicate filter: ETP (expt_tp) for expert-topology params (allreduce false), dense TP
// otherwise. For tensor_model_parallel params it names the family the shards are split over.
Family replication_family(const LocalParam& param);

// Megatron-LM's local name of `param` on its rank ("output_layer.weight" for a tied copy).
std::string local_name(const LogicalModel& model, const LocalParam& param);

}  // namespace tally::topologies
