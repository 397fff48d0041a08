// Shrinking a failing case: walk RapidCheck's shrink tree greedily, keeping the first shrink
// that still fails the same way, until no shrink does or a budget is spent. The generators
// (fuzz/generators.h) order every choice so that the first shrinks tried are the smallest:
// world, then layers and experts, then sizes, then options.
#pragma once

#include <rapidcheck.h>

#include <functional>
#include <string>

#include "casefile/case.h"
#include "run/run_case.h"
#include "oracle/verdict.h"

namespace tally::fuzz {

// Runs one case and judges it (the in-process backend, or another).
using CaseRunner = std::function<oracle::Verdict(const casefile::Case&)>;

// How a verdict failed, as far as shrinking must preserve it: the verdict kind, whether the
// ledger failed (some param counted a wrong number of times) and the class of the first
// miscounted param, and the first failing statistic.
struct FailureSignature {
  oracle::Verdict::Kind kind = oracle::Verdict::Kind::fail;
  bool ledger = false;
  std::string miscounted_class;  // ledger failures: e.g. "expert-row-bias"
  std::string statistic;         // the first of run::failed_statistics, e.g. "l2", "zeros", "ledger"
  friend bool operator==(const FailureSignature&, const FailureSignature&) = default;
};

// The signature of a verdict that is not a pass.
FailureSignature failure_signature(const oracle::Verdict& verdict);

// Whether `verdict` fails the same way: the same kind; for a fail, the same ledger outcome, the
// original's miscounted class among its miscounted params, and the original's first failing
// statistic among its failing statistics.
bool fails_the_same_way(const FailureSignature& original, const oracle::Verdict& verdict);

// "fail: zeros" or "fail: ledger (expert-row-bias), l2" or "infra-error".
std::string describe(const FailureSignature& signature);

struct ShrinkLimits {
  int max_runs = 1000;       // cases run while shrinking
  double max_seconds = 60;  // wall-clock time spent shrinking
};

// What the smaller candidates of the shrunk case gave: why it is as small as it is. At a local
// minimum every one of them ran and none failed the same way.
struct LastRound {
  int passed = 0;            // the candidate passed: the smaller case does not show the failure
  int failed_otherwise = 0;  // it failed, with another signature (or an infrastructure error)
  int invalid = 0;           // not a valid case, its generation gave up, or the framework declined it
};

struct ShrinkProgress {
  int steps = 0;  // shrinks accepted
  int runs = 0;   // candidates run
  double seconds = 0.0;
  LastRound last_round;  // of the current shrunk case's candidates, reset at each accepted shrink
};

// "its 29 smaller candidates all pass" or "of its 29 smaller candidates, 27 pass and 2 fail
// otherwise" (invalid ones named too); "" when it had none.
std::string describe(const LastRound& round);

struct ShrinkOutcome {
  casefile::Case shrunk;
  oracle::Verdict verdict;  // the shrunk case's
  ShrinkProgress progress;
  bool complete = false;     // no shrink of `shrunk` fails the same way (a local minimum)
  bool interrupted = false;  // should_stop said so
};

// Shrinks `failing` (whose value fails with `verdict`). Candidates that are not valid cases or
// whose generation throws are skipped. `should_stop` is asked between candidates; `on_step`
// hears of every accepted shrink.
ShrinkOutcome shrink_failure(const rc::Shrinkable<casefile::Case>& failing, const oracle::Verdict& verdict,
                             const CaseRunner& run, const ShrinkLimits& limits,
                             const std::function<bool()>& should_stop = {},
                             const std::function<void(const ShrinkOutcome&)>& on_step = {});

}  // namespace tally::fuzz
