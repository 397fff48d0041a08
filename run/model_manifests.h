// The manifests the model target writes (docs/manifest.md), so `tally check` can be run on tally's
// own model of the path: for every rank, its run record (record/run_record.h: every decision the
// path made, read here and never made again) in the manifest format, with Megatron-LM's group
// names, the local names of the sharding, and each box's and piece's gradient statistics, which
// the oracle computes from the case's gradients (oracle/ground_truth.h).
//
// What a manifest cannot say: faults that act outside those decisions (averaged norms, the inf
// norm combined by L2, a child clipped by its own norm, padding counted as zeros, a float32 zero
// count, and the reduction faults, whose gradients differ from the case's) show only in the
// reported values and clip coefficients; the MTP norm is not in the
// format, so MTP pieces are written as not kept for the (main) norm.
#pragma once

#include <string_view>
#include <vector>

#include "casefile/case.h"
#include "manifest/manifest.h"
#include "record/run_record.h"
#include "topologies/rank_layout.h"

namespace tally::run {

// Megatron-LM's name of a group family (its ProcessGroupCollection's: "tp", "dp_cp", "mp",
// "ep", "expt_dp", "tp_ep_pp", "embd", "intra_dist_opt", ...); tally's own name with '_' for the
// groups only a faulty path reduces over ("expt_tp_pp", "expt_tp_dp_pp").
std::string_view group_name(topologies::Family family);

// One manifest per rank, in rank order, and the run's group table, from the model target's record of `c` (every rank of
// its world, as run_case_with_record returns it). Throws casefile::InvalidCase for an invalid
// case and std::invalid_argument when `run` is not a record of it.
manifest::RunManifests model_manifests(const casefile::Case& c, const record::RunRecord& run);

}  // namespace tally::run
