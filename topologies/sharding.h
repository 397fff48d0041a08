// Sharding: what one rank holds of a LogicalModel, with the attributes Megatron-LM gives its
// main copies (docs/megatron-reference.md §1 and §3). Dense classes are split by the dense
// TP coordinate, expert classes by the ETP coordinate on the EP rank that owns the expert; the
// stage is the pp coordinate; every DP/CP (dense) or EDP (expert) replica holds the same
// shards. Placement travels with the value: a LocalParam carries every attribute the duplicate
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
  GradNormGroup grad_norm_group = GradNormGroup::main;
  SharedCopy copy = SharedCopy::none;
  friend bool operator==(const LocalParam&, const LocalParam&) = default;
};

// Megatron-LM's use_expert_pgs without GTP: expert params live in the expert topology exactly
// when EP > 1 or ETP != TP; otherwise they are treated as dense (which is then correct).
bool expert_topology(const ModelPlacement& placement);

// The rank's local main-copy parameters, in the model's order (a shared copy last). O(params
// of the rank's stage), remote experts skipped by whole blocks. Throws std::invalid_argument
// when `layout` does not have the sizes `model` was validated for, std::out_of_range for a
// rank outside the world.
std::vector<LocalParam> local_params(const LogicalModel& model, const RankLayout& layout,
                                     int rank);
// The same into `out` (cleared first), so a caller sharding many ranks reuses one buffer.
void local_params(const LogicalModel& model, const RankLayout& layout, int rank,
                  std::vector<LocalParam>& out);

// The group family whose rank 0 keeps a replicated (not tensor_model_parallel) param in the
// duplicate filter: ETP (expt_tp) for expert-topology params (allreduce false), dense TP
// otherwise. For tensor_model_parallel params it names the family the shards are split over.
Family replication_family(const LocalParam& param);

// Megatron-LM's local name of `param` on its rank ("output_layer.weight" for a tied copy).
std::string local_name(const LogicalModel& model, const LocalParam& param);

}  // namespace tally::topologies
