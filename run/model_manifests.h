// The manifests tally's own model of the grad-norm path would write (docs/manifest.md): for every
// rank of a case that ran, the groups, the local params with their boxes and gradient statistics,
// each child optimizer's stats group, duplicate-filter groups, clip coefficient and owned pieces
// with the filter's decisions, and the reported values, all with the case's faults applied. The
// decisions come from the path's own functions (make_main_params, own_elements, filter_rule,
// norm_share) and the PathResult, so `tally check` on these manifests judges what `tally run`
// judged.
//
// Faults whose effect lies outside what a manifest describes (averaged norms, the inf norm
// combined by L2, clipping with a child's own norm, padding counted as zeros, the zero count in
// float32) leave the decisions as the framework made them; the reported values (and the clip
// coefficients) carry the effect, so the check fails on its statistics. expert-norm-dropped
// records the dropped child's pieces as not kept for the norm (kept_zeros stays true): they never
// entered it, as the path's ledger says.
#pragma once

#include <string_view>
#include <vector>

#include "casefile/case.h"
#include "gradnorm/path.h"
#include "manifest/manifest.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::run {

// Megatron-LM's name of a group family (its ProcessGroupCollection's: "tp", "dp_cp", "mp",
// "ep", "expt_dp", "tp_ep_pp", "embd", "intra_dist_opt", ...); tally's own name with '_' for the
// groups only a faulty path reduces over ("expt_tp_pp", "expt_tp_dp_pp").
std::string_view group_name(topologies::Family family);

// One manifest per rank, in rank order. `result` must hold every rank of `layout` (run_path over
// all_ranks); it came from `model`, `layout` and `options`. A run that hung
// (empty-rank-skips-collective) has no PathResult and so no manifests. Throws
// std::invalid_argument when `result` lacks a rank or does not fit the model.
std::vector<manifest::RankManifest> manifests_from_run(const topologies::LogicalModel& model,
                                             const topologies::RankLayout& layout,
                                             const gradnorm::PathOptions& options,
                                             const gradnorm::PathResult& result);

// The same for a case (its model and layout built here). Throws casefile::InvalidCase for an invalid
// case.
std::vector<manifest::RankManifest> manifests_from_run(const casefile::Case& c,
                                             const gradnorm::PathResult& result);

}  // namespace tally::run
