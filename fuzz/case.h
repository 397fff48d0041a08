// A case: one parallel configuration, one model, one optimizer model with its gradients and
// statistics, the faults switched on, and what the run is expected to give. The unit the fuzzer
// generates and shrinks, case files store, and `tally run` and `tally replay` run.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gradnorm/path.h"
#include "oracle/verdict.h"
#include "topologies/model_spec.h"
#include "topologies/parallel_config.h"

namespace tally::fuzz {

struct Expectation {
  enum class Outcome { pass, fail, infra_error };
  Outcome outcome = Outcome::pass;
  // For fail: statistics that must fail ("l2", "zeros", "agreement", "clipped", "ledger", ...)
  // and logical params that must be miscounted. Empty: any failure will do.
  std::vector<std::string> statistics;
  std::vector<std::string> miscounted;
  friend bool operator==(const Expectation&, const Expectation&) = default;
};
std::string_view outcome_name(Expectation::Outcome outcome);  // "pass", "fail", "infra-error"

struct Case {
  std::string description;
  topologies::ParallelConfig topology;
  topologies::ModelSpec model;
  gradnorm::PathOptions path;
  std::optional<Expectation> expect;
  friend bool operator==(const Case&, const Case&) = default;
};

// A case that breaks a rule of the configuration, the model or the options. exit code 2.
class InvalidCase : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The first problem with the case as one line, or nullopt: check_config, check_model for the
// configuration, and the option rules (finite p > 0, finite max_norm >= 0, ...).
std::optional<std::string> check_case(const Case& c);

// Runs the case on the in-process backend and judges it. Throws InvalidCase. A collective that
// never completes is a verdict of kind infra_error, not an exception.
oracle::Verdict run_case(const Case& c, const oracle::JudgeOptions& judge = {});

// The run of a case together with what the path did on every rank, for readers of the run
// beyond its verdict (manifest/from_path.h). `result` is empty when the run hung (infra_error).
struct CaseRun {
  oracle::Verdict verdict;
  std::optional<gradnorm::PathResult> result;
};
// run_case, keeping the path's result. Throws InvalidCase.
CaseRun run_case_with_result(const Case& c, const oracle::JudgeOptions& judge = {});

// Whether `verdict` meets `expect`, and if not, one line saying why.
std::optional<std::string> unmet_expectation(const Expectation& expect,
                                             const oracle::Verdict& verdict);

// The statistic names a verdict failed on: its failing StatisticChecks, plus "ledger",
// "agreement" and "clipped" when those failed.
std::vector<std::string> failed_statistics(const oracle::Verdict& verdict);

}  // namespace tally::fuzz
