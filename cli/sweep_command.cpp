// tally sweep: every layout of one world on a target, one case per layout, feature and target
// axis (fuzz/sweep.h); resumable, shardable, with a JUnit file, an HTML index and known findings.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>
#include <memory>

#include <nlohmann/json.hpp>

#include "casefile/case_file.h"
#include "cli/backend_flags.h"
#include "cli/campaign_output.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "cli/number_flags.h"
#include "cli/path_flags.h"
#include "cli/sweep_reports.h"
#include "cli/target_flags.h"
#include "cli/usage_error.h"
#include "fuzz/known.h"
#include "fuzz/sweep.h"
#include "fuzz/sweep_driver.h"
#include "io/atomic_file.h"
#include "io/json_read.h"
#include "oracle/judge.h"
#include "run/run_case.h"
#include "run/target_run.h"
#include "run/target.h"
#include "topologies/parallel_config.h"
#include "topologies/presets.h"

namespace tally::cli {

namespace {

namespace fs = std::filesystem;
using fuzz::SweepResult;

struct SweepOptions {
  int world = 0;
  std::vector<std::string> features;
  std::vector<std::string> presets;
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

fuzz::SweepReport read_report_file(const std::string& file) {
  try {
    return fuzz::read_sweep_report(io::read_bounded_file(file, std::size_t{1} << 30, "sweep report"), file);
  } catch (const std::exception& error) {
    throw UsageError(error.what());
  }
}

int exit_code_of(const fuzz::SweepReport& report) {
  switch (fuzz::sweep_standing(fuzz::count_sweep(report.results))) {
    case fuzz::Standing::clean: return kExitPass;
    case fuzz::Standing::new_failures: return kExitFail;
    case fuzz::Standing::no_true_count: break;
  }
  return kExitInfra;
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
  SweepReportFiles(o.junit, o.html).write(merged);
  if (o.json) context.out << fuzz::sweep_report_json(merged).dump() << '\n';
  else print_sweep_summary(context.out, merged, 0.0);
  context.exit_code = exit_code_of(merged);
}

// The lanes: the target opened first, and for a real target a worker of the world per further
// lane (each in a folder of its own under --worker-dir); tally's model on sim runs every lane.
std::vector<std::unique_ptr<run::Target>> more_lanes(const SweepOptions& o, bool framework, CommandContext& context) {
  std::vector<std::unique_ptr<run::Target>> lanes;
  if (!framework) return lanes;
  for (unsigned lane = 1; lane < o.jobs; ++lane) {
    TargetOptions lane_options = o.target;
    if (!lane_options.work_dir.empty())
      lane_options.work_dir = (fs::path(lane_options.work_dir) / ("lane-" + std::to_string(lane))).string();
    lanes.push_back(chosen_target(lane_options, context.backend, context.err));
  }
  return lanes;
}

// A failure a sweep saved, judged again: a real target's from the manifests its case file saved
// (the framework is not run again), tally's model's by running the case.
fuzz::SavedFailureJudge judge_saved_failure(bool framework) {
  return [framework](const std::string& file) -> std::optional<std::pair<casefile::Case, oracle::Verdict>> {
    try {
      casefile::Case c = casefile::load_case_file(file, run::case_frameworks());
      if (!framework) {
        oracle::Verdict verdict = run::run_case(c);
        return std::pair{std::move(c), std::move(verdict)};
      }
      if (!c.target || c.target->manifests.empty()) return std::nullopt;
      const std::string dir = (fs::path(file).parent_path() / c.target->manifests).string();
      oracle::Verdict verdict = run::judge_saved_run_of(c, dir, oracle::kFrameworkRtol);
      return std::pair{std::move(c), std::move(verdict)};
    } catch (const std::exception&) {
      return std::nullopt;  // a case file that no longer reads: its record stands
    }
  };
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
  const std::vector<topologies::Preset> presets = parse_presets(o.presets, "--preset");

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

  fuzz::SweepDrive drive;
  drive.plan = fuzz::plan_sweep(
      {.world = o.world, .features = features, .presets = presets, .shard = shard, .shards = shards}, *target);
  drive.head = fuzz::sweep_report_head(drive.plan, o.world, opened->name, opened->version, shard, shards);
  drive.state_file = !o.state.empty() ? o.state : fuzz::default_sweep_state_file(o.corpus, shard, shards);
  if (const int removed = fuzz::remove_killed_sweeps_leftovers(o.corpus, drive.state_file); removed > 0 && !o.json)
    context.out << "removed " << removed << " temporary file" << (removed == 1 ? "" : "s")
                << " a killed sweep left unfinished\n";
  if (!o.fresh && fs::exists(drive.state_file)) {
    try {
      drive.resumed = fuzz::resume_sweep(read_report_file(drive.state_file), drive.head, drive.plan, drive.state_file);
    } catch (const std::invalid_argument& error) {
      throw UsageError("--state " + std::string(error.what()) + ": use --fresh to start over, or another --state");
    }
    if (drive.resumed.renumbered > 0 && !o.json)
      context.out << "state: " << drive.resumed.renumbered << " of its results number their cases otherwise than this tally "
                  << "does (written by an earlier one): those cases run again\n";
    if (drive.resumed.no_verdict > 0 && !o.json)
      context.out << "state: " << drive.resumed.no_verdict
                  << " of its cases gave an infrastructure error, no verdict: they run again\n";
  }
  drive.run.corpus_dir = o.corpus;
  drive.run.known = [&known, framework = opened->framework](const casefile::Case& c, const oracle::Verdict& v) {
    return fuzz::known_finding_of(known, framework, c, v);
  };
  if (!o.no_known && !drive.resumed.done.empty()) {
    const fuzz::RematchedFailures rematched =
        fuzz::rematch_new_failures(drive.resumed, drive.state_file, judge_saved_failure(opened->framework), drive.run.known);
    if ((rematched.now_known > 0 || rematched.still_new > 0 || rematched.not_judged > 0) && !o.json)
      context.out << "state: its new failures matched again against the known findings: " << rematched.now_known
                  << " known now, " << rematched.still_new << " still new"
                  << (rematched.not_judged > 0 ? ", " + std::to_string(rematched.not_judged) +
                                                     " kept as recorded (case file or manifests gone, or no longer failing)"
                                               : std::string())
                  << "\n";
  }
  // A release tally models is held against that model, case by case (docs/real-targets.md).
  if (const run::FrameworkTarget* row = opened->framework ? run::framework_target(opened->name) : nullptr;
      row && row->release_model_case)
    drive.run.release_model = [row, version = opened->version](const casefile::Case& c) -> std::optional<oracle::Verdict> {
      const std::optional<casefile::Case> model_case = row->release_model_case(c, version);
      if (!model_case) return std::nullopt;
      try {
        return run::run_case(*model_case);
      } catch (const casefile::InvalidCase&) {
        return std::nullopt;  // a case the release runs that tally's model does not build
      }
    };

  std::ostream& out = context.out;
  const std::size_t resumed = drive.resumed.done.size();
  if (!o.json)
    out << "tally sweep: world " << o.world << ", target " << opened->name << " " << opened->version << ": "
        << drive.plan.layouts.configurations << " configurations, " << drive.plan.layouts.layouts.size() << " layouts, "
        << drive.plan.total_cases << " cases"
        << (shards > 1 ? " (this shard " + std::to_string(drive.plan.cases.size()) + ")" : "") << ", "
        << drive.plan.cases.size() - resumed << " to run"
        << (resumed == 0 ? "" : " (" + std::to_string(resumed) + " done before, from " + drive.state_file + ")")
        << "\nstate: " << drive.state_file << "\nrepeat: tally sweep --world " << o.world << target_flags_text(o.target, 0)
        << (o.shard.empty() ? "" : " --shard " + o.shard) << (o.jobs > 1 ? " --jobs " + std::to_string(o.jobs) : "") << '\n'
        << std::flush;

  const std::vector<std::unique_ptr<run::Target>> workers = more_lanes(o, opened->framework, context);
  std::vector<run::Target*> lanes{target.get()};
  for (unsigned lane = 1; lane < o.jobs; ++lane) lanes.push_back(workers.empty() ? target.get() : workers[lane - 1].get());
  if (!o.json && o.jobs > 1)
    out << "lanes: " << o.jobs << " side by side, each taking whole layouts"
        << (opened->framework ? " (a worker of world " + std::to_string(o.world) + " each)" : "") << '\n' << std::flush;

  SweepPrinter printer(out, &out == &std::cout && ::isatty(STDOUT_FILENO) == 1, o.json, drive.state_file);
  SweepReportFiles files(o.junit, o.html);
  fuzz::SweepObservers observers({&printer, &files});
  InterruptScope interrupt;
  const fuzz::SweepEnd end = fuzz::drive_sweep(drive, lanes, observers, [&] { return interrupt.interrupted(); });
  if (end.error) {
    try {
      std::rethrow_exception(end.error);
    } catch (const run::TargetUnavailable& error) {
      context.err << "tally: error: " << error.what()
                  << (end.error_at.empty() ? " (opening a lane" : " (at " + end.error_at) << "; the sweep resumes from "
                  << drive.state_file << ")\n";
    } catch (const std::runtime_error& error) {
      if (!end.error_at.empty()) throw;  // the corpus cannot be written: tally's error, as any other command's
      context.err << "tally: error: " << error.what() << '\n';  // the lanes' workers are of different releases
    }
    context.exit_code = kExitInfra;
    return;
  }
  if (!o.json) files.print_where(out);
  context.exit_code = exit_code_of(end.report);
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
                      "Model features (comma-separated): dense, moe, moe-expert-biases, moe-shared-untied. "
                      "Default: every feature and every preset; naming features or presets sweeps only those named")
      ->delimiter(',');
  command->add_option("--preset", options->presets,
                      "Architecture presets (comma-separated), beside the features: " + topologies::preset_names() +
                      " (tally layout --preset NAME lists one); a preset with no model on a layout is left out there")
      ->delimiter(',');
  command->add_option("--shard", options->shard,
                      "I/N: run only the cases of the layouts whose number mod N is I (CI matrices, Slurm arrays; "
                      "a layout's cases stay together, so a framework's worker keeps its parallel state "
                      "across them); merge the shards' state files with --merge");
  command->add_option("--corpus", options->corpus, "Folder for failing cases (with a real target's manifests) and the state")
      ->check(output_folder())
      ->capture_default_str();
  command->add_option("--state", options->state,
                      "The state file the sweep rewrites as it goes (at most every 2 s, and at the end) and resumes from (default: "
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
