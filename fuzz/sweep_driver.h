// A sweep as one run, beside the campaign (fuzz/campaign.h): its plan resumed from its state file,
// its cases run on lanes (fuzz/sweep_lanes.h), the state rewritten as they end, stopped by a lane
// whose machinery keeps failing or by an interrupt, and what it tells said to an observer. The CLI
// chooses the flags and prints; every rule of how a sweep goes lives here.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "casefile/case.h"
#include "fuzz/campaign.h"
#include "fuzz/sweep.h"
#include "oracle/verdict.h"
#include "run/target.h"

namespace tally::fuzz {

// Where a shard keeps its state unless told: CORPUS/sweep-state.json, or
// CORPUS/sweep-state-shard-I-of-N.json for shard I of N.
std::string default_sweep_state_file(const std::string& corpus, int shard, int shards);

// The sweep's report before any case ran: what it is (world, target, release, the plan's features
// and presets, shard) and its plan's counts.
SweepReport sweep_report_head(const SweepPlan& plan, int world, const std::string& target, const std::string& version,
                              int shard, int shards);

// What a state file gives a new run of the same sweep: the results that stand. Only this shard's
// cases count, and only where the number still names the same case (an earlier tally numbered a
// layout's cases otherwise); an infrastructure error is no verdict and runs again.
struct ResumedSweep {
  std::map<std::int64_t, SweepResult> done;
  std::int64_t renumbered = 0;  // results whose number names another case now: run again
  std::int64_t no_verdict = 0;  // infrastructure errors: run again
};
// Throws std::invalid_argument (one line naming the state) when `previous` is of another sweep
// than `head` (world, target, release, features or shard).
ResumedSweep resume_sweep(const SweepReport& previous, const SweepReport& head, const SweepPlan& plan,
                          const std::string& state_file);

// A resumed state's new failures matched again against today's known findings, so that a finding
// filed since the state was written (a saved run of it added to the --known folder) stops paging
// as new on the sweep's next resume. `judge` gives a saved failure's case and verdict again (from
// its case file and, on a real target, the manifests it saved), nullopt where the file is gone or
// no longer reads; a case file not where the state says is looked for beside the state file (a
// corpus copied elsewhere). A failure judged again that no longer fails keeps its record.
struct RematchedFailures {
  std::int64_t now_known = 0, still_new = 0, not_judged = 0;
};
using SavedFailureJudge =
    std::function<std::optional<std::pair<casefile::Case, oracle::Verdict>>(const std::string& case_file)>;
using KnownFindingOf = std::function<std::string(const casefile::Case&, const oracle::Verdict&)>;
RematchedFailures rematch_new_failures(ResumedSweep& resumed, const std::string& state_file, const SavedFailureJudge& judge,
                                       const KnownFindingOf& known);

// What a sweep's results count, and what they mean for the night.
struct SweepCounts {
  std::int64_t pass = 0, fail_new = 0, fail_known = 0, refused = 0, infra = 0;
  std::int64_t refused_by_framework = 0;  // of `refused`: by the framework as the worker set the case up
  std::int64_t model_checked = 0, model_disagrees = 0;
  std::map<std::string, std::int64_t> known_by_name, refused_by_reason, framework_refused_by_reason;
  // The cases tally sent the framework (all but those its own rules refused).
  std::int64_t sent() const { return pass + fail_new + fail_known + infra + refused_by_framework; }
};
SweepCounts count_sweep(const std::vector<SweepResult>& results);

// What a sweep's results say, for its exit code (fuzz/campaign.h).
Standing sweep_standing(const SweepCounts& counts);

// Where a sweep stands as a case ends: this run's cases (`ran` of `to_run`) and the shard's
// (`done` of `planned`, the state's included).
struct SweepProgress {
  std::int64_t ran = 0, to_run = 0;
  std::int64_t done = 0, planned = 0;
  double seconds = 0.0;  // since the lanes were open
};

// How a sweep's run ended.
struct SweepEnd {
  SweepReport report;  // every result: the state's and this run's, in case order
  double seconds = 0.0;
  bool stopped = false;       // interrupted, or a lane's machinery failing: resumable
  std::int64_t not_run = 0;   // of this shard's cases
  // A target that became unavailable (run::TargetUnavailable), the lanes' workers of different
  // releases, or a corpus that cannot be written; what ran is in the state all the same.
  std::exception_ptr error;
  std::string error_at;  // the case's id; "" when opening the lanes
};

// What a sweep tells as it goes: the CLI's printer and its report files (JUnit, the HTML index)
// each listen. Calls come one at a time, except `failure_saved`; the clock starts once the lanes
// are open.
class SweepObserver {
 public:
  virtual ~SweepObserver() = default;
  // Each case as it ends, whichever lane ran it.
  virtual void case_done(const SweepCase& /*sc*/, const SweepResult& /*result*/, const SweepProgress& /*progress*/) {}
  // A failure or infrastructure error is saved (file "" without a corpus). Called in the lane's
  // thread, side by side with other lanes: must be safe so.
  virtual void failure_saved(const SweepCase& /*sc*/, const casefile::Case& /*saved*/, const oracle::Verdict& /*verdict*/,
                             const std::string& /*case_file*/) {}
  // A lane's machinery keeps failing (machinery_failing): the sweep stops, resumable.
  virtual void machinery_stops(const std::string& /*why*/, std::size_t /*lane*/, std::size_t /*lanes*/) {}
  // The state is written for the last time.
  virtual void finished(const SweepEnd& /*end*/) {}
};

// Tells every observer of `all`, in order.
class SweepObservers final : public SweepObserver {
 public:
  explicit SweepObservers(std::vector<SweepObserver*> all) : all_(std::move(all)) {}
  void case_done(const SweepCase& sc, const SweepResult& result, const SweepProgress& progress) override;
  void failure_saved(const SweepCase& sc, const casefile::Case& saved, const oracle::Verdict& verdict,
                     const std::string& case_file) override;
  void machinery_stops(const std::string& why, std::size_t lane, std::size_t lanes) override;
  void finished(const SweepEnd& end) override;

 private:
  std::vector<SweepObserver*> all_;
};

struct SweepDrive {
  SweepReport head;  // sweep_report_head
  SweepPlan plan;
  ResumedSweep resumed;
  std::string state_file;
  // The corpus, known findings and release model of each case (its on_failure is the observer's).
  SweepRunOptions run;
  // The state is rewritten at most this often, and at the end: a kill loses the last seconds'
  // cases, which a resumed sweep runs again (a failure's saved case file is written again), and a
  // sweep with thousands of fast failures does not rewrite a growing state thousands of times
  // (the model's world-8 sweep spent three quarters of its time there).
  double save_every_seconds = 2.0;
};

// Runs the cases `drive.resumed` does not hold on `lanes` (a target per lane, opened here for the
// sweep's world; every lane must run the release lane 0 runs), rewriting the state file as they
// end, until the plan is done, `interrupted` says so (between cases), or a lane's machinery keeps
// failing. Throws std::runtime_error when the state cannot be written; other errors end the run
// (SweepEnd::error) after the state is saved.
SweepEnd drive_sweep(const SweepDrive& drive, std::span<run::Target* const> lanes, SweepObserver& observer,
                     const std::function<bool()>& interrupted);

// Removes the temporary files a killed sweep left in its corpus and its state's folder; how many.
int remove_killed_sweeps_leftovers(const std::string& corpus, const std::string& state_file);

}  // namespace tally::fuzz
