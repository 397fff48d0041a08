// The one order in which every command takes a case through a target (tally run and replay through
// run/case_job.h, a campaign's cases and shrinks in fuzz/campaign.cpp, a sweep's cases in
// fuzz/sweep.cpp):
//   1. tally's rules for the target before it opens (what no release of it runs);
//   2. the target opened for the case's world, and its release's rules;
//   3. the case's target section (its framework and release), as a saved case carries it;
//   4. the run, in which the framework's own check may decline the case as the worker sets it up.
// A refusal at 1, 2 or 4 is no verdict; the refusal says which it was.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "casefile/case.h"
#include "run/target.h"

namespace tally::run {

struct CaseRefusal {
  enum class By { rules, release_rules, framework };
  By by = By::rules;
  // Who refused: "--target megatron-core", "--target megatron-core 0.19.2", "tally's model", or the
  // framework's release ("megatron-core 0.19.2") that declined the case as it set it up.
  std::string who;
  std::string why;  // the rule (one line naming the field), or the framework's own message
  bool by_framework() const { return by == By::framework; }
  // "<who> cannot run this case: <why>", or "<who> refused this case as it set it up: <why>".
  std::string text() const;
};

// Steps 1 and 2: why `target` does not run `c`, opening it for c's world; nullopt when it does.
// Throws TargetUnavailable (and NotRunnableHere where `c` does not fit a job's world).
std::optional<CaseRefusal> refusal_of(Target& target, const casefile::Case& c);

// Steps 3 and 4 for a case refusal_of lets through: `c` with its target section, and its run, or
// the framework's refusal (then `run` holds the refused verdict). `before_run` hears the case, its
// section set, just before the run (a job saves it then: a crash loses nothing). Throws as
// Target::execute, and what `before_run` throws.
struct DrivenRun {
  casefile::Case c;
  std::optional<CaseRefusal> refused;
  TargetRun run;
};
DrivenRun run_on_target(Target& target, casefile::Case c, bool keep_record,
                        const std::function<void(const casefile::Case&)>& before_run = {});

}  // namespace tally::run
