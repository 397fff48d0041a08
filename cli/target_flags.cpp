#include "cli/target_flags.h"

#include <filesystem>
#include <system_error>

#include "cli/campaign_output.h"
#include "cli/commands.h"
#include "cli/usage_error.h"
#include "run/target.h"

namespace tally::cli {

namespace fs = std::filesystem;

void add_target_flags(CLI::App& command, TargetOptions& options) {
  std::vector<std::string> choices{"model"};
  std::string workers;
  for (const run::FrameworkTarget& t : run::framework_targets()) {
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

const run::FrameworkTarget& framework_row(const std::string& target) {
  const run::FrameworkTarget* row = run::framework_target(target);
  if (!row) throw UsageError("--target " + target + ": tally has no such target (" + run::framework_names() + ")");
  return *row;
}

std::string default_worker(const std::string& target) { return std::string(framework_row(target).default_worker); }

std::optional<std::string> unsupported_on(const std::string& framework, const casefile::Case& c,
                                          std::string_view version) {
  return framework_row(framework).unsupported_at(c, version);
}

std::optional<std::string> unsupported_on(const casefile::Case& c, const run::WorkerHello& hello) {
  const run::FrameworkTarget* row = run::framework_target(hello.framework);
  if (!row)
    return "the worker says it is " + hello.framework + ", which tally has no target for (" + run::framework_names() +
           ")";
  return row->unsupported(c, hello);
}

std::unique_ptr<run::WorkerPool> worker_pool(const TargetOptions& options, const std::string& backend,
                                             std::ostream& progress, bool keep_manifests) {
  if (!options.real()) return nullptr;
  if (backend != "sim")
    throw UsageError("--target " + options.target + " runs the framework's own ranks; --backend " + backend +
                     " is for tally's model (leave it out)");
  const std::string command = options.worker.empty() ? default_worker(options.target) : options.worker;
  if (command.find("{world}") == std::string::npos)
    throw UsageError("--worker must start {world} ranks (got " + shell_quote(command) +
                     ", which has no {world})");
  run::WorkerOptions w;
  w.command = command;
  w.work_dir = options.work_dir;
  w.case_seconds = parse_duration(options.case_timeout, "--case-timeout");
  w.start_seconds = parse_duration(options.start_timeout, "--start-timeout");
  w.keep_passing = keep_manifests;
  w.progress = &progress;
  w.engine_config = [row = &framework_row(options.target)](const casefile::Case& c) -> std::optional<std::string> {
    std::optional<nlohmann::ordered_json> config = row->engine_config(c);
    if (!config) return std::nullopt;
    return config->dump(2) + "\n";
  };
  try {
    return std::make_unique<run::WorkerPool>(std::move(w));
  } catch (const std::exception& error) {
    throw UsageError(std::string("--worker-dir: ") + error.what());
  }
}

TargetRun run_on_target(run::WorkerPool& pool, const casefile::Case& c) {
  TargetRun out;
  const run::WorkerHello& hello = pool.hello(c.topology.world);
  out.unsupported = unsupported_on(c, hello);
  if (!out.unsupported) out.run = pool.execute(c);
  return out;
}

std::optional<run::WorkerHello> first_hello(run::WorkerPool& pool, int world, std::ostream& err) {
  try {
    return pool.hello(world);
  } catch (const std::exception& error) {
    err << "tally: error: " << error.what() << '\n';
    return std::nullopt;
  }
}

void aim_at_target(fuzz::CaseGenOptions& generator, const run::WorkerHello& hello) {
  generator.topology.exact_world = hello.world;
  generator.topology.max_world = hello.world;
  generator.topology.avoid_megatron_corners = false;
  generator.gpt_only = true;
  const run::FrameworkTarget* row = run::framework_target(hello.framework);
  if (!row) return;  // every case is refused, naming the worker's framework (unsupported_on)
  generator.restrict_to = [row, hello](casefile::Case c) { return row->within(std::move(c), hello); };
}

fuzz::CaseRunner target_runner(run::WorkerPool& pool) {
  return [&pool](const casefile::Case& c) {
    TargetRun r = run_on_target(pool, c);
    if (!r.unsupported) return r.run.verdict;
    oracle::Verdict refused;
    refused.kind = oracle::Verdict::Kind::infra_error;
    refused.infra_call = pool.hello(c.topology.world).framework + " target";
    refused.infra_message = *r.unsupported;
    return refused;
  };
}

casefile::RealTarget target_of(run::WorkerPool& pool, const casefile::Case& c, const std::string& case_path) {
  const run::WorkerHello& hello = pool.hello(c.topology.world);
  casefile::RealTarget target{hello.framework, hello.version, ""};
  const std::optional<std::string> manifests = pool.manifests_of(c);
  if (case_path.empty() || !manifests) return target;
  fs::path file(case_path);
  fs::path saved = file;
  saved.replace_extension(".manifests");
  std::error_code error;
  fs::remove_all(saved, error);
  fs::create_directories(saved, error);
  if (!error) fs::copy(*manifests, saved, fs::copy_options::recursive | fs::copy_options::overwrite_existing, error);
  if (error) throw std::runtime_error("cannot save the manifests of " + case_path + " in " + saved.string() + ": " + error.message());
  target.manifests = saved.filename().string();
  return target;
}

}  // namespace tally::cli
