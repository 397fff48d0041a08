// Hand-built manifests of small runs, and how the tests of manifest/ check them as `tally check`
// does: the founding #6099 topology (TP 2, EP 2, ETP 1) with and without the fallback, and a
// distributed optimizer over DP 2 whose pieces are strided in the logical tensor.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "manifest/manifest.h"
#include "manifest/manifest_json.h"
#include "manifest/to_record.h"
#include "oracle/ground_truth.h"
#include "oracle/judge.h"

namespace tally::manifest::hand_built {

// What the check of a run found.
struct CheckReport {
  std::int64_t logical_params = 0;
  std::int64_t logical_elements = 0;
  double truth_norm = 0.0;
  oracle::Verdict verdict;
};

// The manifests as a record, judged with tally check's relative tolerance.
inline CheckReport check_run(const RunManifests& manifests) {
  const record::RunRecord run = to_record(manifests);
  CheckReport report;
  report.logical_params = static_cast<std::int64_t>(run.tensors.size());
  for (const record::Tensor& t : run.tensors) report.logical_elements += t.shape.numel();
  const oracle::GroundTruth truth = oracle::truth_from_box_statistics(run);
  report.truth_norm = truth.main.norm;
  report.verdict = oracle::judge(run, truth, oracle::Bounds{});
  return report;
}

// The id of `ranks` in a hand-built run's group table, added when new.
inline GroupId group(RunManifests& run, const std::vector<int>& ranks) {
  for (std::size_t g = 0; g < run.groups.size(); ++g)
    if (run.groups[g] == ranks) return static_cast<GroupId>(g);
  run.groups.push_back(ranks);
  return static_cast<GroupId>(run.groups.size() - 1);
}

inline Attributes replicated() { return {}; }
inline Attributes expert_replicated() {
  Attributes a;
  a.allreduce = false;
  return a;
}
inline Attributes tp_shard(int dim) {
  Attributes a;
  a.tensor_model_parallel = true;
  a.partition_dim = dim;
  return a;
}

inline GradStats ones(std::int64_t n) { return {static_cast<double>(n), 1.0, 0}; }

// Every element of a ModelParam's box owned whole and kept as `kept` says.
inline MainParam whole(int param, const ModelParam& p, bool kept) {
  std::int64_t n = 1;
  for (std::int64_t e : p.extents) n *= e;
  return {param, 0, n, p.attributes, kept, kept, p.stats};
}

// World 2, TP 2, EP 2, ETP 1 (DP 1, EDP 1): a norm weight replicated over TP, one expert FC2
// bias per EP rank, a column-parallel weight. All gradients 1. With `fallback`, the filter has
// no expert-TP group and de-duplicates the expert bias on the TP group (Megatron-LM #6099).
inline RunManifests founding_run(bool fallback) {
  RunManifests run;
  for (int r = 0; r < 2; ++r) {
    RankManifest m;
    m.producer = "test";
    m.rank = r;
    m.world = 2;
    m.parallel = {.tp = 2, .cp = 1, .pp = 1, .dp = 1, .ep = 2, .etp = 1};
    m.groups = {{"tp", group(run, {0, 1})}, {"expt_tp", group(run, {r})}, {"world", group(run, {0, 1})}};
    m.params = {
        {"norm.weight", "norm.weight", {8}, {0}, {8}, replicated(), ones(8)},
        {"local_experts.0.fc2.bias", "experts." + std::to_string(r) + ".fc2.bias", {8}, {0}, {8},
         expert_replicated(), ones(8)},
        {"fc1.weight", "fc1.weight", {4, 8}, {2 * r, 0}, {2, 8}, tp_shard(0), ones(16)},
    };
    OptimizerRecord o;
    o.name = "chained[0]";
    o.stats_group = group(run, {0, 1});
    o.tp_group = group(run, {0, 1});
    if (!fallback) o.expert_tp_group = group(run, {r});
    o.main_params = {whole(0, m.params[0], r == 0), whole(1, m.params[1], fallback ? r == 0 : true),
                     whole(2, m.params[2], true)};
    m.optimizers = {o};
    const double counted = fallback ? 8 + 8 + 32 : 8 + 16 + 32;
    m.reported = {std::sqrt(counted), std::nullopt, 0};
    run.ranks.push_back(m);
  }
  return run;
}

// The ManifestError to_record throws, or "no error".
inline std::string check_error(const RunManifests& run) {
  try {
    to_record(run);
  } catch (const ManifestError& error) {
    return error.what();
  }
  return "no error";
}

// The named statistic of the verdict, or null.
inline const oracle::StatisticCheck* stat(const CheckReport& report, const std::string& name) {
  for (const oracle::StatisticCheck& s : report.verdict.stats)
    if (s.name == name) return &s;
  return nullptr;
}

// A distributed optimizer over DP 2: each rank owns half of a row-parallel shard's row-major
// range, so pieces are strided in the logical tensor.
inline RunManifests distributed_run(std::int64_t split0, std::int64_t split1) {
  RunManifests run;
  for (int r = 0; r < 4; ++r) {  // TP 2 x DP 2, TP fastest
    const int tp_rank = r % 2;
    RankManifest m;
    m.rank = r;
    m.world = 4;
    m.parallel = {.tp = 2, .cp = 1, .pp = 1, .dp = 2, .ep = 1, .etp = 2};
    const GroupId tp = group(run, {r - tp_rank, r - tp_rank + 1});
    m.groups = {{"tp", tp}, {"expt_tp", tp}};
    m.params = {{"proj.weight", "proj.weight", {3, 8}, {0, 4 * tp_rank}, {3, 4}, tp_shard(1), ones(12)}};
    const bool first_half = r < 2;
    const std::int64_t split = tp_rank == 0 ? split0 : split1;
    MainParam piece = whole(0, m.params[0], true);
    piece.begin = first_half ? 0 : split;
    piece.end = first_half ? split : 12;
    piece.stats = ones(piece.end - piece.begin);
    OptimizerRecord o;
    o.name = "dist";
    o.stats_group = group(run, {0, 1, 2, 3});
    o.main_params = {piece};
    m.optimizers = {o};
    m.reported = {std::sqrt(24.0), std::nullopt, 0};
    run.ranks.push_back(m);
  }
  return run;
}

}  // namespace tally::manifest::hand_built
