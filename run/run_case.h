// The model target: a case run by tally's own model of the path (gradnorm/) on every rank of its
// topology, recorded (record/run_record.h) and judged by the one judge (oracle/judge.h); and a
// verdict read against a case's expectation.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "casefile/case.h"
#include "gradnorm/path.h"
#include "oracle/judge.h"
#include "oracle/verdict.h"
#include "record/run_record.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::run {

// Runs the case on the in-process backend and judges it. Throws casefile::InvalidCase. A
// collective that never completes is a verdict of kind infra_error, not an exception.
oracle::Verdict run_case(const casefile::Case& c, const oracle::JudgeOptions& judge = {});

// The run of a case together with its record, for readers of the run beyond its verdict
// (run/model_manifests.h). `record` is empty when the run hung (infra_error).
struct CaseRun {
  oracle::Verdict verdict;
  std::optional<record::RunRecord> record;
};
// run_case, keeping the record. Throws casefile::InvalidCase.
CaseRun run_case_with_record(const casefile::Case& c, const oracle::JudgeOptions& judge = {});

// Judges the model target's record of `c` (every rank of `layout`): the truth from the case's
// gradients, the error bounds of the path's reduction, every clipped gradient. The in-process
// backend and rank 0 of the process backends call it.
oracle::Verdict judge_model_run(const casefile::Case& c, const topologies::LogicalModel& model,
                                const topologies::RankLayout& layout,
                                const gradnorm::OptimizerPlan& plan, const record::RunRecord& run,
                                const oracle::JudgeOptions& judge = {});

// The ground truth a case is judged against (its gradients, p-norms and clipping).
oracle::GroundTruth truth_of(const topologies::LogicalModel& model,
                             const vocab::PathOptions& options, bool per_param = false);

// tally's version, "0.1.0".
std::string_view tally_version();

// "tally 0.1.0 (its model of the grad-norm path: optimizer plain, faults none)".
std::string model_target_producer(const vocab::PathOptions& options);

// Whether `verdict` meets `expect`, and if not, one line saying why.
std::optional<std::string> unmet_expectation(const casefile::Expectation& expect,
                                             const oracle::Verdict& verdict);

// The statistic names a verdict failed on: its failing StatisticChecks, plus "ledger",
// "agreement" and "clipped" (clipped values, or a real run's clipped statistics) when those
// failed, and "held-gradients" when a real run held gradients other than those tally gave it.
std::vector<std::string> failed_statistics(const oracle::Verdict& verdict);

}  // namespace tally::run
