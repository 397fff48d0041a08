#include "cli/target_flags.h"

#include <filesystem>
#include <system_error>

#include "cli/campaign_output.h"
#include "cli/commands.h"
#include "cli/usage_error.h"
#include "run/deepspeed_target.h"
#include "run/megatron_core_target.h"

namespace tally::cli {

namespace fs = std::filesystem;

void add_target_flags(CLI::App& command, TargetOptions& options) {
  command
      .add_option("--target", options.target,
                  "What executes the cases: model (tally's own model of the grad-norm path), "
                  "megatron-core or deepspeed (the real framework, unmodified, through its worker: "
                  "adapters/megatron, adapters/deepspeed; docs/real-targets.md)")
      ->check(CLI::IsMember({"model", "megatron-core", "deepspeed"}))
      ->default_str("model");
  command
      .add_option("--worker", options.worker,
                  "--target: the command that starts a worker of {world} ranks; tally appends "
                  "--queue DIR --parent-pid PID. Default: " + std::string(kDefaultMegatronWorker) +
                  " (megatron-core), " + kDefaultDeepSpeedWorker + " (deepspeed)")
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

std::string default_worker(const std::string& target) {
  return target == "deepspeed" ? kDefaultDeepSpeedWorker : kDefaultMegatronWorker;
}

std::optional<std::string> unsupported_on(const std::string& framework, const casefile::Case& c,
                                          std::string_view version) {
  if (framework == "deepspeed") return run::deepspeed_unsupported(c, version);
  return run::megatron_core_unsupported(c, version);
}

std::optional<std::string> unsupported_on(const casefile::Case& c, const run::WorkerHello& hello) {
  if (hello.framework == "deepspeed")
    return run::deepspeed_unsupported(c, hello.version, hello.plants, hello.dtypes, hello.megatron_model_rules);
  return run::megatron_core_unsupported(c, hello.version, hello.plants);
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
  if (hello.framework == "deepspeed") {
    // The DeepSpeed configuration is drawn from the case's own gradient seed, so the generator's
    // stream of cases, and a shrink's, stay reproducible from the campaign seed.
    generator.restrict_to = [version = hello.version, plants = hello.plants, dtypes = hello.dtypes,
                             megatron_model_rules = hello.megatron_model_rules](casefile::Case c) {
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return run::within_deepspeed(std::move(c), version, plants, draw, dtypes, megatron_model_rules);
    };
    return;
  }
  generator.restrict_to = [version = hello.version, plants = hello.plants](casefile::Case c) {
    return run::within_megatron_core(std::move(c), version, plants);
  };
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
