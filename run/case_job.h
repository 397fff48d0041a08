// A case job: one case through a target, in the one order the commands that run a given case use
// (`tally run`, `tally replay`):
//
//   1. the case's framework against the target's (a case of another framework is refused, or,
//      for a replay without a framework, judged from the manifests its file saved);
//   2. the case's own rules (casefile::check_case: bad input);
//   3. what no release of the target runs, then, opened for the case's world, what its release
//      does not run (refused with the reason, before any run);
//   4. saved (before the run: a crash loses nothing);
//   5. run (a framework whose own check declines the case while setting it up refuses it here, the
//      case saved as asked but without evidence); its manifests written where asked;
//   6. saved again with its evidence (a real target's manifests next to the case file) and, where
//      asked, with the expectation the run showed;
//   7. the verdict held against the case's expectation.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include "casefile/case.h"
#include "manifest/manifest.h"
#include "oracle/verdict.h"
#include "run/target.h"

namespace tally::run {

// A file or folder the job was asked to write and could not (the message names it): bad input,
// exit code 2.
class JobOutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CaseJob {
  casefile::Case c;
  std::string source;  // the case file it was read from; "" for a case given by flags
  std::string save;    // write the case here (atomically) before the run, and again after it
  // The expectation the saved case records: the one it has, pass, fail, or what the run shows
  // (its outcome, failed statistics and miscounted params).
  enum class Expect { as_given, pass, fail, observed };
  Expect expect = Expect::as_given;
  std::string manifests;  // write the run's manifests to this folder (docs/manifest.md)
  int manifest_version = manifest::kManifestVersion;
  // A case of a framework, given to a target that is none: judge the manifests its case file
  // saved (next to `source`) instead of refusing it (`tally replay` without --target).
  bool judge_saved_runs = false;
  // More cases follow this one in the same job (`tally replay`): a case expecting a hang is refused
  // where a hang ends the whole job (Target::hang_ends_the_job), since it would end them too.
  bool more_cases_follow = false;
};

struct CaseJobResult {
  casefile::Case c;  // as it ran and was saved: its target section, its expectation
  // Set when the job stopped before the run: one line saying why the case is not for this target
  // or what the target does not run. `verdict` and the rest are then unset.
  std::optional<std::string> refused;
  // `refused` by the framework's own check as the worker set the case up (step 5), not by a rule.
  bool refused_by_framework = false;
  oracle::Verdict verdict;
  std::optional<std::string> unmet;  // the case has an expectation and the verdict does not meet it
  bool manifests_written = false;    // `manifests` asked, and the run left some (a hang leaves none)
  std::string how;  // how the verdict came about, where not by tally's model
  double seconds = 0.0;
};

// Runs `job` on `target`. Throws casefile::InvalidCase for a case that breaks its own rules (and
// NotRunnableHere where it does not fit a job's world), JobOutputError when `save` or `manifests`
// cannot be written (or the target writes no manifests), and TargetUnavailable when the target
// cannot be opened or its machinery fails. Nothing is written for a case that is refused or throws
// before its run.
CaseJobResult run_case_job(Target& target, CaseJob job);

// The expectation a run showed: its outcome, the statistics it failed and the params it
// miscounted (at most `max_params` of them, in param order; 0: all).
casefile::Expectation observed_expectation(const oracle::Verdict& verdict, std::size_t max_params = 0);

}  // namespace tally::run
