// The distributed grad-norm path under test, run on ranks of a topology over a Communicator:
// main copies -> ownership -> duplicate filter -> local statistics -> reductions over each
// child's stats group -> combination -> clip coefficients -> clipped gradients. Faults switch
// single rules. Every decision is made once, here, and recorded in the run record
// (record/run_record.h) that the judge, the diagnosis and the manifest writer read.
//
// The path runs in two phases so the in-process backend can run every rank in one thread:
// phase 1 computes local statistics and issues the collectives; phase 2 reads their results.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "vocab/faults.h"
#include "gradnorm/optimizer_model.h"
#include "gradnorm/ownership.h"
#include "vocab/path_options.h"
#include "kernels/clip_scale.h"
#include "kernels/gradient_generator.h"
#include "kernels/local_stats.h"
#include "record/run_record.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::gradnorm {

struct PathResult {
  OptimizerPlan plan;
  // What the path did on the ranks it ran (RunRecord::ranks, in the order of the `ranks`
  // argument), with the run's tensors, norm groups, p-values, child names and groups. Every
  // piece's keep decision and rule are the path's own (run_local_phase decides once); statistics
  // are not recorded: the gradients are a pure function of the case.
  record::RunRecord record;
};

// Runs the path on `ranks` of the layout: every rank for the in-process backend, one (or k) for
// a process-per-rank backend. Throws comm::InfraError when a collective never completes. With
// clipping on (options.max_norm > 0), each rank clips its local gradients with `clip_scale` and
// records them (RankRecord::clipped).
PathResult run_path(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
                    const vocab::PathOptions& options, comm::Communicator& communicator,
                    std::span<const int> ranks,
                    kernels::LocalStatsFn local_stats = kernels::local_stats_cpu,
                    kernels::ClipScaleFn clip_scale = kernels::clip_scale_cpu);

// The families whose groups the path reduces over for `plan` with `options`: each child's stats
// and clip groups, the groups of average-local-norms-over-dp, and, where the gradients enter
// before it, those of Megatron's gradient reduction (gradnorm/reduction.h). Process-per-rank
// backends create communicators for these only.
std::vector<topologies::Family> families_reduced_over(const OptimizerPlan& plan,
                                                      const vocab::PathOptions& options);

// All ranks of the layout, for the in-process backend.
std::vector<int> all_ranks(const topologies::RankLayout& layout);

}  // namespace tally::gradnorm
