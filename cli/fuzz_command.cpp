// tally fuzz: a campaign (generate, run, save and shrink each failure).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/backend_flags.h"
#include "cli/campaign_output.h"
#include "cli/commands.h"
#include "cli/fault_flags.h"
#include "cli/model_flags.h"
#include "cli/number_flags.h"
#include "cli/path_flags.h"
#include "cli/target_flags.h"
#include "cli/usage_error.h"
#include "cli/verdict_report.h"
#include "fuzz/campaign.h"
#include "fuzz/junit.h"
#include "io/atomic_file.h"
#include "fuzz/known.h"
#include "fuzz/sweep.h"
#include "vocab/faults.h"
#include "run/target.h"

namespace tally::cli {

namespace {

nlohmann::ordered_json failure_json(const fuzz::Failure& f) {
  nlohmann::ordered_json j;
  j["case"] = f.index;
  j["failure"] = fuzz::describe(f.signature);
  j["faults"] = vocab::fault_list(f.original.path.faults);
  j["original"] = f.original_path;
  j["original_world"] = f.original.topology.world;
  if (!f.known.empty()) j["known"] = f.known;
  if (f.same_as || !f.known.empty()) {  // not shrunk: the earlier failure's case number, or a known finding
    j["same_as"] = f.same_as ? nlohmann::ordered_json(*f.same_as) : nlohmann::ordered_json(nullptr);
    j["shrunk"] = nullptr;
    j["shrink_steps"] = 0;
    j["shrink_runs"] = 0;
    j["statistics"] = f.original.expect ? f.original.expect->statistics : std::vector<std::string>{};
    return j;
  }
  j["shrunk"] = f.shrunk_path;
  j["shrunk_world"] = f.shrunk.topology.world;
  j["shrunk_model"] = model_text(f.shrunk);
  j["shrink_steps"] = f.shrink.steps;
  j["shrink_runs"] = f.shrink.runs;
  j["shrink_complete"] = f.shrink_complete;
  if (f.shrink_complete)
    j["shrink_last_round"] = {{"passed", f.shrink.last_round.passed},
                              {"failed_otherwise", f.shrink.last_round.failed_otherwise},
                              {"invalid", f.shrink.last_round.invalid}};
  j["statistics"] = f.shrunk.expect ? f.shrunk.expect->statistics : std::vector<std::string>{};
  return j;
}

// The campaign's faults as its header and summary show them.
std::string faults_text(const std::vector<vocab::Fault>& faults, bool all_asked) {
  if (faults.empty()) return "none";
  if (faults.size() == vocab::fault_catalog().size()) return "all (one per case)";
  if (all_asked) return "all " + std::to_string(faults.size()) + " the target plants (one per case)";
  std::string out;
  for (vocab::Fault f : faults) out += (out.empty() ? "" : ",") + std::string(vocab::fault_info(f).name);
  return out;
}

struct FuzzOptions {
  std::int64_t cases = 0;
  std::string time;
  std::optional<std::uint64_t> seed;
  int max_world = 64;
  std::string faults = "none";
  std::string corpus = "tally-corpus";
  std::string junit;
  int max_failures = 20;
  int shrink_runs = 1000;
  std::string shrink_time = "60s";
  std::string shrink;  // "all" or "new"; empty: new on a real target, all on tally's model
  bool json = false;
  std::string norm_code;  // only cases of this norm code (prefix); "": all
  TargetOptions target;
  int world = 2;  // --target: every case's world
  std::string known;  // --known; "": seeds/real where it exists
  bool no_known = false;
  unsigned jobs = 0;  // 0: one per core where the target runs cases side by side, else 1
  std::vector<std::string> presets;  // --preset: every case's model one of these; empty: generated models
};

// One testcase per failure (its shrunk case once shrunk), or one passing testcase for a
// campaign without failures.
std::vector<fuzz::JunitCase> junit_cases(std::uint64_t seed, std::int64_t cases, double seconds,
                                         const std::vector<fuzz::Failure>& failures,
                                         const std::optional<fuzz::InfraStop>& infra,
                                         const std::map<std::string, std::int64_t>& refused) {
  std::vector<fuzz::JunitCase> out;
  for (const auto& [why, n] : refused) {  // skipped: one testcase per reason the framework gave
    fuzz::JunitCase j;
    j.name = "refused " + std::to_string(n) + "x by " + why;
    j.classname = "tally.fuzz.refused";
    j.skipped = j.name;
    out.push_back(std::move(j));
  }
  if (infra) {  // an <error>: the campaign could not run
    fuzz::JunitCase j;
    j.name = !infra->path.empty() ? infra->path : "case " + std::to_string(infra->index);
    j.classname = "tally.fuzz";
    j.failure = infra_stop_text(*infra);
    j.error = true;
    out.push_back(std::move(j));
  }
  for (const fuzz::Failure& f : failures) {
    fuzz::JunitCase j;
    j.name = !f.shrunk_path.empty()    ? f.shrunk_path
             : !f.original_path.empty() ? f.original_path
                                        : "case " + std::to_string(f.index);
    j.classname = "tally.fuzz";
    j.seconds = f.shrink.seconds;
    j.failure = fuzz::describe(f.signature) + " at case " + std::to_string(f.index) + " (faults " +
                vocab::fault_list(f.original.path.faults) + ")\n" +
                case_summary(f.shrunk_done ? f.shrunk : f.original);
    if (!f.shrunk_path.empty()) j.failure += "\nreplay: tally replay " + f.shrunk_path;
    if (!f.original_path.empty()) j.failure += "\nreplay: tally replay " + f.original_path;
    out.push_back(std::move(j));
  }
  if (failures.empty() && !infra) {  // the campaign itself, passed
    fuzz::JunitCase j;
    j.name = "campaign seed " + std::to_string(seed) + ", " + std::to_string(cases) + " cases";
    j.classname = "tally.fuzz";
    j.seconds = seconds;
    out.push_back(std::move(j));
  }
  return out;
}

// Prints a campaign as it goes: a live line on a terminal, plain lines every few seconds
// otherwise, and each failure with its files and replay commands.
class FuzzPrinter final : public fuzz::CampaignObserver {
 public:
  FuzzPrinter(std::ostream& out, bool terminal, bool quiet, std::uint64_t seed, std::string junit)
      : out_(out), terminal_(terminal), quiet_(quiet), seed_(seed), junit_(std::move(junit)) {}

  // The JUnit report, rewritten at each failure (so a killed campaign leaves one) and at the end.
  void write_junit(std::int64_t cases, double seconds, const std::map<std::string, std::int64_t>& refused = {}) const {
    if (!junit_.empty())
      fuzz::write_junit(junit_, "tally fuzz", junit_cases(seed_, cases, seconds, failures_, infra_, refused));
  }

  void case_done(std::int64_t cases, int failures, double seconds) override {
    if (quiet_) return;
    const double gap = terminal_ ? 0.1 : 5.0;
    if (seconds - last_ < gap) return;
    last_ = seconds;
    const std::string line = "cases " + std::to_string(cases) + "  " + rate_text(cases, seconds) +
                             " cases/s  failures " + std::to_string(failures) + "  elapsed " +
                             seconds_text(seconds);
    if (terminal_) {
      out_ << '\r' << line << "   " << std::flush;
      live_ = true;
    } else {
      out_ << "progress: " << line << '\n' << std::flush;
    }
  }

  void failure_found(const fuzz::Failure& f) override {
    failures_.push_back(f);
    write_junit(0, 0.0);
    if (quiet_) return;
    end_live_line();
    out_ << "FAILURE at case " << f.index << ": " << fuzz::describe(f.signature) << " (faults "
         << vocab::fault_list(f.original.path.faults) << ")\n"
         << indent(case_summary(f.original), "  ") << '\n';
    if (!f.original_path.empty()) out_ << "  saved " << f.original_path << '\n';
    if (!f.same_as && f.known.empty()) out_ << "  shrinking..." << std::flush;
  }

  void failure_not_shrunk(const fuzz::Failure& f) override {
    if (quiet_) return;
    if (!f.known.empty()) out_ << "  not shrunk: a known finding, " << f.known << " (--known)\n" << std::flush;
    else out_ << "  not shrunk: fails the same way as case " << *f.same_as << " (--shrink new)\n" << std::flush;
  }

  void shrink_step(const fuzz::Failure&, const fuzz::ShrinkOutcome&) override {
    if (quiet_ || !terminal_) return;
    out_ << '.' << std::flush;
  }

  void failure_shrunk(const fuzz::Failure& f) override {
    failures_.back() = f;
    write_junit(0, 0.0);
    if (quiet_) return;
    out_ << "\n  shrunk in " << f.shrink.steps << " steps (" << f.shrink.runs << " cases run"
         << (f.shrink_complete ? "" : ", stopped early") << "): " << world_text(f.shrunk.topology)
         << ", " << model_text(f.shrunk) << '\n';
    // Why no smaller case: each candidate of the last case ran and none failed the same way.
    if (f.shrink_complete)
      if (const std::string why = fuzz::describe(f.shrink.last_round); !why.empty())
        out_ << "  no smaller case fails the same way: " << why << '\n';
    out_ << indent(case_summary(f.shrunk), "  ") << '\n';
    if (!f.shrunk_path.empty()) {
      out_ << "  saved " << f.shrunk_path << '\n'
           << "  replay: tally replay " << f.shrunk_path << '\n'
           << "          tally replay " << f.original_path << '\n';
    }
    out_ << std::flush;
  }

  void infra_error(const fuzz::InfraStop& stop) override {
    infra_ = stop;
    write_junit(0, 0.0);
    if (quiet_) return;
    end_live_line();
    out_ << "INFRASTRUCTURE ERROR " << (stop.while_shrinking ? "while shrinking case " : "at case ") << stop.index
         << " (no verdict; the campaign stops, the summary says why)\n"
         << indent(case_summary(stop.c), "  ") << '\n' << std::flush;
  }

  void end_live_line() {
    if (live_) out_ << '\n';
    live_ = false;
  }

 private:
  std::ostream& out_;
  bool terminal_;
  bool quiet_;
  bool live_ = false;
  double last_ = 0.0;
  std::uint64_t seed_;
  std::string junit_;
  std::vector<fuzz::Failure> failures_;
  std::optional<fuzz::InfraStop> infra_;
};

void run_fuzz(const FuzzOptions& o, CommandContext& context) {
  if (o.cases < 0) throw UsageError("--cases must be at least 1 (got " + std::to_string(o.cases) + ")");
  if (o.max_world < 1 || o.max_world > topologies::kMaxWorld)
    throw UsageError("--max-world must be in 1.." + std::to_string(topologies::kMaxWorld) +
                     " (got " + std::to_string(o.max_world) + ")");
  if (o.max_failures < 0) throw UsageError("--max-failures must be at least 0 (0: no bound)");
  if (o.shrink_runs < 0) throw UsageError("--shrink-runs must be at least 0");
  // The default corpus folder is checked too: a campaign must not find out at its first failure.
  if (std::optional<std::string> error = output_folder_error(o.corpus)) throw UsageError("--corpus: " + *error);
  fuzz::CampaignOptions campaign;
  campaign.seed = o.seed ? *o.seed : std::random_device{}() * 4294967296ull + std::random_device{}();
  campaign.max_cases = o.cases;
  campaign.max_seconds = o.time.empty() ? (o.cases > 0 ? 0.0 : 60.0) : parse_duration(o.time, "--time");
  campaign.generator.topology.max_world = o.max_world;
  campaign.generator.topology.exact_world = context.backend.world();
  if (!o.norm_code.empty()) campaign.generator.keep_only = fuzz::norm_code_filter(o.norm_code);
  campaign.generator.presets = parse_presets(o.presets, "--preset");
  campaign.corpus_dir = o.corpus;
  // What a campaign killed mid-write left behind.
  if (const int removed = io::remove_orphaned_temporaries(o.corpus); removed > 0 && !o.json)
    context.out << "removed " << removed << " temporary file" << (removed == 1 ? "" : "s")
                << " a killed campaign left unfinished in " << o.corpus << '\n';
  campaign.max_failures = o.max_failures;
  campaign.shrink.max_runs = o.shrink_runs;
  campaign.shrink.max_seconds = parse_duration(o.shrink_time, "--shrink-time");

  std::vector<vocab::Fault> asked = parse_fault_list({o.faults}, "--faults");

  // The target opens first: a real framework's worker for --world (its release decides what it
  // builds and plants).
  std::unique_ptr<run::Target> target = chosen_target(o.target, context.backend, context.err);
  if (o.jobs > 1 && !target->runs_cases_side_by_side())
    throw UsageError("--jobs " + std::to_string(o.jobs) + ": " +
                     (target->framework() ? "the " + o.target.target + " worker runs one case at a time"
                                          : "the " + std::string(context.backend.name()) +
                                                " backend's processes run one case at a time (--backend sim runs them side by side)"));
  const run::TargetAbilities* opened = open_or_report(*target, o.world, context.err);
  if (!opened) {
    context.exit_code = kExitInfra;
    return;
  }
  campaign.world = o.world;
  campaign.jobs = o.jobs > 0 ? o.jobs : target->runs_cases_side_by_side() ? std::max(1u, std::thread::hardware_concurrency()) : 1;
  // Known findings of a real framework's release: counted apart, not shrunk again.
  const std::vector<fuzz::KnownFinding> known =
      known_findings(*opened, o.known, o.no_known, o.json ? nullptr : &context.out);
  if (!known.empty())
    campaign.known = [&known](const casefile::Case& c, const oracle::Verdict& v) {
      return fuzz::known_finding_of(known, /*framework=*/true, c, v);
    };
  // Each case switches on one of the faults: "all" is every fault the target plants; a fault named
  // that it cannot plant is an error.
  try {
    asked = fuzz::faults_to_plant(std::move(asked), o.faults == "all", opened->plants);
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string(o.faults == "all" ? "--faults all: " : "--faults: ") +
                     (opened->framework ? "the " + opened->name + " " + opened->version + " worker"
                                        : "tally's model on the " + std::string(context.backend.name()) + " backend") +
                     " " + error.what() + (o.faults == "all" ? " (use --faults none for a fault-free campaign)" : ""));
  }
  campaign.generator.faults = asked;
  // A real framework's run costs a second or more, and its known miscounts recur in most cases.
  const std::string shrink = !o.shrink.empty() ? o.shrink : opened->framework ? "new" : "all";
  campaign.shrink_repeated_signatures = shrink == "all";
  const std::string target_text = opened->framework ? "target " + o.target.target + " " + opened->version + " (world " +
                                                          std::to_string(opened->world) + ")"
                                                    : "backend " + std::string(context.backend.name());

  std::ostream& out = context.out;
  const bool terminal = &out == &std::cout && ::isatty(STDOUT_FILENO) == 1;
  std::string repeat = "tally fuzz --seed " + std::to_string(campaign.seed);
  if (o.cases > 0) repeat += " --cases " + std::to_string(o.cases);
  if (!o.time.empty()) repeat += " --time " + o.time;
  if (o.max_world != 64) repeat += " --max-world " + std::to_string(o.max_world);
  if (o.faults != "none") repeat += " --faults " + o.faults;
  if (o.max_failures != 20) repeat += " --max-failures " + std::to_string(o.max_failures);
  if (!o.shrink.empty()) repeat += " --shrink " + o.shrink;
  if (!o.norm_code.empty()) repeat += " --norm-code " + shell_quote(o.norm_code);
  if (!o.presets.empty()) repeat += " --preset " + presets_text(campaign.generator.presets);
  if (context.backend.world() > 0)  // the same job size, the same cases
    repeat = "mpirun -np <the same> " + repeat + " --backend " + std::string(context.backend.name());
  repeat += target_flags_text(o.target, opened->framework ? opened->world : 0);
  const std::string shown_target =
      target_text + (context.backend.world() > 0 ? " (world " + std::to_string(context.backend.world()) + ")" : "");
  if (!o.json) {
    out << "tally fuzz: seed " << campaign.seed << ", " << shown_target << ", faults "
        << faults_text(asked, o.faults == "all") << ", max world " << o.max_world << ", ";
    if (!o.presets.empty()) out << "presets " << presets_text(campaign.generator.presets) << ", ";
    if (o.cases > 0) out << o.cases << " cases";
    if (o.cases > 0 && campaign.max_seconds > 0) out << " or ";
    if (campaign.max_seconds > 0) out << seconds_text(campaign.max_seconds);
    out << ", corpus " << campaign.corpus_dir << "\nrepeat: " << repeat << '\n' << std::flush;
  }

  FuzzPrinter printer(out, terminal, o.json, campaign.seed, o.junit);
  InterruptScope interrupt;
  fuzz::CampaignResult result;
  try {
    result = fuzz::run_campaign(campaign, *target, printer, interrupt.flag());
    printer.write_junit(result.cases, result.seconds, result.refused_by_reason);
  } catch (const rc::GenerationFailure& failure) {
    printer.end_live_line();
    context.exit_code = report_generation_failure(failure, o.norm_code, context.err);
    return;
  } catch (const std::exception& error) {
    printer.end_live_line();
    context.err << "tally: error: " << error.what() << '\n';
    context.exit_code = kExitInfra;
    return;
  }
  printer.end_live_line();
  const std::int64_t refused = fuzz::refused_by_framework(result);
  const std::optional<std::string> nothing_checked = fuzz::nothing_checked(refused, result.cases);
  const std::int64_t new_failures = fuzz::new_failures(result);

  if (o.json) {
    nlohmann::ordered_json j;
    j["seed"] = result.seed;
    j["cases"] = result.cases;
    j["seconds"] = result.seconds;
    j["cases_per_second"] = result.seconds > 0 ? static_cast<double>(result.cases) / result.seconds : 0.0;
    j["stopped_by"] = std::string(fuzz::stop_name(result.stopped_by));
    j["target"] = o.target.target;
    j["faults"] = faults_text(asked, o.faults == "all");
    if (!o.presets.empty()) j["presets"] = presets_text(campaign.generator.presets);
    j["failures"] = nlohmann::ordered_json::array();
    for (const fuzz::Failure& f : result.failures) j["failures"].push_back(failure_json(f));
    j["new"] = new_failures;
    j["known"] = static_cast<std::int64_t>(result.failures.size()) - new_failures;
    j["infra_error"] = result.infra_error ? infra_stop_json(*result.infra_error) : nlohmann::ordered_json(nullptr);
    if (!result.cases_by_norm_code.empty()) j["cases_by_norm_code"] = result.cases_by_norm_code;
    j["cases_before_reduction"] = result.cases_before_reduction;
    if (!result.refused_by_reason.empty()) j["refused_by_reason"] = result.refused_by_reason;
    j["refused"] = refused;
    if (nothing_checked) j["nothing_checked"] = *nothing_checked;
    out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
  } else {
    const std::size_t failures = result.failures.size();
    out << "summary: " << result.cases << " cases in " << seconds_text(result.seconds) << " ("
        << rate_text(result.cases, result.seconds) << " cases/s), " << failures
        << (failures == 1 ? " failure" : " failures");
    if (!known.empty() || new_failures != static_cast<std::int64_t>(failures))
      out << " (new " << new_failures << ", known " << static_cast<std::int64_t>(failures) - new_failures << ")";
    if (refused > 0) out << ", refused " << refused;
    out << ", seed " << result.seed;
    switch (result.stopped_by) {
      case fuzz::CampaignResult::Stop::interrupted: out << ", interrupted"; break;
      case fuzz::CampaignResult::Stop::max_failures:
        out << ", stopped at --max-failures " << o.max_failures;
        break;
      case fuzz::CampaignResult::Stop::infra_error: out << ", stopped by an infrastructure error (exit 3)"; break;
      default: break;
    }
    out << '\n';
    if (!result.cases_by_norm_code.empty()) {
      out << "  cases by norm code:";
      const char* separator = " ";
      for (const auto& [code, n] : result.cases_by_norm_code) {
        out << separator << code << ' ' << n;
        separator = ", ";
      }
      out << '\n';
    }
    out << "  gradients before the " << (o.target.target == "model" ? "reduction" : "framework's own reduction") << ": "
        << result.cases_before_reduction << " of " << result.cases << " cases\n";
    // What the framework itself declined, by its reason: what this campaign could not reach.
    for (const auto& [why, n] : result.refused_by_reason) out << "  refused " << n << "x by " << why << '\n';
    if (nothing_checked) out << "  " << *nothing_checked << '\n';
    if (result.infra_error) out << infra_stop_text(*result.infra_error);
    std::map<std::string, int> known_counts;
    for (const fuzz::Failure& f : result.failures)
      if (!f.known.empty()) ++known_counts[f.known];
    for (const auto& [name, n] : known_counts) out << "  known " << name << ": " << n << '\n';
    for (const fuzz::Failure& f : result.failures) {
      if (!f.known.empty()) continue;
      out << "  case " << f.index << ": " << fuzz::describe(f.signature);
      if (f.same_as)
        out << "; as case " << *f.same_as << ", not shrunk"
            << (f.original_path.empty() ? "" : "; tally replay " + f.original_path) << '\n';
      else
        out << "; shrunk to " << world_text(f.shrunk.topology) << ", " << model_text(f.shrunk)
            << (f.shrunk_path.empty() ? "" : "; tally replay " + f.shrunk_path) << '\n';
    }
    if (!o.junit.empty()) out << "junit: " << o.junit << '\n';
  }
  // No count of failures is true while the target is broken; known findings alone are no news.
  switch (fuzz::campaign_standing(result)) {
    case fuzz::Standing::clean: context.exit_code = kExitPass; break;
    case fuzz::Standing::new_failures: context.exit_code = kExitFail; break;
    case fuzz::Standing::no_true_count: context.exit_code = kExitInfra; break;
  }
}

}  // namespace

void add_fuzz_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<FuzzOptions>();
  CLI::App* command = app.add_subcommand(
      "fuzz",
      "A fuzz campaign: random valid cases (topology, model, optimizer, gradients) on the "
      "in-process backend. Each failure is written to the corpus, shrunk, and the shrunk case "
      "written next to it. Exit 0 no failure, 1 failures found, 2 bad input, 3 infrastructure "
      "failure (a case that gave no verdict stops the campaign; it is saved with its message, "
      "never shrunk), or a real framework that refused most of the campaign's cases itself (nothing "
      "was checked). Ctrl-C finishes the current case and prints the summary.");
  // A flag given twice takes its last value, so scripts' defaults can be overridden.
  command->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  command->add_option("--cases", options->cases, "Stop after this many cases")
      ->check(whole_number(1, kNoUpperBound));
  command->add_option("--time", options->time,
                      "Stop after this long (90s, 10m, 1h30m; default 1m when --cases is not given)")
      ->check(duration());
  command->add_option("--seed", options->seed, "Campaign seed (default: a fresh one, printed)")
      ->check(seed_number());
  command->add_option("--max-world", options->max_world, "Largest world generated")
      ->check(whole_number(1, topologies::kMaxWorld))
      ->capture_default_str();
  command->add_option("--faults", options->faults,
                      "none, all (every catalog fault the target can switch on), or fault names "
                      "(comma-separated; each must be one the target plants): each case switches on one")
      ->capture_default_str();
  add_norm_code_flag(*command, options->norm_code);
  command->add_option("--preset", options->presets,
                      "Architecture presets (comma-separated: " + topologies::preset_names() +
                          "): every case's model is one of them, laid out on its drawn configuration (tally "
                          "layout --preset NAME lists one). Default: tally's generated models")
      ->delimiter(',');
  command->add_option("--corpus", options->corpus, "Folder for the case files of failures")
      ->check(output_folder())
      ->capture_default_str();
  command->add_option("--junit", options->junit, "Write a JUnit XML report here")->check(output_file());
  command->add_option("--max-failures", options->max_failures,
                      "Stop after this many failures (0: no bound); with --shrink new, failures "
                      "that repeat an earlier one do not count")
      ->check(whole_number(0, kIntMax))
      ->capture_default_str();
  command->add_option("--shrink-runs", options->shrink_runs, "Cases run while shrinking one failure")
      ->check(whole_number(0, kIntMax))
      ->capture_default_str();
  command->add_option("--shrink-time", options->shrink_time, "Time spent shrinking one failure")
      ->check(duration())
      ->capture_default_str();
  command->add_option("--shrink", options->shrink,
                      "Which failures to shrink: all, or new (only the first of each failure "
                      "signature and set of planted faults; later ones are saved unshrunk). "
                      "Default: new on a real framework (--target " + run::framework_names(" or ") +
                          "), all on tally's model")
      ->check(CLI::IsMember({"all", "new"}));
  command->add_flag("--json", options->json, "Machine-readable summary (no progress lines)");
  command->add_option("--jobs", options->jobs,
                      "Threads running cases side by side on tally's model (--backend sim); the same cases, "
                      "failures and files whatever the number (0: one per core; a real framework and the mpi "
                      "and nccl backends run one at a time)")
      ->check(whole_number(0, 1024))
      ->capture_default_str();
  command->add_option("--known", options->known,
                      "--target: a folder of known findings (case files with their manifests; default "
                      "seeds/real where it exists): a failure repeating one of the release's is counted as "
                      "known, not shrunk, not counted towards --max-failures, and exits 0");
  command->add_flag("--no-known", options->no_known, "--target: count every failure as new");
  add_backend_flags(*command);
  add_target_flags(*command, options->target);
  command->add_option("--world", options->world,
                      "--target: the world of every case (the worker's ranks); --max-world is "
                      "for the model target")
      ->check(whole_number(1, 1 << 16))
      ->capture_default_str();
  command->callback([options, &context] { run_fuzz(*options, context); });
}

}  // namespace tally::cli
