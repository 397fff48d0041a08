// --target, --worker, --case-timeout, --start-timeout and --worker-dir: what executes the cases,
// tally's model of the path or a real framework through its worker (run/target.h). Shared by run,
// replay, fuzz and mutants.
#pragma once

#include <CLI/CLI.hpp>
#include <rapidcheck.h>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "fuzz/known.h"
#include "run/backend.h"
#include "run/target.h"

namespace tally::cli {

struct TargetOptions {
  std::string target = "model";  // model, or a real target's name (run/target.h)
  std::string worker;            // --worker; empty: the target's own (default_worker)
  std::string case_timeout = "5m";
  std::string start_timeout = "15m";
  std::string work_dir;  // --worker-dir; empty: a temporary folder
};

void add_target_flags(CLI::App& command, TargetOptions& options);

// The target --target names: tally's model on `backend`, or a framework through its workers
// (`keep_manifests`: the manifests of passing runs are kept too, for --manifests and --save).
// Throws UsageError when the flags contradict each other (a framework on a backend other than
// sim, a --worker without {world}, a --worker-dir that cannot be made).
std::unique_ptr<run::Target> chosen_target(const TargetOptions& options, run::Backend& backend, std::ostream& progress,
                                           bool keep_manifests = false);

// `target` opened for `world`; nullptr after writing why it could not be opened to `err` (the
// command then exits 3).
const run::TargetAbilities* open_or_report(run::Target& target, int world, std::ostream& err);

// The flags that repeat `options` where they are not the defaults (" --target deepspeed --world 4
// --worker ..."; `world` 0: no --world), for a campaign's repeat line.
std::string target_flags_text(const TargetOptions& options, int world);

// The known findings (fuzz/known.h) of the opened target's release, for --known DIR and --no-known:
// none for tally's model or with `none`; from `dir`, or seeds/real where it exists when `dir` is
// "". Says how many on `progress` unless it is nullptr. Throws UsageError naming the folder.
std::vector<fuzz::KnownFinding> known_findings(const run::TargetAbilities& opened, const std::string& dir, bool none,
                                               std::ostream* progress);

// --norm-code, for fuzz and mutants: only the cases of one norm code (fuzz::norm_code_filter).
void add_norm_code_flag(CLI::App& command, std::string& norm_code);

// A campaign's generator that gave up (rc::GenerationFailure), written to `err`: with a
// --norm-code, a code the target never (or hardly ever) draws, exit 2; else the generator's own
// error, exit 3. Returns the exit code.
int report_generation_failure(const rc::GenerationFailure& failure, const std::string& norm_code, std::ostream& err);

}  // namespace tally::cli
