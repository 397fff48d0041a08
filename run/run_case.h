// Running a case on the in-process backend and judging it, and reading a verdict against a
// case's expectation.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "casefile/case.h"
#include "gradnorm/path.h"
#include "oracle/verdict.h"

namespace tally::run {

// Runs the case on the in-process backend and judges it. Throws casefile::InvalidCase. A
// collective that never completes is a verdict of kind infra_error, not an exception.
oracle::Verdict run_case(const casefile::Case& c, const oracle::JudgeOptions& judge = {});

// The run of a case together with what the path did on every rank, for readers of the run
// beyond its verdict (run/model_manifests.h). `result` is empty when the run hung (infra_error).
struct CaseRun {
  oracle::Verdict verdict;
  std::optional<gradnorm::PathResult> result;
};
// run_case, keeping the path's result. Throws casefile::InvalidCase.
CaseRun run_case_with_result(const casefile::Case& c, const oracle::JudgeOptions& judge = {});

// Whether `verdict` meets `expect`, and if not, one line saying why.
std::optional<std::string> unmet_expectation(const casefile::Expectation& expect,
                                             const oracle::Verdict& verdict);

// The statistic names a verdict failed on: its failing StatisticChecks, plus "ledger",
// "agreement" and "clipped" when those failed.
std::vector<std::string> failed_statistics(const oracle::Verdict& verdict);

}  // namespace tally::run
