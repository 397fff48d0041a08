#include "fuzz/shrink.h"

#include <algorithm>
#include <chrono>

namespace tally::fuzz {

FailureSignature failure_signature(const oracle::Verdict& verdict) {
  FailureSignature s;
  s.kind = verdict.kind;
  if (verdict.kind != oracle::Verdict::Kind::fail) return s;
  s.ledger = verdict.miscounted_total > 0;
  if (!verdict.miscounted.empty()) s.miscounted_class = verdict.miscounted.front().param_class;
  const std::vector<std::string> failed = run::failed_statistics(verdict);
  if (!failed.empty()) s.statistic = failed.front();
  return s;
}

bool fails_the_same_way(const FailureSignature& original, const oracle::Verdict& verdict) {
  if (verdict.kind != original.kind) return false;
  if (verdict.kind != oracle::Verdict::Kind::fail) return true;
  if ((verdict.miscounted_total > 0) != original.ledger) return false;
  if (!original.miscounted_class.empty() &&
      std::none_of(verdict.miscounted.begin(), verdict.miscounted.end(),
                   [&](const oracle::Miscount& m) { return m.param_class == original.miscounted_class; }))
    return false;
  if (original.statistic.empty()) return true;
  const std::vector<std::string> failed = run::failed_statistics(verdict);
  return std::find(failed.begin(), failed.end(), original.statistic) != failed.end();
}

std::string describe(const FailureSignature& s) {
  std::string out(oracle::kind_name(s.kind));
  if (s.kind != oracle::Verdict::Kind::fail) return out;
  std::string what;
  if (s.ledger)
    what = "ledger" + (s.miscounted_class.empty() ? std::string() : " (" + s.miscounted_class + ")");
  if (!s.statistic.empty() && s.statistic != "ledger")
    what += (what.empty() ? "" : ", ") + s.statistic;
  return what.empty() ? out : out + ": " + what;
}

std::string describe(const LastRound& round) {
  const int run = round.passed + round.failed_otherwise;
  const int all = run + round.invalid;
  if (all == 0) return "";
  const std::string invalid =
      round.invalid == 0 ? "" : ", " + std::to_string(round.invalid) + " not valid cases";
  if (round.failed_otherwise == 0 && round.passed > 0)
    return "its " + std::to_string(run) + " smaller candidates all pass" + invalid;
  return "of its " + std::to_string(all) + " smaller candidates, " + std::to_string(round.passed) + " pass and " +
         std::to_string(round.failed_otherwise) + " fail otherwise" + invalid;
}

ShrinkOutcome shrink_failure(const rc::Shrinkable<casefile::Case>& failing, const oracle::Verdict& verdict,
                             const CaseRunner& run, const ShrinkLimits& limits,
                             const std::function<bool()>& should_stop,
                             const std::function<void(const ShrinkOutcome&)>& on_step) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const FailureSignature signature = failure_signature(verdict);
  ShrinkOutcome outcome;
  outcome.shrunk = failing.value();
  outcome.verdict = verdict;
  rc::Shrinkable<casefile::Case> current = failing;
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  auto out_of_budget = [&] {
    return outcome.progress.runs >= limits.max_runs || elapsed() >= limits.max_seconds;
  };
  while (true) {
    bool accepted = false;
    rc::Seq<rc::Shrinkable<casefile::Case>> candidates = current.shrinks();
    while (rc::Maybe<rc::Shrinkable<casefile::Case>> candidate = candidates.next()) {
      if (should_stop && should_stop()) {
        outcome.interrupted = true;
        outcome.progress.seconds = elapsed();
        return outcome;
      }
      if (out_of_budget()) {
        outcome.progress.seconds = elapsed();
        return outcome;
      }
      casefile::Case value;
      try {
        value = candidate->value();
      } catch (const std::exception&) {
        ++outcome.progress.last_round.invalid;
        continue;  // a generator that gave up on this shrink
      }
      if (casefile::check_case(value)) {
        ++outcome.progress.last_round.invalid;
        continue;
      }
      ++outcome.progress.runs;
      oracle::Verdict got;
      try {
        got = run(value);
      } catch (const casefile::InvalidCase&) {
        ++outcome.progress.last_round.invalid;
        continue;
      }
      if (!fails_the_same_way(signature, got)) {
        ++(got.kind == oracle::Verdict::Kind::pass      ? outcome.progress.last_round.passed
           : got.kind == oracle::Verdict::Kind::refused ? outcome.progress.last_round.invalid
                                                        : outcome.progress.last_round.failed_otherwise);
        continue;
      }
      current = std::move(*candidate);
      outcome.shrunk = std::move(value);
      outcome.verdict = std::move(got);
      ++outcome.progress.steps;
      outcome.progress.last_round = {};
      outcome.progress.seconds = elapsed();
      if (on_step) on_step(outcome);
      accepted = true;
      break;
    }
    if (!accepted) break;
  }
  outcome.complete = true;
  outcome.progress.seconds = elapsed();
  return outcome;
}

}  // namespace tally::fuzz
