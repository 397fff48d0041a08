// A real target's run of a case, judged as strictly as the model target's: the truth is the
// case's own (oracle/ground_truth.h from the gradients tally generated and sent the worker), and
// every statistic the manifests record of a gradient is held to the values of that gradient
// (oracle/held_gradients.h). Manifests that are not of the case (another world, other parallel
// sizes or groups, another model) are an infrastructure error naming the difference, never a
// verdict: they say nothing about how the framework counts the case.
#pragma once

#include <functional>
#include <map>
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

// The request a worker's run answers (run/framework_worker.h): its case's name on the queue and
// the digest every manifest must echo, and the cases sent before it on that queue by digest, so
// that manifests of one of them are named as that case's.
struct SentRequest {
  std::string name;    // "case-4"
  std::string digest;  // case-4.gradients.json's case_digest
  std::map<std::string, std::string> earlier;  // digest -> name
};

// Why `manifests` do not answer `request`: a rank whose manifest echoes no digest, or another
// case's (named where it was sent before); nullopt when every rank echoes the request's.
std::optional<std::string> manifests_not_of_request(const manifest::RunManifests& manifests,
                                                    const SentRequest& request);

// Judges the manifests in `dir` as a run of `c` with relative tolerance `rtol`. A folder that
// cannot be read, manifests that do not answer `request` (where given: a worker's run), or
// manifests of another case, give an infra-error verdict naming `dir`.
oracle::Verdict judge_target_run(const casefile::Case& c, const std::string& dir, double rtol,
                                 const SentRequest* request = nullptr);

// The judge a worker pool hands each answer to (run/framework_worker.h): judge_target_run with
// `rtol`, the request given.
std::function<oracle::Verdict(const casefile::Case&, const std::string&, const SentRequest&)> judge_as_a_run_of_the_case(
    double rtol);

// Judges the manifests in `dir` with the judge `tally check` uses (truth from the manifests'
// statistics), with no case. Throws manifest::ManifestError (or std::runtime_error) when they
// cannot be read.
oracle::Verdict judge_manifests(const std::string& dir, double rtol);

// Judges a saved run of `c` (the manifests its case file names, in `dir`), without the framework.
// Manifests that echo a case digest must all echo `c`'s (logical_gradients): a worker's answer to
// another case, saved with its infrastructure error, is never judged as the framework's run of this
// one. Manifests saved before workers echoed a digest (none of them has one) are judged as they are.
oracle::Verdict judge_saved_run_of(const casefile::Case& c, const std::string& dir, double rtol);

// The same for manifests already read.
oracle::Verdict judge_target_manifests(const casefile::Case& c, const manifest::RunManifests& manifests,
                                       double rtol);

}  // namespace tally::run
