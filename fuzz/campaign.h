// A fuzz campaign: generate cases from a seed, run each, and for each failure write the case
// file to the corpus (before shrinking starts, so nothing found is ever lost), shrink it, and
// write the shrunk case next to it. The mutation score runs one campaign per fault.
//
// Reproducibility: case i of the campaign with seed S is generate_case(options, S, i)
// (fuzz/generators.h) and nothing else; the same seed gives the same cases in the same order,
// and so the same failures, files and shrunk cases.
#pragma once

#include <rapidcheck.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "casefile/case.h"
#include "run/run_case.h"
#include "run/target.h"
#include "fuzz/generators.h"
#include "fuzz/shrink.h"
#include "vocab/faults.h"

namespace tally::fuzz {

struct CampaignOptions {
  std::uint64_t seed = 1;
  std::int64_t max_cases = 0;  // stop after this many cases; 0: no bound
  double max_seconds = 0.0;    // stop after this long; 0: no bound
  CaseGenOptions generator;
  std::string corpus_dir;  // failures are written here (created when needed); empty: nowhere
  ShrinkLimits shrink;
  // false: a failure that an earlier failure of the campaign repeats (the same signature and the
  // same planted faults) is written to the corpus but not shrunk (a framework's known miscount
  // would otherwise spend the campaign on shrinking it again and again), and does not count
  // towards max_failures.
  bool shrink_repeated_signatures = true;
  int max_failures = 0;  // stop after this many failures (shrunk ones); 0: no bound
  // The known finding a failure repeats, "" when it is new (fuzz/known.h): a known one is saved
  // but not shrunk, and does not count towards max_failures. Empty: every failure is new.
  std::function<std::string(const casefile::Case& c, const oracle::Verdict& verdict)> known;
  // A target of one world per worker (a real framework) is opened for this world and every case
  // has it; tally's model runs each case's own world (on an mpi or nccl job, the job's).
  int world = 0;
  // Threads generating and running cases side by side, ahead of the loop that takes their verdicts
  // in order (fuzz/run_ahead.h): the same cases, failures and files as one thread. More than one
  // needs a target that runs cases side by side (run::Target::runs_cases_side_by_side).
  unsigned jobs = 1;
};

struct Failure {
  std::int64_t index = 0;  // the case number in the campaign
  casefile::Case original;           // with its expectation
  oracle::Verdict original_verdict;
  FailureSignature signature;
  std::string original_path;  // empty without a corpus
  // Not shrunk: the campaign's earlier failure (its case number) with the same signature and faults.
  std::optional<std::int64_t> same_as;
  std::string known;  // not shrunk either: the known finding it repeats (CampaignOptions::known)
  bool shrunk_done = false;   // the fields below are set (failure_found comes before)
  casefile::Case shrunk;                // with its expectation
  oracle::Verdict shrunk_verdict;
  std::string shrunk_path;
  ShrinkProgress shrink;
  bool shrink_complete = false;  // a local minimum (not stopped by a budget or an interrupt)
};

// A case that gave no verdict on a real framework (run::TargetAbilities::framework): a worker
// that reported an error, died or hung. It is no failure and is
// never shrunk, and the campaign stops there: each further case would wait on the same broken
// machinery, and no count of failures is true while it is broken.
struct InfraStop {
  std::int64_t index = 0;    // the case number; while shrinking a failure, that failure's
  bool while_shrinking = false;  // a shrink candidate of failure `index` gave it
  casefile::Case c;          // with its expectation (infra-error)
  oracle::Verdict verdict;   // its call and message (a worker's: with the end of its log)
  std::string path;          // the case in the corpus; empty without one
  std::string message_path;  // next to it, <seed>-<index>.infra-error.txt: the call and the message
};

struct CampaignResult {
  enum class Stop { cases, time, interrupted, max_failures, infra_error };
  std::uint64_t seed = 0;
  std::int64_t cases = 0;
  double seconds = 0.0;
  Stop stopped_by = Stop::cases;
  std::vector<Failure> failures;
  std::optional<InfraStop> infra_error;  // set when stopped_by is infra_error
  // A real framework's cases by the code that computes their norm (known_path: the optimizer
  // model, Megatron-FSDP's strategy, DeepSpeed's optimizer): what a campaign drew of each. Empty on
  // tally's model.
  std::map<std::string, std::int64_t> cases_by_norm_code;
  // Of those, the cases whose gradients entered before the framework's own reduction (each rank's
  // share, run/contributions.h): both stages are drawn where the worker runs both.
  std::int64_t cases_before_reduction = 0;
  // Cases a real framework declined with a check of its own while setting them up, by its reason
  // ("deepspeed 0.19.8: rank 0: ValueError: ..."): counted, not failures, and the campaign goes on.
  std::map<std::string, std::int64_t> refused_by_reason;
};
std::string_view stop_name(CampaignResult::Stop stop);  // "cases", "time", ..., "infra-error"

// A run the framework mostly refused checked nothing worth a count (a campaign, or a sweep):
// one line saying so, or nullopt. `refused` by the framework of `sent` cases.
std::optional<std::string> nothing_checked(std::int64_t refused, std::int64_t sent);

// What a campaign's or a sweep's results say, for the exit code: no new failure; new failures
// (known findings are no news); or no true count (an infrastructure error, or nothing checked).
enum class Standing { clean, new_failures, no_true_count };

// The cases a real framework refused itself (CampaignResult::refused_by_reason, summed).
std::int64_t refused_by_framework(const CampaignResult& result);
// Failures that repeat no known finding.
std::int64_t new_failures(const CampaignResult& result);
Standing campaign_standing(const CampaignResult& result);

// The faults a campaign's cases switch on, one per case, on a target that plants `plants`: `all`
// keeps every fault of `asked` the target plants; otherwise each must be one it plants. Throws
// std::invalid_argument (one line naming the fault and what the target plants instead).
std::vector<vocab::Fault> faults_to_plant(std::vector<vocab::Fault> asked, bool all, const run::FaultPlants& plants);


// What a campaign tells as it goes (the CLI prints it; tests check the order of events).
class CampaignObserver {
 public:
  virtual ~CampaignObserver() = default;
  virtual void case_done(std::int64_t /*cases*/, int /*failures*/, double /*seconds*/) {}
  // The original is on disk (when there is a corpus); shrinking starts next.
  virtual void failure_found(const Failure& /*failure*/) {}
  virtual void shrink_step(const Failure& /*failure*/, const ShrinkOutcome& /*outcome*/) {}
  // The shrunk case is on disk (when there is a corpus).
  virtual void failure_shrunk(const Failure& /*failure*/) {}
  // A failure not shrunk (Failure::same_as, Failure::known): its original is on disk, and nothing follows.
  virtual void failure_not_shrunk(const Failure& /*failure*/) {}
  // The campaign stops at an infrastructure error; its case and message are on disk (when there is
  // a corpus).
  virtual void infra_error(const InfraStop& /*stop*/) {}
};

// Runs the campaign on `target` (opened for options.world, its generator aimed at it) until a
// bound is reached, a real framework's case (or a shrink candidate) gives an infrastructure error,
// which stops it, or `stop` becomes true (checked between cases and between shrink candidates; the
// case in progress finishes, and a shrink in progress writes what it has). On tally's model a hang
// is what the case's path does (the fault empty-rank-skips-collective): a failure to shrink like
// any other. Throws std::runtime_error when the corpus cannot be written, run::TargetUnavailable
// when the target cannot be opened, and std::logic_error when the generator produces an invalid
// case (a bug of tally).
CampaignResult run_campaign(const CampaignOptions& options, run::Target& target, CampaignObserver& observer,
                            const std::atomic<bool>* stop = nullptr);

// ---- The mutation score.

struct MutantOptions {
  std::int64_t budget = 1000;  // cases per fault
  std::uint64_t seed = 1;
  // The cases each fault's campaign generates (its `faults` are set per fault), before they are
  // aimed at the target.
  CaseGenOptions generator;
  int world = 0;  // as CampaignOptions
  ShrinkLimits shrink;
  std::vector<vocab::Fault> faults;  // empty: the whole catalog
  std::string corpus_dir;               // empty: failures are not written
};

struct MutantResult {
  vocab::Fault fault{};
  std::string not_applicable;  // non-empty: why this backend cannot run it, and nothing was run
  bool found = false;
  std::int64_t cases = 0;  // cases run (the finding one included)
  double seconds = 0.0;
  std::optional<Failure> failure;
  // The fault's campaign stopped at an infrastructure error; run_mutants runs no further fault.
  std::optional<InfraStop> infra_error;
};

// For each fault, a campaign on `target` with only that fault until a case fails or the budget is
// spent; a fault the target cannot plant is not applicable (its reason). On a real framework,
// which may miscount on its own (a finding of `tally fuzz`, not of the planted fault), a failure
// counts for the fault only if the case passes without it: each failing case, and each failing
// shrink, is run once more with no fault; and all stop at the first infrastructure error.
// `on_result` hears of each fault's result as soon as it is known.
std::vector<MutantResult> run_mutants(const MutantOptions& options, run::Target& target,
                                      const std::function<void(const MutantResult&)>& on_result = {},
                                      const std::atomic<bool>* stop = nullptr);

}  // namespace tally::fuzz
