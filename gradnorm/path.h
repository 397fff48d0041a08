// The distributed grad-norm path under test, run on ranks of a topology over a Communicator:
// main copies -> ownership -> duplicate filter -> local statistics -> reductions over each
// child's stats group -> combination -> clip coefficients. Faults switch single rules.
//
// The path runs in two phases so the in-process backend can run every rank in one thread:
// phase 1 computes local statistics and issues the collectives; phase 2 reads their results.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "gradnorm/faults.h"
#include "gradnorm/optimizer_model.h"
#include "gradnorm/ownership.h"
#include "gradnorm/path_options.h"
#include "kernels/gradient_generator.h"
#include "kernels/local_stats.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::gradnorm {

// The shard of a main copy's box a piece reads: `range` of the box (the whole box needs no
// range).
kernels::ShardDesc shard_desc(const topologies::LogicalParam& logical,
                              const topologies::LocalParam& local, kernels::ElementRange range);

// Where the statistics of an owned piece that the duplicate filter kept go: the main norm, the
// MTP norm (its own grad_norm_group), or only the zero count (its child's norm is discarded:
// expert-norm-dropped). Every kept piece is in the zero count; a dropped piece is nowhere.
enum class NormShare : std::uint8_t { main, mtp, zeros_only };
NormShare norm_share(const OptimizerPlan& plan, const MainParam& param,
                     const topologies::LogicalParam& logical, const FaultSet& faults);

// What one child optimizer did on a rank.
struct ChildOutcome {
  topologies::GroupId group;      // the group its statistics were reduced over
  double norm = 0.0;              // its own main norm (the reduction's, when shared)
  double clip_coefficient = 1.0;  // the scale its main params were multiplied by
};

struct RankResult {
  int rank = 0;
  double norm = 0.0;      // the main L2 norm (MTP params excluded)
  double inf_norm = 0.0;  // max |g| of the main group
  std::vector<double> p_norms;
  std::int64_t zeros = 0;  // every group, MTP included
  double mtp_norm = 0.0;
  double clip_coefficient = 1.0;  // max_norm / (norm + 1e-6) when below 1, else 1
  double mtp_clip_coefficient = 1.0;
  std::vector<ChildOutcome> children;
  // Elements counted per logical param in its norm group, reduced over the same groups as the
  // norm. Ranks whose children reduced over the same groups share one vector.
  std::shared_ptr<const std::vector<std::int64_t>> ledger;
};

struct PathResult {
  OptimizerPlan plan;
  std::vector<RankResult> ranks;  // in the order of the `ranks` argument
};

// Runs the path on `ranks` of the layout: every rank for the in-process backend, one for a
// process-per-rank backend. Throws comm::InfraError when a collective never completes.
PathResult run_path(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
                    const PathOptions& options, comm::Communicator& communicator,
                    std::span<const int> ranks,
                    kernels::LocalStatsFn local_stats = kernels::local_stats_cpu);

// All ranks of the layout, for the in-process backend.
std::vector<int> all_ranks(const topologies::RankLayout& layout);

// What one rank did with one logical param: the pieces it owned, the rule the filter applied
// and how many elements it counted. Recomputed on demand for diagnosis.
struct ParamOnRank {
  int rank = 0;
  int child = 0;
  std::int64_t held = 0;     // elements of its local copy (the box)
  std::int64_t owned = 0;    // elements its optimizer owns
  std::int64_t counted = 0;  // owned and kept
  Rule rule = Rule::kept_tensor_parallel;
  bool shared_copy = false;
};
std::vector<ParamOnRank> explain_param(const topologies::LogicalModel& model,
                                       const topologies::RankLayout& layout,
                                       const PathOptions& options, const OptimizerPlan& plan,
                                       int rank, int logical_id);

// The coefficient `result`'s rank multiplied a main copy of `logical_id` by (1: unclipped).
double applied_clip(const RankResult& result, const OptimizerPlan& plan,
                    const topologies::LogicalModel& model, int logical_id);

}  // namespace tally::gradnorm
