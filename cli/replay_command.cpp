// tally replay: rerun case files (and the case files under folders) and check each one's
// expectation. The CI gate over the regression corpus (seeds/).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "cli/backend_flags.h"
#include "cli/commands.h"
#include "cli/html_report.h"
#include "cli/path_flags.h"
#include "cli/target_flags.h"
#include "cli/usage_error.h"
#include "cli/verdict_report.h"
#include "casefile/case_file.h"
#include "run/case_job.h"
#include "run/target.h"
#include "fuzz/junit.h"
#include "fuzz/known.h"

namespace tally::cli {

namespace {

namespace fs = std::filesystem;

struct ReplayOptions {
  std::vector<std::string> paths;
  std::string junit;
  bool json = false;
  std::string html;  // a folder for one HTML page per case that did not pass
  std::string known;  // triage each failing case against the known findings in this folder
  TargetOptions target;
};

// The known findings of each framework and release a replay meets, loaded once each (fuzz/known.h).
class KnownByRelease {
 public:
  explicit KnownByRelease(std::string folder) : folder_(std::move(folder)) {}
  // The finding a failing `c` (a case of a framework, or of tally's model) repeats; "NEW: why" when
  // it is new.
  std::string triage(const casefile::Case& c, const oracle::Verdict& verdict) {
    if (!c.target) {
      const std::string corner = fuzz::known_finding_of({}, false, c, verdict);
      return corner.empty() ? "NEW" : corner;
    }
    const std::pair<std::string, std::string> release{c.target->framework, c.target->version};
    auto it = loaded_.find(release);
    if (it == loaded_.end()) {
      try {
        it = loaded_.emplace(release, fuzz::load_known(folder_, release.first, release.second)).first;
      } catch (const std::exception& error) {
        throw UsageError(error.what());
      }
    }
    const fuzz::Explanation explained = fuzz::explain(it->second, c, verdict);
    if (explained.findings.empty()) return "NEW: " + explained.why_new;
    std::string names;
    for (const std::string& name : explained.findings) names += (names.empty() ? "" : " + ") + name;
    return names;
  }

 private:
  std::string folder_;
  std::map<std::pair<std::string, std::string>, std::vector<fuzz::KnownFinding>> loaded_;
};

// One input: a case file to run, or a path that could not be expanded.
struct Input {
  std::string file;
  std::string error;  // non-empty: the path is bad (missing, unreadable, an empty folder)
};

// Case files under `folder`, recursively: regular files named *.json but a sweep's state
// (sweep-state*.json) and finding files (*.finding.json, fuzz/findings.h), sorted by path.
std::vector<Input> expand_folder(const std::string& folder) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(folder, fs::directory_options::none, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_error;
    // A real target's case file keeps its run's manifests in NAME.manifests/: not case files.
    if (it->is_directory(type_error) && it->path().extension() == ".manifests") {
      it.disable_recursion_pending();
      continue;
    }
    // A sweep's state, kept in its corpus beside its failing cases, is not a case.
    if (it->is_regular_file(type_error) && it->path().extension() == ".json" &&
        !it->path().filename().string().starts_with("sweep-state") &&
        !it->path().filename().string().ends_with(".finding.json"))
      files.push_back(it->path().generic_string());
  }
  if (ec) return {{folder, folder + ": cannot list the folder: " + ec.message()}};
  if (files.empty()) return {{folder, folder + ": no case files (*.json) in this folder"}};
  std::sort(files.begin(), files.end());
  std::vector<Input> inputs;
  for (std::string& file : files) inputs.push_back({std::move(file), ""});
  return inputs;
}

std::vector<Input> expand(const std::vector<std::string>& paths) {
  std::vector<Input> inputs;
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (ec || !fs::exists(status)) {
      inputs.push_back({path, path + ": no such file or folder"});
    } else if (fs::is_directory(status)) {
      for (Input& input : expand_folder(path)) inputs.push_back(std::move(input));
    } else {
      inputs.push_back({path, ""});
    }
  }
  return inputs;
}

// not_runnable: the case's world does not fit this job (an mpi or nccl job of another size).
// unavailable: the target's machinery failed (a worker that cannot be restarted): no verdict, and
// the replay stops there (exit 3).
enum class Result { ok, mismatch, error, not_runnable, unavailable };

struct Outcome {
  std::string file;
  Result result = Result::ok;
  std::string verdict;   // pass, fail, infra-error; empty when the case did not run
  std::string expected;  // the expected outcome
  std::string message;   // mismatch: why; error: the one-line error
  std::string how;       // how the verdict came about, when not by running tally's model
  std::string rerun_flags;  // what `tally run FILE` needs to re-execute it: " --target ..."
  double seconds = 0.0;
  std::string html;  // the page written for it, if any
  // --known: for a failing case, the known finding it repeats, or "new".
  std::string triage;
};

// The page of `file` in `folder`: its path with separators as '_', so two folders' a.json differ.
// The page name of each input: its path flattened, and where two flatten alike ("a/b.json",
// "a_b.json") a "-2", "-3" suffix on the later ones, so no report overwrites another.
std::vector<std::string> pages_of(const std::string& folder, const std::vector<Input>& inputs) {
  std::vector<std::string> pages;
  std::set<std::string> used;
  for (const Input& input : inputs) {
    std::string name = fs::path(input.file).lexically_normal().generic_string();
    for (char& ch : name)
      if (ch == '/' || ch == '\\' || ch == ':') ch = '_';
    while (!name.empty() && name.front() == '.') name.erase(name.begin());
    if (name.size() > 5 && name.ends_with(".json")) name.resize(name.size() - 5);
    std::string unique = name;
    for (int n = 2; !used.insert(unique).second; ++n) unique = name + "-" + std::to_string(n);
    pages.push_back((fs::path(folder) / (unique + ".html")).string());
  }
  return pages;
}

// Replays one input on `target` (a real target's case without --target: judged from the manifests
// its file saved). `html_page`: where a failing case's report goes; "" writes none.
Outcome replay_one(const Input& input, run::Target& target, const std::string& html_page, KnownByRelease* known) {
  Outcome o;
  o.file = input.file;
  if (!input.error.empty()) {
    o.result = Result::error;
    o.message = input.error;
    return o;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto timed = [&]() -> Outcome& {
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return o;
  };
  try {
    run::CaseJob job;
    job.c = casefile::load_case_file(input.file, run::case_frameworks());
    job.source = input.file;
    job.judge_saved_runs = true;
    job.more_cases_follow = true;
    // A case without an expectation must pass.
    if (!job.c.expect) job.c.expect = casefile::Expectation{};
    o.expected = casefile::outcome_name(job.c.expect->outcome);
    if (job.c.target) o.rerun_flags = " --target " + job.c.target->framework;
    const run::CaseJobResult r = run::run_case_job(target, std::move(job));
    if (r.refused && r.refused_by_framework) {
      // The case names its outcome on this framework; a refusal would hide a saved failure.
      o.result = Result::mismatch;
      o.message = "expected " + o.expected + ", but " + *r.refused + " (nothing was checked)";
      return timed();
    }
    if (r.refused) {
      o.result = Result::not_runnable;
      o.message = *r.refused;
      return timed();
    }
    o.how = r.how;
    o.verdict = oracle::kind_name(r.verdict.kind);
    if (known && r.verdict.kind == oracle::Verdict::Kind::fail) {
      o.triage = known->triage(r.c, r.verdict);
    }
    if (!html_page.empty() && r.verdict.kind != oracle::Verdict::Kind::pass) {
      o.html = html_page;
      write_case_html(o.html, "tally replay " + input.file, r.c, r.verdict,
                      {"tally run " + shell_quote(input.file), "tally replay " + shell_quote(input.file)});
    }
    if (r.unmet) {
      o.result = Result::mismatch;
      o.message = *r.unmet;
    }
  } catch (const run::NotRunnableHere& error) {
    o.result = Result::not_runnable;
    o.message = error.what();
  } catch (const run::TargetUnavailable& error) {
    o.result = Result::unavailable;
    o.message = error.what();
  } catch (const std::exception& error) {
    // CaseFileError (an invalid file), InvalidCase, or anything else the run threw.
    o.result = Result::error;
    o.message = error.what();
  }
  return timed();
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", seconds);
  return text;
}

void print_line(std::ostream& out, const Outcome& o) {
  switch (o.result) {
    case Result::ok:
      out << "ok        " << o.file << "  (" << o.verdict << " as expected, "
          << (o.how.empty() ? "" : o.how + ", ") << seconds_text(o.seconds) << ")";
      if (!o.triage.empty()) out << (o.triage.starts_with("NEW") ? "  " + o.triage : "  known " + o.triage);
      out << '\n';
      break;
    case Result::mismatch:
      out << "MISMATCH  " << o.file << "  " << o.message << "; replay: tally run "
          << shell_quote(o.file) << o.rerun_flags << '\n';
      break;
    case Result::error: out << "ERROR     " << o.message << '\n'; break;
    case Result::not_runnable:
      out << "SKIP      " << o.file << "  (not runnable on this job: " << o.message << ")\n";
      break;
    case Result::unavailable:
      out << "NO RUN    " << o.file << "  (the target is unavailable: " << o.message << ")\n";
      break;
  }
  out.flush();
}

}  // namespace

void add_replay_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<ReplayOptions>();
  CLI::App* command = app.add_subcommand(
      "replay",
      "Rerun case files, and every *.json case file under folders (recursively, in sorted "
      "order), and check each one's expectation (a case without one must pass). Exit 0 when "
      "every expectation is met, 1 when one is not, 2 when a path is missing or a file invalid.");
  command->add_option("paths", options->paths, "Case files and folders")->required();
  command->add_option("--junit", options->junit, "Also write a JUnit XML report to this file")
      ->check(output_file());
  command->add_flag("--json", options->json, "Machine-readable results");
  command->add_option("--html", options->html,
                      "Write one self-contained HTML page per case that does not pass (its "
                      "verdict, ledger matrix and rank grid) into this folder, named after the "
                      "case file");
  command->add_option("--known", options->known,
                      "Triage each failing case again against the known findings in this folder (case files "
                      "with their manifests, as seeds/real): each is known as a finding or NEW, judged from its "
                      "saved manifests without the framework (exit 1 when one is new)")
      ->check(CLI::ExistingDirectory);
  add_backend_flags(*command);
  add_target_flags(*command, options->target);
  command->callback([options, &context] {
    // --target: every case re-executed by the framework; without it a real target's case is
    // judged from the manifests its file saved.
    std::unique_ptr<run::Target> target = chosen_target(options->target, context.backend, context.err);
    if (!options->html.empty()) {
      std::error_code ec;
      fs::create_directories(options->html, ec);
      if (ec || !fs::is_directory(options->html))
        throw UsageError("--html " + options->html + ": cannot create the folder (" +
                         (ec ? ec.message() : "a file is in the way") + ")");
    }
    const std::vector<Input> inputs = expand(options->paths);
    std::vector<Outcome> outcomes;
    std::size_t passed = 0, errors = 0, skipped = 0;
    const Outcome* first_error = nullptr;
    const std::vector<std::string> pages =
        options->html.empty() ? std::vector<std::string>(inputs.size()) : pages_of(options->html, inputs);
    std::optional<KnownByRelease> known;
    if (!options->known.empty()) known.emplace(options->known);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const Input& input = inputs[i];
      outcomes.push_back(replay_one(input, *target, pages[i], known ? &*known : nullptr));
      const Outcome& o = outcomes.back();
      if (!options->json) print_line(context.out, o);
      passed += o.result == Result::ok;
      skipped += o.result == Result::not_runnable;
      errors += o.result == Result::error;
      // No verdict is true while the target is broken: the cases after it are not replayed.
      if (o.result == Result::unavailable) break;
    }
    const Outcome* unavailable =
        !outcomes.empty() && outcomes.back().result == Result::unavailable ? &outcomes.back() : nullptr;
    for (const Outcome& o : outcomes)
      if (o.result == Result::error) {
        first_error = &o;
        break;
      }
    const std::size_t failed = outcomes.size() - passed - skipped - (unavailable ? 1 : 0);
    const auto triaged = [&](bool is_new) {
      return static_cast<std::size_t>(std::count_if(outcomes.begin(), outcomes.end(), [&](const Outcome& o) {
        return !o.triage.empty() && o.triage.starts_with("NEW") == is_new;
      }));
    };
    const std::size_t new_failures = triaged(true), known_failures = triaged(false);
    if (options->json) {
      nlohmann::ordered_json cases = nlohmann::ordered_json::array();
      for (const Outcome& o : outcomes) {
        nlohmann::ordered_json j = {{"file", o.file},
                                    {"result", o.result == Result::ok         ? "ok"
                                               : o.result == Result::mismatch ? "mismatch"
                                               : o.result == Result::not_runnable ? "not-runnable"
                                               : o.result == Result::unavailable  ? "unavailable"
                                                                                  : "error"}};
        if (!o.verdict.empty()) j["verdict"] = o.verdict;
        if (!o.expected.empty()) j["expected"] = o.expected;
        if (!o.message.empty()) j["message"] = o.message;
        if (!o.html.empty()) j["html"] = o.html;
        if (!o.how.empty()) j["how"] = o.how;
        if (!o.triage.empty()) j["known"] = o.triage.starts_with("NEW") ? "" : o.triage;
        j["seconds"] = o.seconds;
        cases.push_back(std::move(j));
      }
      nlohmann::ordered_json j = {{"cases", std::move(cases)}, {"passed", passed}, {"failed", failed}};
      if (unavailable) {
        j["unavailable"] = unavailable->message;
        j["not_replayed"] = inputs.size() - outcomes.size();
      }
      if (skipped > 0) j["not_runnable"] = skipped;
      if (known) {
        j["new"] = new_failures;
        j["known"] = known_failures;
      }
      context.out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
    } else {
      // Exactly "N passed, M failed[, K skipped]": the line CI runners read.
      context.out << passed << " passed, " << failed << " failed";
      if (skipped > 0) context.out << ", " << skipped << " skipped";
      context.out << '\n';
      if (known)
        context.out << "failing cases against the known findings in " << options->known << ": new " << new_failures
                    << ", known " << known_failures << '\n';
      if (unavailable)
        context.out << "(stopped at " << unavailable->file << ": the target is unavailable; "
                    << inputs.size() - outcomes.size() << " inputs after it not replayed)\n";
      if (skipped > 0)
        context.out << "(skipped: " << skipped << " not runnable on this "
                    << (target->framework() ? options->target.target : std::string(context.backend.name())) << " job)\n";
    }
    if (!options->junit.empty()) {
      std::vector<fuzz::JunitCase> report;
      for (const Outcome& o : outcomes) {
        fuzz::JunitCase j;
        j.name = o.file;
        const std::string folder = fs::path(o.file).parent_path().generic_string();
        j.classname = "tally.replay." + (folder.empty() ? std::string(".") : folder);
        j.seconds = o.seconds;
        if (o.result == Result::mismatch)
          j.failure = o.message + "\nreplay: tally run " + shell_quote(o.file);
        if (o.result == Result::error || o.result == Result::unavailable) {
          j.failure = o.message;
          j.error = true;
        }
        if (o.result == Result::not_runnable) j.skipped = "not runnable on this job: " + o.message;
        report.push_back(std::move(j));
      }
      try {
        fuzz::write_junit(options->junit, "tally.replay", report);
      } catch (const std::exception& error) {
        throw UsageError(error.what());
      }
    }
    if (unavailable) {
      context.err << "tally: error: " << unavailable->message << " (at " << unavailable->file << ")\n";
      context.exit_code = kExitInfra;
      return;
    }
    if (errors > 0) {
      // One line for bad input; the ERROR lines above name every bad path.
      std::string first = first_error->message;
      std::replace_if(first.begin(), first.end(), [](char ch) { return ch == '\n' || ch == '\r'; }, ' ');
      context.err << "tally: error: " << errors << " of " << outcomes.size()
                  << " inputs could not be replayed (first: " << first << ")\n";
      context.exit_code = kExitBadInput;
      return;
    }
    context.exit_code = failed == 0 && new_failures == 0 ? kExitPass : kExitFail;
  });
}

}  // namespace tally::cli
