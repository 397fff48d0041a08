// tally sweep: every layout of one world on a target, one case per layout, feature and target
// axis (fuzz/sweep.h); resumable, shardable, with a JUnit file, an HTML index and known findings.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "casefile/case_file.h"
#include "cli/backend_flags.h"
#include "cli/campaign_output.h"
#include "cli/commands.h"
#include "cli/html_report.h"
#include "cli/number_flags.h"
#include "cli/path_flags.h"
#include "cli/target_flags.h"
#include "cli/usage_error.h"
#include "fuzz/junit.h"
#include "fuzz/known.h"
#include "fuzz/sweep.h"
#include "fuzz/sweep_lanes.h"
#include "io/atomic_file.h"
#include "io/json_read.h"
#include "run/run_case.h"
#include "run/target.h"
#include "topologies/parallel_config.h"

namespace tally::cli {

namespace {

namespace fs = std::filesystem;
using fuzz::SweepResult;

struct SweepOptions {
  int world = 0;
  std::vector<std::string> features;
  std::string shard;  // "I/N"
  std::string corpus = "tally-sweep";
  std::string state;  // default: <corpus>/sweep-state[-shard-I-of-N].json
  bool fresh = false;
  std::string junit;
  std::string html;
  std::string known;  // "": seeds/real where it exists
  bool no_known = false;
  bool json = false;
  std::vector<std::string> merge;
  unsigned jobs = 1;
  TargetOptions target;
};

// "2/8" -> {2, 8}. Throws UsageError naming --shard.
std::pair<int, int> parse_shard(const std::string& text) {
  const std::size_t slash = text.find('/');
  const auto number = [&](const std::string& part) {
    if (whole_number_error(part, 0, 1 << 20)) throw UsageError("--shard '" + text + "': expected I/N with 0 <= I < N, e.g. 0/4");
    return std::stoi(part);
  };
  if (slash == std::string::npos) throw UsageError("--shard '" + text + "': expected I/N with 0 <= I < N, e.g. 0/4");
  const int i = number(text.substr(0, slash)), n = number(text.substr(slash + 1));
  if (n < 1 || i >= n) throw UsageError("--shard '" + text + "': expected I/N with 0 <= I < N, e.g. 0/4");
  return {i, n};
}

std::vector<fuzz::SweepFeature> parse_features(const std::vector<std::string>& names) {
  std::vector<fuzz::SweepFeature> out;
  std::string all;
  for (fuzz::SweepFeature f : fuzz::kAllSweepFeatures) all += (all.empty() ? "" : ", ") + std::string(fuzz::sweep_feature_name(f));
  for (const std::string& name : names) {
    const auto it = std::find_if(std::begin(fuzz::kAllSweepFeatures), std::end(fuzz::kAllSweepFeatures),
                                 [&](fuzz::SweepFeature f) { return fuzz::sweep_feature_name(f) == name; });
    if (it == std::end(fuzz::kAllSweepFeatures)) throw UsageError("--features '" + name + "' is not a feature (" + all + ")");
    out.push_back(*it);
  }
  return out;
}

std::string minutes_text(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  return s >= 60 ? std::to_string(s / 60) + "m" + (s % 60 < 10 ? "0" : "") + std::to_string(s % 60) + "s"
                 : std::to_string(s) + "s";
}

struct Counts {
  std::int64_t pass = 0, fail_new = 0, fail_known = 0, refused = 0, infra = 0;
  std::int64_t refused_by_framework = 0;  // of `refused`: by the framework as the worker set the case up
  std::int64_t model_checked = 0, model_disagrees = 0;
  std::map<std::string, std::int64_t> known_by_name, refused_by_reason, framework_refused_by_reason;
  // The cases tally sent the framework (all but those its own rules refused).
  std::int64_t sent() const { return pass + fail_new + fail_known + infra + refused_by_framework; }
  // Why the sweep checked nothing worth a count: the framework refused most of what it was sent.
  std::optional<std::string> nothing_checked() const {
    if (refused_by_framework == 0 || 2 * refused_by_framework <= sent()) return std::nullopt;
    return "nothing was checked: the framework refused " + std::to_string(refused_by_framework) + " of the " +
           std::to_string(sent()) + " cases tally sent it (exit 3); each refusal above wants a rule citing the "
           "framework's check (run/<framework>/rules.cpp), or the worker fixed";
  }
};

Counts count(const std::vector<SweepResult>& results) {
  Counts c;
  for (const SweepResult& r : results) {
    c.model_checked += r.model_checked ? 1 : 0;
    c.model_disagrees += r.model_disagrees.empty() ? 0 : 1;
  }
  for (const SweepResult& r : results) switch (r.outcome) {
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
  return c;
}

// Each reason with its count, most first, at most eight lines.
void print_reasons(std::ostream& out, const std::map<std::string, std::int64_t>& by_reason, const std::string& head) {
  std::vector<std::pair<std::int64_t, std::string>> reasons;
  for (const auto& [reason, n] : by_reason) reasons.emplace_back(n, reason);
  std::sort(reasons.rbegin(), reasons.rend());
  for (std::size_t i = 0; i < reasons.size() && i < 8; ++i)
    out << "  " << head << " " << reasons[i].first << "x: " << reasons[i].second << '\n';
  if (reasons.size() > 8) out << "  " << head << " for " << reasons.size() - 8 << " more reasons (the JSON report lists each)\n";
}

void print_summary(std::ostream& out, const fuzz::SweepReport& report, double seconds) {
  const Counts c = count(report.results);
  out << "summary: world " << report.world << ", " << report.target << " " << report.version << ": "
      << report.configurations << " configurations, " << report.layouts << " layouts, " << report.results.size()
      << " cases";
  if (report.shards > 1) out << " (shard " << report.shard << "/" << report.shards << " of " << report.total_cases << ")";
  if (seconds > 0) out << " in " << minutes_text(seconds);
  out << "\n  passed " << c.pass << ", failed " << c.fail_new + c.fail_known << " (new " << c.fail_new << ", known "
      << c.fail_known << "), refused " << c.refused << ", infrastructure errors " << c.infra << '\n';
  if (c.refused_by_framework > 0)
    out << "  refused by tally's rules " << c.refused - c.refused_by_framework << ", by the framework itself "
        << c.refused_by_framework << '\n';
  for (const auto& [name, n] : c.known_by_name) out << "  known " << name << ": " << n << '\n';
  // The framework's own refusals first: each hides what its cases would show until a rule says it.
  print_reasons(out, c.framework_refused_by_reason, "refused by the framework");
  print_reasons(out, c.refused_by_reason, "refused");
  if (const std::optional<std::string> why = c.nothing_checked()) out << "  " << *why << '\n';
  for (const SweepResult& r : report.results)
    if ((r.outcome == SweepResult::Outcome::fail && r.known.empty()) || r.outcome == SweepResult::Outcome::infra_error)
      out << "  " << (r.outcome == SweepResult::Outcome::fail ? "NEW " : "INFRA ") << r.id << ": " << r.detail
          << (r.case_file.empty() ? "" : "; tally replay " + shell_quote(r.case_file)) << '\n';
  if (c.model_checked == 0) return;
  out << "  tally's model of " << report.target << " " << report.version << " (gradnorm/releases.h): held against "
      << c.model_checked << " cases, " << (c.model_disagrees == 0 ? "agrees on every one" : "disagrees on " + std::to_string(c.model_disagrees))
      << '\n';
  int listed = 0;
  for (const SweepResult& r : report.results)
    if (!r.model_disagrees.empty() && listed++ < 20) out << "  MODEL " << r.id << ": " << r.model_disagrees << '\n';
  if (listed > 20) out << "  and " << listed - 20 << " more disagreements (the JSON report lists each)\n";
}

std::vector<fuzz::JunitCase> junit_cases(const fuzz::SweepReport& report) {
  std::vector<fuzz::JunitCase> out;
  for (const SweepResult& r : report.results) {
    fuzz::JunitCase j;
    j.name = r.id;
    j.classname = "tally.sweep." + report.target + ".world" + std::to_string(report.world);
    j.seconds = r.seconds;
    switch (r.outcome) {
      case SweepResult::Outcome::pass: break;
      case SweepResult::Outcome::refused:
        j.skipped = (r.by_framework ? "refused by the framework: " : "refused: ") + r.detail;
        break;
      case SweepResult::Outcome::fail:
        if (!r.known.empty()) {
          j.name += " (known finding " + r.known + ")";
          break;
        }
        j.failure = r.detail + (r.case_file.empty() ? "" : "\nreplay: tally replay " + r.case_file);
        break;
      case SweepResult::Outcome::infra_error:
        j.failure = r.detail;
        j.error = true;
        break;
    }
    out.push_back(std::move(j));
  }
  return out;
}

// index.html: the sweep's summary, its failures (new first) with links to their pages, and every
// case's outcome.
void write_html_index(const std::string& dir, const fuzz::SweepReport& report) {
  std::ostringstream summary;
  print_summary(summary, report, 0.0);
  std::ostringstream page;
  page << "<!doctype html><html><head><meta charset=\"utf-8\"><title>tally sweep: world " << report.world << ", "
       << html_escape(report.target) << " " << html_escape(report.version) << "</title><style>"
       << "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
          "padding:2px 6px;text-align:left}.fail{background:#fdd}.known{background:#ffd}.infra-error{background:#fcf}"
          ".refused{color:#777}.model{outline:2px solid #c60}</style></head><body><h1>tally sweep: world "
       << report.world << ", " << html_escape(report.target) << " " << html_escape(report.version) << "</h1><pre>"
       << html_escape(summary.str()) << "</pre><table><tr><th>case</th><th>outcome</th><th>detail</th><th>s</th></tr>";
  for (const SweepResult& r : report.results) {
    const std::string css = r.outcome == SweepResult::Outcome::fail && !r.known.empty()
                                ? "known"
                                : std::string(fuzz::sweep_outcome_name(r.outcome));
    const bool has_page = fs::exists(fs::path(dir) / (r.id + ".html"));
    std::string detail = r.known.empty() ? r.detail : r.detail + " (known: " + r.known + ")";
    if (!r.model_disagrees.empty()) detail += (detail.empty() ? "" : "; ") + std::string("model disagrees: ") + r.model_disagrees;
    page << "<tr class=\"" << css << (r.model_disagrees.empty() ? "" : " model") << "\"><td>"
         << (has_page ? "<a href=\"" + html_escape(r.id) + ".html\">" + html_escape(r.id) + "</a>" : html_escape(r.id))
         << "</td><td>" << html_escape(css) << "</td><td>" << html_escape(detail)
         << "</td><td>" << static_cast<long>(r.seconds * 100 + 0.5) / 100.0 << "</td></tr>";
  }
  page << "</table></body></html>\n";
  io::write_file_atomically((fs::path(dir) / "index.html").string(), page.str(), "HTML index");
}

fuzz::SweepReport read_report_file(const std::string& file) {
  try {
    return fuzz::read_sweep_report(io::read_bounded_file(file, std::size_t{1} << 30, "sweep report"), file);
  } catch (const std::exception& error) {
    throw UsageError(error.what());
  }
}

void write_outputs(const SweepOptions& o, const fuzz::SweepReport& report) {
  if (!o.junit.empty()) fuzz::write_junit(o.junit, "tally sweep", junit_cases(report));
  if (!o.html.empty()) write_html_index(o.html, report);
}

int exit_code_of(const fuzz::SweepReport& report) {
  const Counts c = count(report.results);
  return c.infra > 0 || c.nothing_checked() ? kExitInfra : c.fail_new > 0 ? kExitFail : kExitPass;
}

void run_merge(const SweepOptions& o, CommandContext& context) {
  std::vector<fuzz::SweepReport> shards;
  for (const std::string& file : o.merge) shards.push_back(read_report_file(file));
  fuzz::SweepReport merged;
  try {
    merged = fuzz::merge_sweep_reports(shards);
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--merge: ") + error.what());
  }
  write_outputs(o, merged);
  if (o.json) context.out << fuzz::sweep_report_json(merged).dump() << '\n';
  else print_summary(context.out, merged, 0.0);
  context.exit_code = exit_code_of(merged);
}

void run_sweep(const SweepOptions& o, CommandContext& context) {
  if (!o.merge.empty()) return run_merge(o, context);
  if (o.world < 1) throw UsageError("--world is required: the world whose every layout is swept");
  const auto [shard, shards] = o.shard.empty() ? std::pair<int, int>{0, 1} : parse_shard(o.shard);
  if (std::optional<std::string> error = output_folder_error(o.corpus)) throw UsageError("--corpus: " + *error);
  if (!o.html.empty()) {
    if (std::optional<std::string> error = output_folder_error(o.html)) throw UsageError("--html: " + *error);
    std::error_code error;
    fs::create_directories(o.html, error);
    if (error) throw UsageError("--html " + o.html + ": cannot create the folder (" + error.message() + ")");
  }
  const std::vector<fuzz::SweepFeature> features = parse_features(o.features);

  std::unique_ptr<run::Target> target = chosen_target(o.target, context.backend, context.err);
  const run::TargetAbilities* opened = open_or_report(*target, o.world, context.err);
  if (!opened) {
    context.exit_code = kExitInfra;
    return;
  }
  if (o.jobs > 1 && !opened->framework && !target->runs_cases_side_by_side())
    throw UsageError("--jobs " + std::to_string(o.jobs) + ": tally's model on --backend " +
                     std::string(context.backend.name()) + " runs one case at a time (sim runs them side by side)");
  const std::vector<fuzz::KnownFinding> known =
      known_findings(*opened, o.known, o.no_known, o.json ? nullptr : &context.out);

  fuzz::SweepOptions plan_options;
  plan_options.world = o.world;
  plan_options.features = features;
  plan_options.shard = shard;
  plan_options.shards = shards;
  const fuzz::SweepPlan plan = fuzz::plan_sweep(plan_options, *target);

  fuzz::SweepReport report;
  report.world = o.world;
  report.target = opened->name;
  report.version = opened->version;
  for (fuzz::SweepFeature f : features.empty() ? std::vector<fuzz::SweepFeature>(std::begin(fuzz::kAllSweepFeatures),
                                                                                 std::end(fuzz::kAllSweepFeatures))
                                               : features)
    report.features.emplace_back(fuzz::sweep_feature_name(f));
  report.shard = shard;
  report.shards = shards;
  report.configurations = plan.layouts.configurations;
  report.layouts = static_cast<std::int64_t>(plan.layouts.layouts.size());
  report.total_cases = plan.total_cases;
  report.features_not_applicable = plan.features_not_applicable;

  // The state: resumed when it is of this sweep, refused when it is of another.
  const std::string state = !o.state.empty() ? o.state
                            : (fs::path(o.corpus) / (shards > 1 ? "sweep-state-shard-" + std::to_string(shard) + "-of-" +
                                                                      std::to_string(shards) + ".json"
                                                                : std::string("sweep-state.json")))
                                  .string();
  // A sweep killed mid-write (kill -9, a machine taken back) leaves hidden temporary files.
  {
    const std::string state_folder = fs::path(state).parent_path().empty() ? "." : fs::path(state).parent_path().string();
    int removed = io::remove_orphaned_temporaries(o.corpus);
    if (fs::path(state_folder) != fs::path(o.corpus)) removed += io::remove_orphaned_temporaries(state_folder);
    if (removed > 0 && !o.json)
      context.out << "removed " << removed << " temporary file" << (removed == 1 ? "" : "s")
                  << " a killed sweep left unfinished\n";
  }
  std::map<std::int64_t, SweepResult> done;
  if (!o.fresh && fs::exists(state)) {
    const fuzz::SweepReport previous = read_report_file(state);
    if (previous.world != report.world || previous.target != report.target || previous.version != report.version ||
        previous.features != report.features || previous.shard != shard || previous.shards != shards)
      throw UsageError("--state " + state + " is of another sweep (" + previous.target + " " + previous.version +
                       ", world " + std::to_string(previous.world) + ", shard " + std::to_string(previous.shard) + "/" +
                       std::to_string(previous.shards) + "): use --fresh to start over, or another --state");
    // Only this shard's cases (a state written before shards dealt whole layouts holds others), and
    // only where the number still names the same case: an earlier tally numbered a layout's cases
    // in another order, and its result would stand for another case.
    std::map<std::int64_t, std::string> planned;
    for (const fuzz::SweepCase& sc : plan.cases) planned.emplace(sc.index, sc.id);
    std::int64_t renumbered = 0, no_verdict = 0;
    for (const SweepResult& r : previous.results) {
      auto it = planned.find(r.index);
      if (it == planned.end()) continue;
      if (it->second != r.id) ++renumbered;
      // An infrastructure error is no verdict on the case: it runs again on the mended machine.
      else if (r.outcome == SweepResult::Outcome::infra_error) ++no_verdict;
      else done.emplace(r.index, r);
    }
    if (renumbered > 0 && !o.json)
      context.out << "state: " << renumbered << " of its results number their cases otherwise than this tally does (written "
          << "by an earlier one): those cases run again\n";
    if (no_verdict > 0 && !o.json)
      context.out << "state: " << no_verdict << " of its cases gave an infrastructure error, no verdict: they run again\n";
  }
  // Rewritten after a failure and at most every two seconds otherwise: a kill loses little, and a
  // sweep of thousands of fast cases does not rewrite its state thousands of times.
  auto last_save = std::chrono::steady_clock::now() - std::chrono::hours(1);
  const auto save_state = [&] {
    last_save = std::chrono::steady_clock::now();
    report.results.clear();
    for (const auto& [index, r] : done) report.results.push_back(r);
    fs::create_directories(fs::path(state).parent_path().empty() ? fs::path(".") : fs::path(state).parent_path());
    io::write_file_atomically(state, fuzz::sweep_report_json(report).dump(1) + "\n", "sweep state");
  };

  std::ostream& out = context.out;
  const bool terminal = &out == &std::cout && ::isatty(STDOUT_FILENO) == 1;
  const std::int64_t to_run = std::count_if(plan.cases.begin(), plan.cases.end(),
                                            [&](const fuzz::SweepCase& sc) { return !done.contains(sc.index); });
  if (!o.json)
    out << "tally sweep: world " << o.world << ", target " << opened->name << " " << opened->version << ": "
        << plan.layouts.configurations << " configurations, " << plan.layouts.layouts.size() << " layouts, "
        << plan.total_cases << " cases" << (shards > 1 ? " (this shard " + std::to_string(plan.cases.size()) + ")" : "")
        << ", " << to_run << " to run" << (done.empty() ? "" : " (" + std::to_string(done.size()) + " done before, from " + state + ")")
        << "\nstate: " << state << "\nrepeat: tally sweep --world " << o.world << target_flags_text(o.target, 0)
        << (o.shard.empty() ? "" : " --shard " + o.shard) << (o.jobs > 1 ? " --jobs " + std::to_string(o.jobs) : "")
        << '\n' << std::flush;

  fuzz::SweepRunOptions run_options;
  run_options.corpus_dir = o.corpus;
  run_options.known = [&known, framework = opened->framework](const casefile::Case& c, const oracle::Verdict& v) {
    return fuzz::known_finding_of(known, framework, c, v);
  };
  // A release tally models is held against that model, case by case (docs/real-targets.md).
  if (const run::FrameworkTarget* row = opened->framework ? run::framework_target(opened->name) : nullptr;
      row && row->release_model_case)
    run_options.release_model = [row, version = opened->version](const casefile::Case& c) -> std::optional<oracle::Verdict> {
      const std::optional<casefile::Case> model_case = row->release_model_case(c, version);
      if (!model_case) return std::nullopt;
      try {
        return run::run_case(*model_case);
      } catch (const casefile::InvalidCase&) {
        return std::nullopt;  // a case the release runs that tally's model does not build
      }
    };
  if (!o.html.empty())
    run_options.on_failure = [&](const fuzz::SweepCase& sc, const casefile::Case& c, const oracle::Verdict& verdict,
                                 const std::string& case_file) {
      write_case_html((fs::path(o.html) / (sc.id + ".html")).string(), "tally sweep: " + sc.id, c, verdict,
                      case_file.empty() ? std::vector<std::string>{} : std::vector<std::string>{"tally replay " + shell_quote(case_file)});
    };
  // The lanes: the target opened above, and for a real target a worker of the world per further
  // lane (each in a folder of its own under --worker-dir); tally's model on sim runs every lane.
  std::vector<std::unique_ptr<run::Target>> more_lanes;
  std::vector<run::Target*> lanes{target.get()};
  for (unsigned lane = 1; lane < o.jobs; ++lane) {
    if (!opened->framework) {
      lanes.push_back(target.get());
      continue;
    }
    TargetOptions lane_options = o.target;
    if (!lane_options.work_dir.empty())
      lane_options.work_dir = (fs::path(lane_options.work_dir) / ("lane-" + std::to_string(lane))).string();
    more_lanes.push_back(chosen_target(lane_options, context.backend, context.err));
    lanes.push_back(more_lanes.back().get());
  }
  if (!o.json && o.jobs > 1)
    out << "lanes: " << o.jobs << " side by side, each taking whole layouts"
        << (opened->framework ? " (a worker of world " + std::to_string(o.world) + " each)" : "") << '\n' << std::flush;

  InterruptScope interrupt;
  // The lanes' workers come up side by side before the clock starts: the rate and ETA are of cases.
  const std::exception_ptr not_opened = fuzz::open_sweep_lanes(lanes, o.world);
  // One sweep, one release: a lane whose worker is of another (an environment that differs between
  // starts) would put that release's verdicts in this one's report.
  if (!not_opened)
    for (std::size_t lane = 1; lane < lanes.size(); ++lane)
      if (const run::TargetAbilities& other = lanes[lane]->open(o.world);
          other.name != opened->name || other.version != opened->version) {
        context.err << "tally: error: lane " << lane << "'s worker is " << other.name << " " << other.version
                    << " where lane 0's is " << opened->name << " " << opened->version
                    << ": the lanes of one sweep run one release\n";
        context.exit_code = kExitInfra;
        return;
      }
  const auto start = std::chrono::steady_clock::now();
  std::int64_t ran = 0;
  // Of each case a lane ran, whether it was an infrastructure error: per lane, so that one lane
  // whose worker keeps failing stops the sweep however the others fare.
  std::vector<std::vector<bool>> machinery(lanes.size());
  bool stopping = false;  // a lane's machinery failed: the cases still in flight are recorded, quietly
  double last_progress = -10.0;
  std::vector<const fuzz::SweepCase*> to_do;
  for (const fuzz::SweepCase& sc : plan.cases)
    if (!done.contains(sc.index)) to_do.push_back(&sc);
  // Heard one case at a time, whichever lane ran it; false stops the lanes.
  const auto on_result = [&](std::size_t lane, const fuzz::SweepCase& sc, const SweepResult& r) {
    done.emplace(sc.index, r);
    ++ran;
    if (r.outcome != SweepResult::Outcome::refused)
      machinery[lane].push_back(r.outcome == SweepResult::Outcome::infra_error);
    if (r.outcome != SweepResult::Outcome::pass && r.outcome != SweepResult::Outcome::refused) save_state();
    else if (std::chrono::steady_clock::now() - last_save >= std::chrono::seconds(2)) save_state();
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // New failures and infrastructure errors as they come; known ones in the summary.
    if (!o.json && ((r.outcome == SweepResult::Outcome::fail && r.known.empty()) ||
                    r.outcome == SweepResult::Outcome::infra_error || r.by_framework)) {
      if (terminal) out << '\n';
      out << (r.outcome == SweepResult::Outcome::infra_error ? "INFRA "
              : r.by_framework                              ? "REFUSED "
                                                            : "NEW   ")
          << sc.id << ": " << r.detail << '\n' << std::flush;
    }
    if (!o.json && !r.model_disagrees.empty()) {
      if (terminal) out << '\n';
      out << "MODEL " << sc.id << ": " << r.model_disagrees << '\n' << std::flush;
    }
    if (!o.json && !stopping && (terminal ? elapsed - last_progress >= 0.2 : elapsed - last_progress >= 10.0)) {
      last_progress = elapsed;
      const double eta = elapsed / static_cast<double>(ran) * static_cast<double>(to_run - ran);
      const std::string line = "case " + std::to_string(done.size()) + "/" + std::to_string(plan.cases.size()) + " (" + sc.id +
                               ")  elapsed " + minutes_text(elapsed) + "  " +
                               std::to_string(static_cast<long>(60.0 * static_cast<double>(ran) / std::max(elapsed, 1e-9))) +
                               "/min  ETA " + minutes_text(eta);
      if (terminal) out << '\r' << line << "   " << std::flush;
      else out << "progress: " << line << '\n' << std::flush;
    }
    // A target whose machinery keeps failing gives no true count: stop, resumable.
    if (stopping) return false;
    if (const std::optional<std::string> why = fuzz::machinery_failing(machinery[lane])) {
      stopping = true;
      if (!o.json)
        out << "\n" << *why << (lanes.size() > 1 ? " (lane " + std::to_string(lane) + ")" : std::string()) +
                                   ": the sweep stops (it resumes from " << state << ")\n";
      return false;
    }
    return true;
  };
  const fuzz::LanesEnd end = not_opened ? fuzz::LanesEnd{false, not_opened, ""}
                                        : fuzz::run_sweep_lanes(lanes, o.world, to_do, run_options, on_result,
                                                                [&] { return interrupt.interrupted(); });
  if (end.error) {
    // What the lanes finished is kept whatever stopped them.
    save_state();
    write_outputs(o, report);
    try {
      std::rethrow_exception(end.error);
    } catch (const run::TargetUnavailable& error) {
      context.err << "tally: error: " << error.what()
                  << (end.error_at.empty() ? " (opening a lane" : " (at " + end.error_at) << "; the sweep resumes from "
                  << state << ")\n";
      context.exit_code = kExitInfra;
      return;
    }
  }
  const bool stopped = end.stopped;
  if (terminal && !o.json) out << '\n';
  save_state();
  write_outputs(o, report);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (o.json) {
    out << fuzz::sweep_report_json(report).dump() << '\n';
  } else {
    print_summary(out, report, seconds);
    if (stopped) out << "  stopped before the end: " << plan.cases.size() - done.size() << " cases not run (run again to resume)\n";
    if (!o.junit.empty()) out << "junit: " << o.junit << '\n';
    if (!o.html.empty()) out << "html: " << (fs::path(o.html) / "index.html").string() << '\n';
  }
  context.exit_code = exit_code_of(report);
}

}  // namespace

void add_sweep_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<SweepOptions>();
  CLI::App* command = app.add_subcommand(
      "sweep",
      "Every layout of one world on a target: each valid configuration (every axis and order) "
      "collapsed to its distinct process groups, crossed with the model features that change what "
      "is counted and the target's own axis (the optimizer models, and for megatron-core the layer-wise parameter layout and Megatron-FSDP's strategies, which releases before 0.19 refuse; DeepSpeed's ZeRO stages and "
      "precisions; torchtitan's clips, SPMD backends and HSDP), one case each, and the distributed optimizer (with "
      "hybrid Megatron-FSDP over it) with every number of distributed-optimizer instances the layout allows. Resumable (the state file after a kill), shardable (--shard I/N, "
      "then --merge), with JUnit, an HTML index, and failures that repeat a known finding counted "
      "apart. A megatron-core release tally models is held against that model case by case: the "
      "summary lists each case where they disagree (MODEL lines; the exit code stays the release's). Exit 0 no new failure, 1 new failures, 2 bad input, 3 infrastructure errors, or the framework itself refused most of the cases it was sent (nothing was checked).");
  command->add_option("--world", options->world, "The world whose every layout is swept")
      ->check(whole_number(1, topologies::kMaxWorld));
  command->add_option("--features", options->features,
                      "Model features (comma-separated; default all): dense, moe, moe-expert-biases, "
                      "moe-shared-untied")
      ->delimiter(',');
  command->add_option("--shard", options->shard,
                      "I/N: run only the cases of the layouts whose number mod N is I (CI matrices, Slurm arrays; "
                      "a layout's cases stay together, so a framework's worker keeps its parallel state "
                      "across them); merge the shards' state files with --merge");
  command->add_option("--corpus", options->corpus, "Folder for failing cases (with a real target's manifests) and the state")
      ->check(output_folder())
      ->capture_default_str();
  command->add_option("--state", options->state,
                      "The state file the sweep rewrites after each case and resumes from (default: "
                      "CORPUS/sweep-state.json, or sweep-state-shard-I-of-N.json)");
  command->add_flag("--fresh", options->fresh, "Start over, ignoring the state file");
  command->add_option("--junit", options->junit, "Write a JUnit XML report here")->check(output_file());
  command->add_option("--html", options->html, "Write an HTML index of the sweep into this folder");
  command->add_option("--known", options->known,
                      "Folder of known findings (case files with their manifests) for a real target; default "
                      "seeds/real where it exists: a failure repeating one is counted as known, not new");
  command->add_flag("--no-known", options->no_known, "Count every failure as new");
  command->add_flag("--json", options->json, "Machine-readable report (no progress lines)");
  command->add_option("--merge", options->merge,
                      "Merge the state files of a sharded sweep's shards into one report (with --junit, --html, --json)");
  command->add_option("--jobs", options->jobs,
                      "Lanes side by side, each taking the next whole layout (one command in place of --shard "
                      "by hand; the state and report are one): a real target starts a worker of the world per "
                      "lane, so a machine with room for several (one GPU shared over gloo, its cores) sweeps "
                      "that many times as fast; tally's model on sim runs them as threads")
      ->check(whole_number(1, 64))
      ->capture_default_str();
  add_backend_flags(*command);
  add_target_flags(*command, options->target);
  command->callback([options, &context] { run_sweep(*options, context); });
}

}  // namespace tally::cli
