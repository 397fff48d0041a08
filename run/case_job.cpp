#include "run/case_job.h"

#include <chrono>
#include <filesystem>
#include <system_error>

#include "casefile/case_file.h"
#include "run/target.h"
#include "io/atomic_file.h"
#include "manifest/manifest_json.h"
#include "run/drive_case.h"
#include "run/evidence.h"
#include "run/model_manifests.h"
#include "run/run_case.h"
#include "run/target_run.h"

namespace tally::run {

namespace {

namespace fs = std::filesystem;

void save_case(const std::string& file, const casefile::Case& c) {
  try {
    casefile::write_case_file(file, c, case_frameworks());
  } catch (const std::exception& error) {
    throw JobOutputError(error.what());
  }
}

// Why `c`, a case of framework `owner`, is not for `target`; the name of the case is `name`.
std::string not_for_target(const Target& target, const FrameworkTarget& owner, const casefile::Case& c,
                           const std::string& name) {
  const std::string framework(owner.name);
  if (target.framework())
    return name + " is a " + framework + " case; --target " + std::string(target.name()) +
           " cannot re-execute it (use --target " + framework + ")";
  if (c.target)
    return name + " is a " + framework + " " + c.target->version + " case: run it with --target " + framework +
           " where the framework is installed, or judge its saved manifests with `tally replay " + name + "`";
  if (!casefile::section_settings(c, owner.section))
    if (std::optional<std::string> line = owner.own_section(c))  // a setting only it runs, not a section
      return name + " holds " + *line;
  return name + " has a " + framework + " section, which only --target " + framework + " reads: run it with --target " +
         framework + ", or remove the section to run tally's model of Megatron's path";
}

// A framework's case judged from the manifests its case file saved, without the framework.
// Returns why it cannot be, or nullopt after setting the verdict.
std::optional<std::string> judge_saved_run(const CaseJob& job, const FrameworkTarget& owner, CaseJobResult& out) {
  const std::string framework(owner.name);
  const casefile::Case& c = job.c;
  if (!c.target)
    return "its " + framework + " section is read only by --target " + framework + ": replay it with --target " +
           framework + " where the framework is installed";
  if (c.target->manifests.empty())
    return "a " + framework + " " + c.target->version + " case without saved manifests: replay it with --target " +
           framework + " where the framework is installed";
  const std::string dir = (fs::path(job.source).parent_path() / c.target->manifests).string();
  out.how = "judged from its saved manifests, " + framework + " " + c.target->version;
  out.verdict = judge_saved_run_of(c, dir, oracle::kFrameworkRtol);
  return std::nullopt;
}

// The run's manifests in `dir`: the model target's written from its record, a real target's
// copied from its folder. Whether there were any (a run that hung leaves none).
bool write_manifests(const CaseJob& job, const casefile::Case& c, const TargetRun& run) {
  try {
    if (run.record) {
      manifest::write_run(job.manifests, model_manifests(c, *run.record), job.manifest_version);
      return true;
    }
    if (run.manifests.empty()) return false;
    // What the worker left is copied as evidence is (run/evidence.h): a FIFO or a link among its
    // files is the worker's infrastructure error, listed in the copy, never the user's.
    copy_evidence_into(run.manifests, job.manifests);
    return true;
  } catch (const std::exception& error) {
    throw JobOutputError(std::string("--manifests: ") + error.what());
  }
}

}  // namespace

casefile::Expectation observed_expectation(const oracle::Verdict& verdict, std::size_t max_params) {
  casefile::Expectation e;
  e.outcome = verdict.kind == oracle::Verdict::Kind::pass   ? casefile::Expectation::Outcome::pass
              : verdict.kind == oracle::Verdict::Kind::fail ? casefile::Expectation::Outcome::fail
                                                            : casefile::Expectation::Outcome::infra_error;
  if (e.outcome != casefile::Expectation::Outcome::fail) return e;
  e.statistics = failed_statistics(verdict);
  for (const oracle::Miscount& m : verdict.miscounted)
    if (max_params == 0 || e.miscounted.size() < max_params) e.miscounted.push_back(m.name);
  return e;
}

CaseJobResult run_case_job(Target& target, CaseJob job) {
  const auto start = std::chrono::steady_clock::now();
  CaseJobResult out;
  casefile::Case& c = job.c;
  const std::string name = job.source.empty() ? "this case" : job.source;
  auto finish = [&]() -> CaseJobResult {
    out.c = std::move(c);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::move(out);
  };

  // 1. The case's framework against the target's.
  if (const FrameworkTarget* owner = framework_of(c); owner && owner->name != target.name()) {
    if (!job.judge_saved_runs || target.framework()) {
      out.refused = not_for_target(target, *owner, c, name);
      return finish();
    }
    if (std::optional<std::string> error = casefile::check_case(c)) throw casefile::InvalidCase(*error);
    out.refused = judge_saved_run(job, *owner, out);
    if (!out.refused && c.expect) out.unmet = unmet_expectation(*c.expect, out.verdict);
    return finish();
  }

  // 2, 3. Its own rules, then what the target runs: the rules of every release before it opens,
  // its release's once it is open (run/drive_case.h).
  if (std::optional<std::string> error = casefile::check_case(c)) throw casefile::InvalidCase(*error);
  if (std::optional<CaseRefusal> refusal = refusal_of(target, c)) {
    out.refused = refusal->text();
    return finish();
  }
  if (job.more_cases_follow && target.hang_ends_the_job() && c.expect &&
      c.expect->outcome == casefile::Expectation::Outcome::infra_error) {
    out.refused = "it expects a hang, which ends this job instead of giving a verdict (and the cases after it)";
    return finish();
  }
  if (!job.manifests.empty())
    if (std::optional<std::string> why = target.manifests_refusal()) throw JobOutputError("--manifests " + *why);
  if (job.expect == CaseJob::Expect::pass) c.expect = casefile::Expectation{};
  if (job.expect == CaseJob::Expect::fail)
    c.expect = casefile::Expectation{casefile::Expectation::Outcome::fail, {}, {}};

  // 4, 5. On disk before the run (a crash loses nothing), then the run, in which the framework's
  // own check may decline the case as it sets it up: refused, the case saved as asked but without
  // evidence.
  DrivenRun driven = run_on_target(target, std::move(c), /*keep_record=*/!job.manifests.empty(), [&](const casefile::Case& ready) {
    if (!job.save.empty()) save_case(job.save, ready);
  });
  c = std::move(driven.c);
  TargetRun& run = driven.run;
  if (driven.refused) {
    out.refused = driven.refused->text();
    out.refused_by_framework = true;
    return finish();
  }
  out.verdict = std::move(run.verdict);
  out.how = run.how;
  if (!job.manifests.empty()) out.manifests_written = write_manifests(job, c, run);

  // 6. Saved again with its evidence: a real target's manifests next to the case file, so replay
  // judges it where the framework is not installed (a failure's, and a pass's saved as an
  // expectation); and the expectation the run showed.
  if (!job.save.empty()) {
    bool changed = false;
    if (out.verdict.kind != oracle::Verdict::Kind::pass || job.expect != CaseJob::Expect::as_given) {
      try {
        if (std::optional<casefile::RealTarget> section = saved_section(target, c, job.save)) {
          changed = changed || *section != c.target;
          c.target = *section;
        }
      } catch (const TargetUnavailable&) {
        throw;
      } catch (const std::exception& error) {
        throw JobOutputError(error.what());
      }
    }
    if (job.expect == CaseJob::Expect::observed) {
      constexpr std::size_t kMaxObservedParams = 32;
      c.expect = observed_expectation(out.verdict, kMaxObservedParams);
      changed = true;
    }
    if (changed) save_case(job.save, c);
    // An infrastructure error's message beside the case, as a campaign and a sweep keep theirs.
    if (out.verdict.kind == oracle::Verdict::Kind::infra_error) {
      const fs::path message = fs::path(job.save).replace_extension(".infra-error.txt");
      try {
        io::write_file_atomically(message.string(), out.verdict.infra_call + ": " + out.verdict.infra_message + "\n",
                                  "infrastructure error's message");
      } catch (const std::exception& error) {
        throw JobOutputError(error.what());
      }
    }
  }

  // 7. The expectation.
  if (c.expect) out.unmet = unmet_expectation(*c.expect, out.verdict);
  return finish();
}

}  // namespace tally::run
