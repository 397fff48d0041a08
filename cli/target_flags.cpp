#include "cli/target_flags.h"

#include <filesystem>

#include "cli/campaign_output.h"
#include "cli/commands.h"
#include "cli/usage_error.h"
#include "fuzz/generators.h"

namespace tally::cli {

void add_target_flags(CLI::App& command, TargetOptions& options) {
  std::vector<std::string> choices{"model"};
  std::string workers;
  for (const run::FrameworkTarget* row : run::framework_targets()) {
    const run::FrameworkTarget& t = *row;
    choices.emplace_back(t.name);
    workers += (workers.empty() ? "" : ", ") + std::string(t.default_worker) + " (" + std::string(t.name) + ")";
  }
  command
      .add_option("--target", options.target,
                  "What executes the cases: model (tally's own model of the grad-norm path), or a real "
                  "framework, unmodified, through its worker (" + run::framework_names() +
                      "; adapters/, docs/real-targets.md)")
      ->check(CLI::IsMember(choices))
      ->default_str("model");
  command
      .add_option("--worker", options.worker,
                  "--target: the command that starts a worker of {world} ranks; tally appends "
                  "--queue DIR --parent-pid PID. Default: " + workers)
      ->type_name("COMMAND");
  command
      .add_option("--case-timeout", options.case_timeout,
                  "--target: how long one case may take before its worker is stopped (an "
                  "infra-error); s, m, h suffixes")
      ->type_name("DURATION")
      ->default_str("5m");
  command
      .add_option("--start-timeout", options.start_timeout,
                  "--target: how long a worker may take to start (imports, process groups)")
      ->type_name("DURATION")
      ->default_str("15m");
  command.add_option("--worker-dir", options.work_dir,
                     "--target: the folder for the workers' queues and logs (default: a temporary "
                     "folder, removed at the end unless an error names a log in it)");
}

std::unique_ptr<run::Target> chosen_target(const TargetOptions& options, run::Backend& backend, std::ostream& progress,
                                           bool keep_manifests) {
  const run::FrameworkTarget* row = run::framework_target(options.target);
  if (!row) {
    if (options.target != "model")
      throw UsageError("--target " + options.target + ": tally has no such target (model, " + run::framework_names() +
                       ")");
    return run::model_target(backend);
  }
  if (backend.name() != "sim")
    throw UsageError("--target " + options.target + " runs the framework's own ranks; --backend " +
                     std::string(backend.name()) + " is for tally's model (leave it out)");
  const std::string command = options.worker.empty() ? std::string(row->default_worker) : options.worker;
  if (command.find("{world}") == std::string::npos)
    throw UsageError("--worker must start {world} ranks (got " + shell_quote(command) + ", which has no {world})");
  run::WorkerOptions w;
  w.command = command;
  w.work_dir = options.work_dir;
  w.case_seconds = parse_duration(options.case_timeout, "--case-timeout");
  w.start_seconds = parse_duration(options.start_timeout, "--start-timeout");
  w.keep_passing = keep_manifests;
  w.progress = &progress;
  try {
    return run::framework_target(*row, std::move(w));
  } catch (const std::exception& error) {
    throw UsageError(std::string("--worker-dir: ") + error.what());
  }
}

const run::TargetAbilities* open_or_report(run::Target& target, int world, std::ostream& err) {
  try {
    return &target.open(world);
  } catch (const run::TargetUnavailable& error) {
    err << "tally: error: " << error.what() << '\n';
    return nullptr;
  }
}

std::string target_flags_text(const TargetOptions& options, int world) {
  const TargetOptions defaults;
  std::string out;
  if (options.target != defaults.target) out += " --target " + options.target;
  if (world > 0) out += " --world " + std::to_string(world);
  if (!options.worker.empty()) out += " --worker " + shell_quote(options.worker);
  if (options.case_timeout != defaults.case_timeout) out += " --case-timeout " + shell_quote(options.case_timeout);
  if (options.start_timeout != defaults.start_timeout) out += " --start-timeout " + shell_quote(options.start_timeout);
  return out;
}

std::vector<fuzz::KnownFinding> known_findings(const run::TargetAbilities& opened, const std::string& dir, bool none,
                                               std::ostream* progress) {
  if (!opened.framework || none) return {};
  const std::string folder = !dir.empty() ? dir : std::filesystem::is_directory("seeds/real") ? "seeds/real" : "";
  if (folder.empty()) return {};
  std::vector<fuzz::KnownFinding> known;
  try {
    known = fuzz::load_known(folder, opened.name, opened.version);
  } catch (const std::exception& error) {
    throw UsageError(error.what());
  }
  if (progress)
    *progress << "known findings: " << known.size() << " of " << opened.name << " " << opened.version << " in "
              << folder << '\n';
  return known;
}

void add_norm_code_flag(CLI::App& command, std::string& norm_code) {
  command.add_option("--norm-code", norm_code,
                     "Only cases whose norm is computed by code named this or starting with its words, as a "
                     "campaign's `cases by norm code` names them: megatron-fsdp, megatron-fsdp no_shard, "
                     "layerwise, distributed ... (the optimizer model on tally's model); the generator gives up "
                     "on one it never draws");
}

int report_generation_failure(const rc::GenerationFailure& failure, const std::string& norm_code, std::ostream& err) {
  if (norm_code.empty()) {
    err << "tally: error: " << failure.what() << '\n';
    return kExitInfra;
  }
  err << "tally: error: --norm-code '" << norm_code << "': no case of that norm code in " << fuzz::kKeepOnlyDraws
      << " generated in a row; the codes a real campaign draws are in its summary's `cases by norm code` (the "
         "optimizer model on tally's model)\n";
  return kExitBadInput;
}

}  // namespace tally::cli
