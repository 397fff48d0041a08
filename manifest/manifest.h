// A manifest: what one rank of a framework run counted in its gradient norm (docs/manifest.md).
// Plain data, read from and written to JSON by manifest_json.h, made a run record by to_record.h
// and judged by oracle/judge.h.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "record/run_record.h"

namespace tally::manifest {

// The format written. Version 1 (every rank file lists its groups' ranks) still reads.
inline constexpr int kManifestVersion = 2;

// A group of ranks, as a manifest refers to it: an index into the run's group table
// (RunManifests::groups), whichever version the files were.
using GroupId = int;

// The statistics of a gradient (or of an owned range of it), in fp64: the record's.
using GradStats = record::GradStats;

// The counting attributes of docs/megatron-reference.md §1.
struct Attributes {
  bool tensor_model_parallel = false;
  int partition_dim = -1;
  bool allreduce = true;
  bool shared = false;
  std::optional<std::string> grad_norm_group;
  bool is_gtp_weight_remat = false;  // megatron-core 0.19; optional in the file, default false
  friend bool operator==(const Attributes&, const Attributes&) = default;
};

// A local model parameter: the box of its logical tensor this rank holds.
struct ModelParam {
  std::string name;  // the framework's local name
  std::string logical_name;
  std::vector<std::int64_t> logical_shape;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> extents;
  Attributes attributes;
  GradStats stats;
  friend bool operator==(const ModelParam&, const ModelParam&) = default;
};

// A piece an optimizer owns: a row-major range [begin, end) of a model param's box.
struct MainParam {
  int param = 0;  // index into RankManifest::params
  std::int64_t begin = 0;
  std::int64_t end = 0;
  Attributes attributes;  // of the main copy, as the filter saw them
  bool kept = false;      // kept for the norm by the framework's filter
  bool kept_zeros = false;
  GradStats stats;
  // Of the same range after the optimizer's clip, where the framework clipped and the adapter
  // recorded it (optional in the file).
  std::optional<GradStats> clipped_stats;
  friend bool operator==(const MainParam&, const MainParam&) = default;
};

struct Clip {
  double max_norm = 0.0;
  double coefficient = 1.0;
  friend bool operator==(const Clip&, const Clip&) = default;
};

struct OptimizerRecord {
  std::string name;
  GroupId stats_group = 0;
  std::optional<GroupId> tp_group;         // null: none given (fallback)
  std::optional<GroupId> expert_tp_group;  // null: none given (fallback)
  std::optional<Clip> clip;
  std::vector<MainParam> main_params;
  friend bool operator==(const OptimizerRecord&, const OptimizerRecord&) = default;
};

struct Reported {
  std::optional<double> norm;
  std::optional<double> inf_norm;
  std::optional<std::int64_t> zeros;
  // The norm of each separate grad-norm group the rank computed (Megatron-LM 0.19's
  // grad_norms_by_group: "mtp"); empty when it reported none.
  std::map<std::string, double> group_norms;
  friend bool operator==(const Reported&, const Reported&) = default;
};

struct ParallelSizes {
  int tp = 1, cp = 1, pp = 1, dp = 1, ep = 1, etp = 1;
  friend bool operator==(const ParallelSizes&, const ParallelSizes&) = default;
};

struct RankManifest {
  std::string producer;
  // The request's case_digest (case-<K>.gradients.json), echoed by a worker so that tally knows the
  // manifests are of the case it sent (docs/real-targets.md); absent in manifests of runs tally did
  // not request.
  std::optional<std::string> case_digest;
  int rank = 0;
  int world = 1;
  ParallelSizes parallel;
  std::map<std::string, GroupId> groups;  // must hold "tp" and "expt_tp"
  // Shared by ranks that hold equal params (read_run pools them: data-parallel replicas).
  record::SharedList<ModelParam> params;
  std::vector<OptimizerRecord> optimizers;
  Reported reported;
  friend bool operator==(const RankManifest&, const RankManifest&) = default;
};

// The manifests of one run: every group any rank refers to, once, and the ranks' files.
struct RunManifests {
  int version = kManifestVersion;        // the format they were read from
  std::vector<std::vector<int>> groups;  // sorted rank lists, each once
  std::vector<RankManifest> ranks;       // in rank order once validated
  const std::vector<int>& group(GroupId id) const { return groups[static_cast<std::size_t>(id)]; }
  friend bool operator==(const RunManifests&, const RunManifests&) = default;
};

// A manifest's sizes as its messages show them ("[4,8]"), and the elements of a box's extents.
inline std::string sizes_text(const std::vector<std::int64_t>& sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? "," : "") + std::to_string(sizes[i]);
  return out + "]";
}

inline std::int64_t volume(const std::vector<std::int64_t>& extents) {
  std::int64_t n = 1;
  for (std::int64_t e : extents) n *= e;
  return n;
}

}  // namespace tally::manifest
