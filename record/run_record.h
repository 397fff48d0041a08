// The run record: what one run of a grad-norm path did on every rank, as plain data. It is the
// common currency of tally: the model target (gradnorm/, tally's own model of the path) records
// its decisions in it, a real framework's manifests (manifest/, docs/manifest.md) are read into
// it, and one judge (oracle/judge.h) reads it, for `tally run` and `tally check` alike.
//
// Per rank: the groups it used, every local parameter (the box of its logical tensor, the model
// param's attributes), every piece its optimizers own (a row-major range of a local param's box,
// the main copy's attributes, in which norm and in the zero count it was counted, and the rule
// that decided it), each child optimizer's stats group and filter groups, the values the rank
// reported and, where the path clipped, the clipped gradients it produced. Statistics of the
// gradients are optional: a real run reports them, the model target's gradients are a pure
// function of the case (kernels/gradient_generator.h) and the judge computes what it needs.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "record/shared_list.h"

namespace tally::record {

inline constexpr int kMaxDims = 4;  // tally's logical tensors have at most 4 dims (topologies/)

// The shape of a logical tensor, or a box of it: ndim sizes (a scalar has ndim 0).
struct Extents {
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> size{};
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size[d];
    return n;
  }
  friend bool operator==(const Extents&, const Extents&) = default;
};

// A box of a logical tensor: offset[d] .. offset[d] + extent.size[d] on every dim.
struct Box {
  std::array<std::int64_t, kMaxDims> offset{};
  Extents extent;
  std::int64_t numel() const { return extent.numel(); }
  friend bool operator==(const Box&, const Box&) = default;
};

// [begin, end) of a box's elements in row-major order.
struct ElementRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
  friend bool operator==(const ElementRange&, const ElementRange&) = default;
};

// Statistics of a gradient, or of a range of it, in fp64.
struct GradStats {
  double sum_squares = 0.0;
  double abs_max = 0.0;
  std::int64_t zeros = 0;
  friend bool operator==(const GradStats&, const GradStats&) = default;
};

// The counting attributes Megatron-LM gives a parameter (docs/megatron-reference.md).
struct Attributes {
  bool tensor_model_parallel = false;
  int partition_dim = -1;  // -1: absent
  bool allreduce = true;   // false: expert topology
  bool shared = false;     // a duplicate copy (a tied output layer on the last stage)
  // is_gtp_weight_remat (megatron-core 0.19): a distinct generalized-TP shard, kept on every
  // GTP rank; other params count only on rank 0 of their (expert) GTP group.
  bool gtp_weight_remat = false;
  friend bool operator==(const Attributes&, const Attributes&) = default;
};

// A logical tensor of the unsharded model.
struct Tensor {
  std::string name;
  Extents shape;
  // What the tensor is, as a diagnosis names it: tally's param class ("expert-row-bias"), or,
  // for a real run, its attributes ("expert-topology param replicated over ETP").
  std::string kind;
  int norm_group = 0;  // index into RunRecord::norm_groups
  friend bool operator==(const Tensor&, const Tensor&) = default;
};

// A norm a run computes: [0] is the main norm (Megatron-LM's grad_norm_group absent), the others
// are separate grad-norm groups ("mtp"). `counted`: the record says which pieces each of its
// ranks counted in it, so the judge keeps a ledger of it; a real run that reports only the main
// norm leaves the others uncounted.
struct NormGroup {
  std::string name;  // "" for the main norm
  bool counted = true;
  friend bool operator==(const NormGroup&, const NormGroup&) = default;
};

// Why the duplicate filter kept or dropped a piece (docs/megatron-reference.md "The duplicate
// filter").
enum class Basis : std::uint8_t {
  tensor_parallel_shard,  // tensor_model_parallel: a distinct shard, kept
  replicated,             // replicated over a group: kept on its rank 0 only
  shared_copy,            // `shared`: a duplicate copy, dropped
  no_filter,              // the path has no duplicate filter: kept
};
// For a replicated piece: the group the filter de-duplicated on. expert_tp and tp are the groups
// its optimizer gave the filter (ChildRecord); global_tp: it gave none, and the filter fell back
// to the rank's own dense TP group (RankRecord::tp_group).
enum class DedupGroup : std::uint8_t { expert_tp, tp, global_tp };
// megatron-core 0.19's second filter, param_is_not_gtp_duplicate: a piece that is not a GTP shard
// also needs rank 0 of the rank's global GTP group (RankRecord::gtp_group), or of its expert GTP
// group for allreduce=False. none: a GTP shard, or a run without generalized TP.
enum class GtpDedup : std::uint8_t { none, gtp, expert_gtp };

struct Rule {
  Basis basis = Basis::tensor_parallel_shard;
  DedupGroup dedup = DedupGroup::tp;  // replicated only
  GtpDedup gtp_dedup = GtpDedup::none;
  // The filter kept the piece, but its optimizer's norm was computed and then discarded: it is
  // counted in the zero count only.
  bool child_norm_discarded = false;
  friend bool operator==(const Rule&, const Rule&) = default;
};

// A local model parameter: the box of a logical tensor this rank holds.
struct LocalParam {
  int tensor = 0;  // index into RunRecord::tensors (a tied copy: the tensor it is tied to)
  Box box;
  Attributes attributes;  // of the model param
  std::optional<GradStats> stats;
  friend bool operator==(const LocalParam&, const LocalParam&) = default;
};

// A piece an optimizer child owns, and what its filter decided.
struct Piece {
  int param = 0;  // index into LocalRecord::params
  int child = 0;  // index into RankRecord::children
  ElementRange range;
  Attributes main_attributes;  // of the main copy, as the filter saw them
  int counted_in = -1;         // the norm group it was counted in; -1: none
  bool in_zero_count = false;
  Rule rule;
  std::optional<GradStats> stats;
  friend bool operator==(const Piece&, const Piece&) = default;
};

// A rank's local params, shared by the records of every rank that holds the same boxes: under a
// distributed optimizer the data-parallel replicas own different pieces of the same params, so
// a run of 10^6 ranks keeps one list per distinct set of boxes, not one per rank
// (LocalRecordPool shares equal lists).
using LocalParams = SharedList<LocalParam>;

// What a rank holds and owns. Plain data without the rank's number, so the ranks of a run that
// hold and decide alike (data-parallel replicas) share one.
struct LocalRecord {
  LocalParams params;
  std::vector<Piece> pieces;
  // Each piece's statistics after the clip, where a real run recorded them, parallel to `pieces`;
  // empty when none did (the model target records the clipped values: RankRecord::clipped). Kept
  // apart so the model target's pieces stay as small as they were.
  std::vector<std::optional<GradStats>> clipped_stats;
  friend bool operator==(const LocalRecord&, const LocalRecord&) = default;
};

struct Clip {
  double max_norm = 0.0;
  double coefficient = 1.0;  // what it multiplied its main params by
  friend bool operator==(const Clip&, const Clip&) = default;
};

// One child optimizer on one rank. Groups are indices into RunRecord::groups; -1: none given.
struct ChildRecord {
  int stats_group = -1;
  int tp_group = -1;
  int expert_tp_group = -1;
  std::optional<double> norm;  // its own norm, where the path reports it
  std::optional<Clip> clip;
  friend bool operator==(const ChildRecord&, const ChildRecord&) = default;
};

// The norm of a separate grad-norm group (RunRecord::norm_groups[norm_group], never 0).
struct GroupNorm {
  int norm_group = 1;
  double norm = 0.0;
  double clip_coefficient = 1.0;
  friend bool operator==(const GroupNorm&, const GroupNorm&) = default;
};

// What a rank returned. Absent values were not computed.
struct Reported {
  std::optional<double> norm;
  std::optional<double> inf_norm;
  std::optional<std::int64_t> zeros;
  std::optional<double> clip_coefficient;  // of the main norm
  std::vector<double> p_norms;             // one per RunRecord::p_values, or none
  std::vector<GroupNorm> group_norms;
  friend bool operator==(const Reported&, const Reported&) = default;
};

// The gradient of one local param after clipping, as the path produced it: its values in the
// box's row-major order, and the coefficient it multiplied them by. `data` may point into a
// buffer that several params (and ranks) share; null means the path left the gradient as it was
// stored (Megatron-LM scales only when the coefficient is below 1), and `coefficient` is then
// what it did not apply.
struct ClippedParam {
  double coefficient = 1.0;
  std::shared_ptr<const float> data;
  std::size_t size = 0;
  std::span<const float> values() const { return {data.get(), size}; }
};
using ClippedValues = std::vector<ClippedParam>;  // one per LocalRecord::params entry

struct RankRecord {
  int rank = 0;
  int tp_group = -1;         // its dense TP group (the global one Megatron-LM falls back to)
  int expert_tp_group = -1;  // its expert TP group
  int gtp_group = -1;         // its GTP and expert GTP groups; -1: the run has no GTP
  int expert_gtp_group = -1;
  std::shared_ptr<const LocalRecord> local;
  std::vector<ChildRecord> children;  // one per RunRecord::children
  Reported reported;
  std::shared_ptr<const ClippedValues> clipped;  // null: the clipped gradients are not recorded
};

struct RunRecord {
  std::string producer;
  int world = 0;
  std::vector<Tensor> tensors;
  std::vector<NormGroup> norm_groups{NormGroup{}};
  // Whether the run computed a zero count: a framework that reports none (DeepSpeed) has no
  // zero-count ledger to judge.
  bool zero_count_reported = true;
  std::vector<double> p_values;       // the p of each Reported::p_norms entry
  std::vector<std::string> children;  // the child optimizers' names, the same on every rank
  std::vector<std::vector<int>> groups;  // rank lists, each in its group's rank order
  std::vector<RankRecord> ranks;         // every rank, in rank order
};

// Builds RunRecord::groups: one entry per distinct rank list.
class GroupTable {
 public:
  explicit GroupTable(std::vector<std::vector<int>>& groups);
  int intern(const std::vector<int>& ranks);

 private:
  std::vector<std::vector<int>>& groups_;
  std::map<std::vector<int>, int> index_;
};

// LocalRecords by content: the ranks of a run that hold and decide alike share one, and records
// of equal params share one LocalParams list.
class LocalRecordPool {
 public:
  // The pooled record equal to `record`, copied into the pool when it is new.
  std::shared_ptr<const LocalRecord> intern(const LocalRecord& record);
  std::size_t size() const { return count_; }
  std::size_t distinct_params() const { return param_lists_; }

 private:
  LocalParams intern_params(const LocalParams& params);

  std::unordered_map<std::uint64_t, std::vector<std::shared_ptr<const LocalRecord>>> by_hash_;
  std::unordered_map<std::uint64_t, std::vector<LocalParams>> params_by_hash_;
  std::unordered_map<const void*, LocalParams> by_identity_;  // the pooled lists, by identity
  std::size_t count_ = 0;
  std::size_t param_lists_ = 0;
};

}  // namespace tally::record
