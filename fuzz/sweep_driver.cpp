#include "fuzz/sweep_driver.h"

#include <chrono>
#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "fuzz/sweep_lanes.h"
#include "io/atomic_file.h"

namespace tally::fuzz {

namespace fs = std::filesystem;

std::string default_sweep_state_file(const std::string& corpus, int shard, int shards) {
  return (fs::path(corpus) / (shards > 1 ? "sweep-state-shard-" + std::to_string(shard) + "-of-" + std::to_string(shards) + ".json"
                                         : std::string("sweep-state.json")))
      .string();
}

SweepReport sweep_report_head(const SweepPlan& plan, int world, const std::string& target, const std::string& version,
                              int shard, int shards) {
  SweepReport head;
  head.world = world;
  head.target = target;
  head.version = version;
  head.features = plan.models;
  head.shard = shard;
  head.shards = shards;
  head.configurations = plan.layouts.configurations;
  head.layouts = static_cast<std::int64_t>(plan.layouts.layouts.size());
  head.total_cases = plan.total_cases;
  head.features_not_applicable = plan.features_not_applicable;
  return head;
}

ResumedSweep resume_sweep(const SweepReport& previous, const SweepReport& head, const SweepPlan& plan,
                          const std::string& state_file) {
  if (previous.world != head.world || previous.target != head.target || previous.version != head.version ||
      previous.features != head.features || previous.shard != head.shard || previous.shards != head.shards)
    throw std::invalid_argument(state_file + " is of another sweep (" + previous.target + " " + previous.version + ", world " +
                                std::to_string(previous.world) + ", shard " + std::to_string(previous.shard) + "/" +
                                std::to_string(previous.shards) + ")");
  std::map<std::int64_t, std::string> planned;
  for (const SweepCase& sc : plan.cases) planned.emplace(sc.index, sc.id);
  ResumedSweep resumed;
  for (const SweepResult& r : previous.results) {
    const auto it = planned.find(r.index);
    if (it == planned.end()) continue;  // another shard's (a state written before shards dealt whole layouts)
    if (it->second != r.id) ++resumed.renumbered;
    else if (r.outcome == SweepResult::Outcome::infra_error) ++resumed.no_verdict;
    else resumed.done.emplace(r.index, r);
  }
  return resumed;
}

RematchedFailures rematch_new_failures(ResumedSweep& resumed, const std::string& state_file, const SavedFailureJudge& judge,
                                       const KnownFindingOf& known) {
  RematchedFailures counts;
  for (auto& [index, r] : resumed.done) {
    if (r.outcome != SweepResult::Outcome::fail || !r.known.empty()) continue;
    std::string file = r.case_file;
    if (!file.empty() && !fs::exists(file)) file = (fs::path(state_file).parent_path() / fs::path(file).filename()).string();
    std::optional<std::pair<casefile::Case, oracle::Verdict>> judged;
    if (!file.empty() && fs::exists(file)) judged = judge(file);
    if (!judged || judged->second.kind != oracle::Verdict::Kind::fail) {
      ++counts.not_judged;
      continue;
    }
    r.known = known(judged->first, judged->second);
    ++(r.known.empty() ? counts.still_new : counts.now_known);
  }
  return counts;
}

SweepCounts count_sweep(const std::vector<SweepResult>& results) {
  SweepCounts c;
  for (const SweepResult& r : results) {
    c.model_checked += r.model_checked ? 1 : 0;
    c.model_disagrees += r.model_disagrees.empty() ? 0 : 1;
    switch (r.outcome) {
      case SweepResult::Outcome::pass: ++c.pass; break;
      case SweepResult::Outcome::fail:
        if (r.known.empty()) {
          ++c.fail_new;
        } else {
          ++c.fail_known;
          ++c.known_by_name[r.known];
        }
        break;
      case SweepResult::Outcome::refused:
        ++c.refused;
        if (r.by_framework) ++c.refused_by_framework, ++c.framework_refused_by_reason[r.detail];
        else ++c.refused_by_reason[r.detail];
        break;
      case SweepResult::Outcome::infra_error: ++c.infra; break;
    }
  }
  return c;
}

Standing sweep_standing(const SweepCounts& counts) {
  if (counts.infra > 0 || nothing_checked(counts.refused_by_framework, counts.sent())) return Standing::no_true_count;
  return counts.fail_new > 0 ? Standing::new_failures : Standing::clean;
}

void SweepObservers::case_done(const SweepCase& sc, const SweepResult& result, const SweepProgress& progress) {
  for (SweepObserver* o : all_) o->case_done(sc, result, progress);
}
void SweepObservers::failure_saved(const SweepCase& sc, const casefile::Case& saved, const oracle::Verdict& verdict,
                                   const std::string& case_file) {
  for (SweepObserver* o : all_) o->failure_saved(sc, saved, verdict, case_file);
}
void SweepObservers::machinery_stops(const std::string& why, std::size_t lane, std::size_t lanes) {
  for (SweepObserver* o : all_) o->machinery_stops(why, lane, lanes);
}
void SweepObservers::finished(const SweepEnd& end) {
  for (SweepObserver* o : all_) o->finished(end);
}

namespace {

// One sweep, one release: a lane whose worker is of another (an environment that differs between
// starts) would put that release's verdicts in this one's report.
std::exception_ptr lanes_of_other_releases(std::span<run::Target* const> lanes, int world) {
  const run::TargetAbilities& first = lanes[0]->open(world);
  for (std::size_t lane = 1; lane < lanes.size(); ++lane)
    if (const run::TargetAbilities& other = lanes[lane]->open(world); other.name != first.name || other.version != first.version)
      return std::make_exception_ptr(std::runtime_error("lane " + std::to_string(lane) + "'s worker is " + other.name + " " +
                                                        other.version + " where lane 0's is " + first.name + " " +
                                                        first.version + ": the lanes of one sweep run one release"));
  return nullptr;
}

}  // namespace

SweepEnd drive_sweep(const SweepDrive& drive, std::span<run::Target* const> lanes, SweepObserver& observer,
                     const std::function<bool()>& interrupted) {
  std::map<std::int64_t, SweepResult> done = drive.resumed.done;
  SweepEnd end;
  end.report = drive.head;
  const auto save_state = [&] {
    end.report.results.clear();
    for (const auto& [index, r] : done) end.report.results.push_back(r);
    const fs::path folder = fs::path(drive.state_file).parent_path();
    fs::create_directories(folder.empty() ? fs::path(".") : folder);
    io::write_file_atomically(drive.state_file, sweep_report_json(end.report).dump(1) + "\n", "sweep state");
  };

  std::vector<const SweepCase*> to_do;
  for (const SweepCase& sc : drive.plan.cases)
    if (!done.contains(sc.index)) to_do.push_back(&sc);
  SweepProgress progress;
  progress.to_run = static_cast<std::int64_t>(to_do.size());
  progress.planned = static_cast<std::int64_t>(drive.plan.cases.size());

  // The lanes' workers come up side by side before the clock starts: the rate is of cases.
  std::exception_ptr not_opened = open_sweep_lanes(lanes, drive.head.world);
  if (!not_opened) not_opened = lanes_of_other_releases(lanes, drive.head.world);
  if (not_opened) {
    save_state();
    end.error = not_opened;
    end.not_run = progress.to_run;
    observer.finished(end);
    return end;
  }

  SweepRunOptions run = drive.run;
  run.on_failure = [&observer](const SweepCase& sc, const casefile::Case& saved, const oracle::Verdict& verdict,
                               const std::string& case_file) { observer.failure_saved(sc, saved, verdict, case_file); };
  const auto start = std::chrono::steady_clock::now();
  auto last_save = start - std::chrono::hours(1);
  // Of each case a lane ran, whether it was an infrastructure error: per lane, so that one lane
  // whose worker keeps failing stops the sweep however the others fare.
  std::vector<std::vector<bool>> machinery(lanes.size());
  bool stopping = false;  // the cases still in flight are recorded, quietly
  const auto on_result = [&](std::size_t lane, const SweepCase& sc, const SweepResult& r) {
    done.emplace(sc.index, r);
    ++progress.ran;
    progress.done = static_cast<std::int64_t>(done.size());
    const auto now = std::chrono::steady_clock::now();
    progress.seconds = std::chrono::duration<double>(now - start).count();
    if (r.outcome != SweepResult::Outcome::refused) machinery[lane].push_back(r.outcome == SweepResult::Outcome::infra_error);
    if (std::chrono::duration<double>(now - last_save).count() >= drive.save_every_seconds) {
      last_save = now;
      save_state();
    }
    if (!stopping) observer.case_done(sc, r, progress);
    if (stopping) return false;
    if (const std::optional<std::string> why = machinery_failing(machinery[lane])) {
      stopping = true;
      observer.machinery_stops(*why, lane, lanes.size());
      return false;
    }
    return true;
  };
  const LanesEnd lanes_end = run_sweep_lanes(lanes, drive.head.world, to_do, run, on_result, interrupted);
  save_state();  // what the lanes finished is kept whatever stopped them
  end.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  end.stopped = lanes_end.stopped;
  end.error = lanes_end.error;
  end.error_at = lanes_end.error_at;
  end.not_run = progress.planned - static_cast<std::int64_t>(done.size());
  observer.finished(end);
  return end;
}

int remove_killed_sweeps_leftovers(const std::string& corpus, const std::string& state_file) {
  const fs::path folder = fs::path(state_file).parent_path().empty() ? fs::path(".") : fs::path(state_file).parent_path();
  int removed = io::remove_orphaned_temporaries(corpus);
  if (folder != fs::path(corpus)) removed += io::remove_orphaned_temporaries(folder.string());
  return removed;
}

}  // namespace tally::fuzz
