// A real target's run of a case, judged as strictly as the model target's: the truth is the
// case's own (oracle/ground_truth.h from the gradients tally generated and sent the worker), and
// every statistic the manifests record of a gradient is held to the values of that gradient
// (oracle/held_gradients.h). Manifests that are not of the case (another world, other parallel
// sizes or groups, another model) are an infrastructure error naming the difference, never a
// verdict: they say nothing about how the framework counts the case.
#pragma once

#include <optional>
#include <string>

#include "casefile/case.h"
#include "manifest/manifest.h"
#include "oracle/verdict.h"
#include "record/run_record.h"
#include "topologies/logical_model.h"

namespace tally::run {

// Why `manifests` are not a run of `c` (its world, parallel sizes, each rank's TP and expert TP
// group, its model's params by name and shape), as one line; nullopt when they are.
std::optional<std::string> manifests_not_of_case(const casefile::Case& c, const topologies::LogicalModel& model,
                                                 const manifest::RunManifests& manifests);

// The record of `manifests` with its tensors renumbered as `model`'s params (the ids the truth
// and the generators use). Requires manifests_not_of_case to have found no difference.
record::RunRecord record_in_model_order(const manifest::RunManifests& manifests,
                                        const topologies::LogicalModel& model);

// Judges the manifests in `dir` as a run of `c` with relative tolerance `rtol`. A folder that
// cannot be read, or manifests of another case, give an infra-error verdict naming `dir`.
oracle::Verdict judge_target_run(const casefile::Case& c, const std::string& dir, double rtol);

// The same for manifests already read.
oracle::Verdict judge_target_manifests(const casefile::Case& c, const manifest::RunManifests& manifests,
                                       double rtol);

}  // namespace tally::run
