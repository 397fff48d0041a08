// --target, --worker, --case-timeout, --start-timeout and --worker-dir: cases executed by a real framework (its worker,
// run/framework_worker.h) instead of tally's model of the path. Shared by run, replay, fuzz.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "casefile/case.h"
#include "fuzz/generators.h"
#include "fuzz/shrink.h"
#include "run/framework_worker.h"

namespace tally::cli {

struct TargetOptions {
  std::string target = "model";  // model, or a real target's name (run/target.h)
  std::string worker;            // --worker; empty: the target's own (default_worker)
  std::string case_timeout = "5m";
  std::string start_timeout = "15m";
  std::string work_dir;  // --worker-dir; empty: a temporary folder
  bool real() const { return target != "model"; }
};

void add_target_flags(CLI::App& command, TargetOptions& options);

// The command that starts a worker of `target` when --worker is not given (run/target.h).
std::string default_worker(const std::string& target);

// Why the worker of `framework` at `version` cannot execute `c` (its row of run/target.h); nullopt
// when it can.
std::optional<std::string> unsupported_on(const std::string& framework, const casefile::Case& c,
                                          std::string_view version);
std::optional<std::string> unsupported_on(const casefile::Case& c, const run::WorkerHello& hello);

// The pool of --target's workers, or nullptr for the model target. Throws UsageError when the
// target flags contradict the others (`backend` other than sim, faults asked).
std::unique_ptr<run::WorkerPool> worker_pool(const TargetOptions& options, const std::string& backend,
                                             std::ostream& progress, bool keep_manifests = false);

// Executes `c` on the pool's worker of its world, or refuses it (returns the reason) when the
// framework at the worker's version cannot build it.
struct TargetRun {
  std::optional<std::string> unsupported;
  run::WorkerRun run;
};
TargetRun run_on_target(run::WorkerPool& pool, const casefile::Case& c);

// The hello of `pool`'s worker for `world`, starting it; nullopt after writing why it could not
// start to `err` (the command then exits 3).
std::optional<run::WorkerHello> first_hello(run::WorkerPool& pool, int world, std::ostream& err);

// Points a campaign's generator at the worker that said `hello`: every case of its world, within
// what its release builds and the faults it plants, Megatron's layout corners included (finding
// miscounts there is what a real campaign is for).
void aim_at_target(fuzz::CaseGenOptions& generator, const run::WorkerHello& hello);

// Runs generated cases on `pool`. A case outside the worker's limits is an infra-error: the
// generator's restriction (aim_at_target) should have kept it out, so it is a bug of tally.
fuzz::CaseRunner target_runner(run::WorkerPool& pool);

// The case as a real target's case file holds it: the framework and version of `pool`'s worker for
// the case's world, and the run's manifests copied to `<case file without .json>.manifests/`
// when `case_path` is not empty and the pool kept them.
casefile::RealTarget target_of(run::WorkerPool& pool, const casefile::Case& c, const std::string& case_path);

}  // namespace tally::cli
