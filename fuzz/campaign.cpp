#include "fuzz/campaign.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <system_error>

#include "io/atomic_file.h"
#include "casefile/case_file.h"
#include "run/target.h"
#include "run/drive_case.h"
#include "run/case_job.h"
#include "fuzz/known.h"
#include "fuzz/run_ahead.h"

namespace tally::fuzz {

namespace {

using Clock = std::chrono::steady_clock;

std::string corpus_file(const std::string& dir, std::uint64_t seed, std::int64_t index,
                        const char* suffix) {
  return (std::filesystem::path(dir) / (std::to_string(seed) + "-" + std::to_string(index) + suffix))
      .string();
}

void ensure_dir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw std::runtime_error("cannot create corpus directory " + dir + ": " + error.message());
}

std::string fault_names(const casefile::Case& c) { return vocab::fault_list(c.path.faults); }

// Why a framework declined a case, as its refusals are counted: who, and the framework's message
// without the rank that said it first (every rank says the same).
std::string refusal_reason(const oracle::Verdict& v) {
  std::string why = v.infra_message;
  if (why.starts_with("rank ")) {
    const std::size_t colon = why.find(": ");
    if (colon != std::string::npos && why.find_first_not_of("0123456789", 5) == colon) why.erase(0, colon + 2);
  }
  return v.infra_call + ": " + why;
}

}  // namespace

std::string_view stop_name(CampaignResult::Stop stop) {
  switch (stop) {
    case CampaignResult::Stop::cases: return "cases";
    case CampaignResult::Stop::time: return "time";
    case CampaignResult::Stop::interrupted: return "interrupted";
    case CampaignResult::Stop::max_failures: return "max-failures";
    case CampaignResult::Stop::infra_error: return "infra-error";
  }
  return "?";
}

namespace {

// The generator `options` pointed at what `opened` (the target `target` opened) runs: its world,
// and for a real framework its release's limits, the faults it plants and Megatron's layout
// corners (finding miscounts there is what a real campaign is for); GPT models only. Its
// restriction holds `target`: the options live no longer than the campaign.
CaseGenOptions aimed_at(CaseGenOptions options, run::Target& target, const run::TargetAbilities& opened) {
  if (opened.world > 0) options.topology.exact_world = opened.world;
  // tally's model too: where its gradients enter (run/model_target.cpp).
  options.restrict_to = [&target](casefile::Case c) { return target.within(std::move(c)); };
  if (!opened.framework) return options;
  if (opened.world > 0) options.topology.max_world = opened.world;
  options.topology.avoid_megatron_corners = false;
  options.gpt_only = true;
  return options;
}

// Runs `c` on `target` in the order of run/drive_case.h. A case tally's rules refuse is an
// infra-error: the generator's restriction (aimed_at) should have kept it out, so it is a bug of
// tally. A case the framework itself declines as it sets it up is refused (a verdict of that kind).
oracle::Verdict run_on(run::Target& target, const casefile::Case& c) {
  if (std::optional<run::CaseRefusal> refusal = run::refusal_of(target, c)) {
    oracle::Verdict refused;
    refused.kind = oracle::Verdict::Kind::infra_error;
    refused.infra_call = std::string(target.name()) + " target";
    refused.infra_message = refusal->why;
    return refused;
  }
  return run::run_on_target(target, c, /*keep_record=*/false).run.verdict;
}

CampaignResult run_campaign_with(const CampaignOptions& options, run::Target& target, const CaseRunner& run_one,
                                 CampaignObserver& observer, const std::atomic<bool>* stop) {
  const Clock::time_point start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const run::TargetAbilities& opened = target.open(options.world);
  const CaseGenOptions generator = aimed_at(options.generator, target, opened);
  CampaignResult result;
  result.seed = options.seed;
  // The first infrastructure error of a real framework, of a case or of a shrink candidate, ends
  // the campaign; on tally's model it is what the case's path does.
  const bool infra_errors_stop = opened.framework;
  std::optional<std::pair<casefile::Case, oracle::Verdict>> broken;
  const CaseRunner run = [&](const casefile::Case& c) {
    oracle::Verdict verdict = run_one(c);
    if (infra_errors_stop && verdict.kind == oracle::Verdict::Kind::infra_error && !broken)
      broken.emplace(c, verdict);
    return verdict;
  };
  // The target section of each case file about to be written to `path` (its run's manifests saved
  // next to it).
  auto save_target_section = [&](casefile::Case& c, const std::string& path) {
    if (std::optional<casefile::RealTarget> section = run::saved_section(target, c, path)) c.target = *section;
  };
  auto stopping = [&] { return (stop && stop->load()) || broken.has_value(); };
  // Saves the broken case (never shrunk) and its message next to it; `index` is the case's number,
  // or, while shrinking, the failure's.
  auto stop_at_infra_error = [&](std::int64_t index, bool while_shrinking) {
    InfraStop s;
    s.index = index;
    s.while_shrinking = while_shrinking;
    s.c = broken->first;
    s.verdict = broken->second;
    s.c.description = casefile::fit_description(
        "tally fuzz --seed " + std::to_string(options.seed) + ": " +
        (while_shrinking ? "a shrink candidate of case " : "case ") + std::to_string(index) +
        ", faults " + fault_names(s.c) + ": an infrastructure error (" + s.verdict.infra_call + ")");
    s.c.expect = run::observed_expectation(s.verdict);
    if (!options.corpus_dir.empty()) {
      ensure_dir(options.corpus_dir);
      const char* suffix = while_shrinking ? ".shrinking.infra-error" : ".infra-error";
      s.path = corpus_file(options.corpus_dir, options.seed, index, (std::string(suffix) + ".json").c_str());
      s.message_path = corpus_file(options.corpus_dir, options.seed, index, (std::string(suffix) + ".txt").c_str());
    }
    save_target_section(s.c, s.path);
    if (!s.path.empty()) {
      casefile::write_case_file(s.path, s.c, run::case_frameworks());
      io::write_file_atomically(s.message_path, s.verdict.infra_call + ": " + s.verdict.infra_message + "\n",
                                      "infrastructure error's message");
    }
    result.stopped_by = CampaignResult::Stop::infra_error;
    result.infra_error = std::move(s);
    observer.infra_error(*result.infra_error);
  };
  // RapidCheck keeps a generator's state in statics: one thread generates (or shrinks) at a time.
  std::mutex generation;
  auto generate_checked = [&](std::int64_t index) {
    casefile::Case c;
    {
      std::lock_guard lock(generation);
      c = generate_case(generator, options.seed, index).value();
    }
    if (std::optional<std::string> error = casefile::check_case(c))
      throw std::logic_error("the generator made an invalid case (seed " + std::to_string(options.seed) +
                             ", case " + std::to_string(index) + "): " + *error);
    return c;
  };
  // (A target that runs cases side by side gives no infrastructure error that stops a campaign:
  // `broken` is the loop's alone.)
  if (options.jobs > 1 && (!target.runs_cases_side_by_side() || infra_errors_stop))
    throw std::invalid_argument("a campaign of " + std::to_string(options.jobs) + " jobs needs a target that runs cases "
                                "side by side; the " + std::string(target.name()) + " target runs one at a time");
  // 64 cases a thread ahead: one case of a large world takes the time of hundreds of small ones,
  // and a full window stops the loop until it ends (with 8, two threads kept 1.8 cores busy; 1.9).
  std::optional<RunAhead> ahead;
  if (options.jobs > 1)
    ahead.emplace(options.jobs, options.max_cases > 0 ? options.max_cases : std::numeric_limits<std::int64_t>::max(),
                  static_cast<int>(64 * options.jobs), [&](std::int64_t index) {
                    RanCase ran;
                    ran.c = generate_checked(index);
                    ran.verdict = run(ran.c);
                    return ran;
                  });
  for (std::int64_t index = 0;; ++index) {
    if (options.max_cases > 0 && result.cases >= options.max_cases) {
      result.stopped_by = CampaignResult::Stop::cases;
      break;
    }
    if (options.max_seconds > 0 && elapsed() >= options.max_seconds) {
      result.stopped_by = CampaignResult::Stop::time;
      break;
    }
    if (stopping()) {
      result.stopped_by = CampaignResult::Stop::interrupted;
      break;
    }
    const auto counted = std::count_if(result.failures.begin(), result.failures.end(),
                                       [](const Failure& f) { return !f.same_as && f.known.empty(); });
    if (options.max_failures > 0 && counted >= options.max_failures) {
      result.stopped_by = CampaignResult::Stop::max_failures;
      break;
    }

    casefile::Case c;
    oracle::Verdict verdict;
    if (ahead) {
      RanCase ran = ahead->take(index);
      c = std::move(ran.c);
      verdict = std::move(ran.verdict);
    } else {
      c = generate_checked(index);
      verdict = run(c);
    }
    ++result.cases;
    if (target.framework()) ++result.cases_by_norm_code[known_path(c)];
    if (run::gradients_enter_before_reduction(target.name(), c)) ++result.cases_before_reduction;
    if (broken) {
      stop_at_infra_error(index, /*while_shrinking=*/false);
      break;
    }
    if (verdict.kind == oracle::Verdict::Kind::refused) ++result.refused_by_reason[refusal_reason(verdict)];
    if (verdict.kind == oracle::Verdict::Kind::pass || verdict.kind == oracle::Verdict::Kind::refused) {
      observer.case_done(result.cases, static_cast<int>(result.failures.size()), elapsed());
      continue;
    }

    // A failure: on disk first, then shrunk.
    Failure failure;
    failure.index = index;
    failure.signature = failure_signature(verdict);
    failure.original = std::move(c);
    failure.original.description = casefile::fit_description("tally fuzz --seed " + std::to_string(options.seed) +
                                   ": case " + std::to_string(index) + " (RapidCheck seed " +
                                   std::to_string(case_seed(options.seed, index)) + ", size " +
                                   std::to_string(case_size_param(index)) + "), faults " +
                                   fault_names(failure.original));
    failure.original.expect = run::observed_expectation(verdict);
    failure.original_verdict = verdict;
    if (!options.corpus_dir.empty()) {
      ensure_dir(options.corpus_dir);
      failure.original_path = corpus_file(options.corpus_dir, options.seed, index, ".json");
    }
    save_target_section(failure.original, failure.original_path);
    if (!failure.original_path.empty()) casefile::write_case_file(failure.original_path, failure.original, run::case_frameworks());
    if (!options.shrink_repeated_signatures) {
      const auto earlier = std::find_if(result.failures.begin(), result.failures.end(),
                                        [&](const Failure& f) {
                                          return f.signature == failure.signature &&
                                                 f.original.path.faults == failure.original.path.faults;
                                        });
      if (earlier != result.failures.end()) failure.same_as = earlier->index;
    }
    if (options.known && verdict.kind == oracle::Verdict::Kind::fail) failure.known = options.known(failure.original, verdict);
    observer.failure_found(failure);
    if (failure.same_as || !failure.known.empty()) {
      result.failures.push_back(failure);
      observer.failure_not_shrunk(result.failures.back());
      observer.case_done(result.cases, static_cast<int>(result.failures.size()), elapsed());
      continue;
    }

    // Shrinking walks the case's RapidCheck shrinks, generated as it goes: no thread generates
    // meanwhile, and the shrinks are gone before one does.
    ShrinkOutcome shrunk;
    {
      std::lock_guard shrinking(generation);
      const rc::Shrinkable<casefile::Case> generated = generate_case(generator, options.seed, index);
      shrunk = shrink_failure(generated, verdict, run, options.shrink, stopping,
                              [&](const ShrinkOutcome& step) { observer.shrink_step(failure, step); });
    }
    failure.shrunk_done = true;
    failure.shrunk = shrunk.shrunk;
    failure.shrunk_verdict = shrunk.verdict;
    failure.shrink = shrunk.progress;
    failure.shrink_complete = shrunk.complete;
    failure.shrunk.description = casefile::fit_description(
        "shrunk from " +
        (failure.original_path.empty() ? "case " + std::to_string(index) : failure.original_path) +
        " (tally fuzz --seed " + std::to_string(options.seed) + ") in " +
        std::to_string(shrunk.progress.steps) + " steps" +
        (shrunk.complete ? "" : ", stopped early") + ": faults " + fault_names(failure.shrunk) +
        ", " + describe(failure_signature(shrunk.verdict)));
    failure.shrunk.expect = run::observed_expectation(shrunk.verdict);
    if (!options.corpus_dir.empty())
      failure.shrunk_path = corpus_file(options.corpus_dir, options.seed, index, ".shrunk.json");
    save_target_section(failure.shrunk, failure.shrunk_path);
    if (!failure.shrunk_path.empty()) casefile::write_case_file(failure.shrunk_path, failure.shrunk, run::case_frameworks());
    result.failures.push_back(failure);
    observer.failure_shrunk(result.failures.back());
    observer.case_done(result.cases, static_cast<int>(result.failures.size()), elapsed());
    if (broken) {
      stop_at_infra_error(index, /*while_shrinking=*/true);
      break;
    }
  }
  result.seconds = elapsed();
  return result;
}

}  // namespace

CampaignResult run_campaign(const CampaignOptions& options, run::Target& target, CampaignObserver& observer,
                            const std::atomic<bool>* stop) {
  return run_campaign_with(
      options, target, [&target](const casefile::Case& c) { return run_on(target, c); }, observer, stop);
}

std::vector<MutantResult> run_mutants(const MutantOptions& options, run::Target& target,
                                      const std::function<void(const MutantResult&)>& on_result,
                                      const std::atomic<bool>* stop) {
  std::vector<vocab::Fault> faults = options.faults;
  if (faults.empty())
    for (const vocab::FaultInfo& info : vocab::fault_catalog()) faults.push_back(info.fault);
  const run::TargetAbilities& opened = target.open(options.world);
  const CaseRunner run = [&target](const casefile::Case& c) { return run_on(target, c); };
  // A real framework may miscount on its own: the failure is the fault's only if the case passes
  // without it.
  const CaseRunner attributed = [&run](const casefile::Case& c) {
    const oracle::Verdict verdict = run(c);
    if (verdict.kind == oracle::Verdict::Kind::pass || verdict.kind == oracle::Verdict::Kind::refused ||
        c.path.faults.empty())
      return verdict;
    casefile::Case without = c;
    without.path.faults = {};
    const oracle::Verdict unplanted = run(without);
    if (unplanted.kind == oracle::Verdict::Kind::infra_error || unplanted.kind == oracle::Verdict::Kind::refused)
      return unplanted;  // no verdict either way
    return unplanted.kind == oracle::Verdict::Kind::pass ? verdict : oracle::Verdict{};
  };
  const CaseRunner& runner = opened.framework ? attributed : run;
  std::vector<MutantResult> results;
  for (vocab::Fault fault : faults) {
    if (stop && stop->load()) break;
    MutantResult r;
    r.fault = fault;
    if (std::optional<std::string> why = run::why_not_planted(std::string(vocab::fault_info(fault).name), opened.plants)) {
      r.not_applicable = (opened.framework ? "the target plants no counterpart: " : "") + *why;
    } else {
      CampaignOptions campaign;
      campaign.seed = options.seed;
      campaign.max_cases = options.budget;
      campaign.generator = options.generator;
      campaign.generator.faults = {fault};
      campaign.world = options.world;
      campaign.corpus_dir = options.corpus_dir;
      campaign.shrink = options.shrink;
      campaign.max_failures = 1;
      CampaignObserver quiet;
      const CampaignResult found = run_campaign_with(campaign, target, runner, quiet, stop);
      r.cases = found.cases;
      r.seconds = found.seconds;
      if (!found.failures.empty()) {
        r.found = true;
        r.failure = found.failures.front();
      }
      r.infra_error = found.infra_error;
    }
    if (on_result) on_result(r);
    results.push_back(std::move(r));
    if (results.back().infra_error) break;  // the target is broken: no further score is true
  }
  return results;
}

std::optional<std::string> nothing_checked(std::int64_t refused, std::int64_t sent) {
  if (refused == 0 || 2 * refused <= sent) return std::nullopt;
  return "nothing was checked: the framework refused " + std::to_string(refused) + " of the " + std::to_string(sent) +
         " cases tally sent it (exit 3); each refusal wants a rule citing the framework's check "
         "(run/<framework>/rules.cpp), or the worker fixed";
}

std::int64_t refused_by_framework(const CampaignResult& result) {
  std::int64_t refused = 0;
  for (const auto& [why, n] : result.refused_by_reason) refused += n;
  return refused;
}

std::int64_t new_failures(const CampaignResult& result) {
  return std::count_if(result.failures.begin(), result.failures.end(), [](const Failure& f) { return f.known.empty(); });
}

Standing campaign_standing(const CampaignResult& result) {
  // Every case of a campaign was sent to the framework (its generator is aimed at the target).
  if (result.infra_error || nothing_checked(refused_by_framework(result), result.cases)) return Standing::no_true_count;
  return new_failures(result) > 0 ? Standing::new_failures : Standing::clean;
}

std::vector<vocab::Fault> faults_to_plant(std::vector<vocab::Fault> asked, bool all, const run::FaultPlants& plants) {
  if (all) {
    std::erase_if(asked, [&](vocab::Fault f) { return run::why_not_planted(std::string(vocab::fault_info(f).name), plants).has_value(); });
    if (asked.empty()) throw std::invalid_argument("plants none of the catalog's faults");
    return asked;
  }
  vocab::FaultSet asked_set;
  for (vocab::Fault f : asked) asked_set = asked_set.with(f);
  if (std::string why = run::unplantable(asked_set, plants); !why.empty()) throw std::invalid_argument("plants no counterpart of " + why);
  return asked;
}

}  // namespace tally::fuzz
