// A target: what executes a case. tally's own model of the grad-norm path (over the sim, mpi or
// nccl backend), or a real framework, unmodified, through its worker (run/framework_worker.h).
// The commands and campaigns hold a Target and never ask which kind it is: opening it for a
// world says what it can do there, it refuses a case with a reason, it restricts a generated
// case (and each shrink) to what it runs, and it executes a case and returns what the run left.
//
// The real targets are one table: a row per framework holds everything tally knows of it (its
// name, the command that starts its worker, the case space its worker builds, the case section
// it owns, the engine configuration sent with each case). Adding a framework is a folder
// run/<framework>/ and one row (docs/architecture.md).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "vocab/faults.h"
#include "oracle/verdict.h"
#include "record/run_record.h"
#include "run/backend.h"
#include "run/framework_worker.h"

namespace tally::run {

// ---- A target.

// A target that cannot be opened (a worker that never started, or one that says it is another
// framework): an infrastructure failure, exit code 3, never a verdict.
class TargetUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a target opened for a world runs.
struct TargetAbilities {
  std::string name;     // "model", or a framework's: as --target names it
  std::string version;  // the framework's release ("0.19.2"); tally's own for its model
  // The one world its cases have; 0: each case brings its own (the model target on sim).
  int world = 0;
  // The catalog faults it can switch on, each with how, and the others with why not.
  FaultPlants plants;
  // A real framework, unmodified: it may miscount with no fault planted, a run costs seconds,
  // and a run that gives no verdict is its machinery failing (a worker), not what the case does.
  bool framework = false;
};

// What a run of a case left.
struct TargetRun {
  oracle::Verdict verdict;
  std::optional<record::RunRecord> record;  // the model target's, when execute was asked to keep it
  std::string manifests;  // a real target's manifest folder; "" when it wrote none
  std::string how;        // how the verdict came about, where not by tally's model ("re-executed by ...")
};

class Target {
 public:
  virtual ~Target() = default;

  // "model", or the framework's name.
  virtual std::string_view name() const = 0;

  // A real framework (TargetAbilities::framework), known before it opens.
  virtual bool framework() const = 0;

  // Opens the target for cases of `world` (a real target starts that world's worker, once) and
  // says what it runs there. Throws TargetUnavailable.
  virtual const TargetAbilities& open(int world) = 0;

  // Why no release of the target runs `c`, known before it opens (no worker is started); nullopt
  // when one may. One line naming the field and the rule.
  virtual std::optional<std::string> refusal_before_open(const casefile::Case& c) const = 0;

  // Why the target, opened for c's world (opening it), does not run `c`: its release's rules and
  // the faults it plants. Throws TargetUnavailable, and NotRunnableHere where `c` does not fit an
  // mpi or nccl job's world.
  virtual std::optional<std::string> refusal(const casefile::Case& c) = 0;

  // Whether a run that hangs ends the whole job rather than giving a verdict (tally's model on an
  // mpi or nccl job: the watchdog ends every process), so a case expecting a hang would end the
  // cases after it too.
  virtual bool hang_ends_the_job() const { return false; }

  // Whether `refusal` and `execute` may be called from several threads at once (tally's model on
  // sim); a real framework's worker runs one case at a time.
  virtual bool runs_cases_side_by_side() const { return false; }

  // `c` within what the target, opened for c's world, runs: each generated case and each shrink
  // candidate. Throws TargetUnavailable.
  virtual casefile::Case within(casefile::Case c) = 0;

  // A case given by flags, as the target runs it (DeepSpeed: its section with its defaults).
  virtual casefile::Case from_flags(casefile::Case c) const = 0;

  // The cases a sweep runs for one layout and model (`base`: the plain optimizer, fp32 gradients,
  // clipping at 1): one per value of the target's own axis, each named ("layerwise", "zero2-bf16").
  virtual std::vector<std::pair<std::string, casefile::Case>> sweep_variants(const casefile::Case& base) const = 0;

  // Why a run's manifests cannot be written out (`tally run --manifests`: "needs ..."); nullopt
  // when they can.
  virtual std::optional<std::string> manifests_refusal() const = 0;

  // Runs `c`, which the target opened for its world does not refuse. `keep_record`: the model
  // target keeps the run's record (what its manifests are written from). Throws
  // casefile::InvalidCase and TargetUnavailable (a worker that could not be restarted).
  virtual TargetRun execute(const casefile::Case& c, bool keep_record) = 0;

  // The framework and release that run `c`, as a case file names them (its target section,
  // without manifests); nullopt for tally's model. Opens c's world. Throws TargetUnavailable.
  virtual std::optional<casefile::RealTarget> release_of(const casefile::Case& c) = 0;

  // The folder of the manifests of the target's most recent failing (or kept) run of `c`; nullopt
  // where it kept none (tally's model keeps none: its manifests are written from its record).
  virtual std::optional<std::string> evidence_of(const casefile::Case& c) const = 0;
};

// The target section of `c` saved as a case file at `case_path` ("" when it is not saved): the
// framework and release (release_of), and the manifests of its most recent failing (or kept) run
// (evidence_of) copied next to the file as `<case>.manifests`. nullopt for tally's model. Throws
// std::runtime_error when the copy fails.
std::optional<casefile::RealTarget> saved_section(Target& target, const casefile::Case& c, const std::string& case_path);

// tally's model of the path, run on `backend` (which must outlive it).
std::unique_ptr<Target> model_target(Backend& backend);

// ---- The real targets' table.

// A row, its fields named where it is written (designated initializers): run/<framework>/target_row.cpp.
struct FrameworkTarget {
  std::string_view name;            // as --target, a case file's target.framework and a worker's hello name it
  std::string_view default_worker;  // run by /bin/sh with {world} replaced (tally appends --queue, --parent-pid)
  // Its case section, the settings only it reads (run/<framework>/section.h): the key ("" for none),
  // the strict reader giving its canonical JSON, and whether its worker builds models of its own
  // (casefile::FrameworkSection::own_models). The case reader knows sections only through these.
  std::string_view section;
  nlohmann::ordered_json (*read_section)(const nlohmann::json& value, const std::string& path) = nullptr;
  bool own_models = false;
  // The case settings its worker may say, in its hello, it cannot run on its machine (an op that
  // did not build): the rows' refusals name them with the worker's reason.
  std::span<const std::string_view> cannot_run = {};
  // Why the worker that said `hello` cannot execute `c` (one line naming the field and the rule);
  // nullopt when it can.
  std::optional<std::string> (*refusal)(const casefile::Case& c, const WorkerHello& hello);
  // The same before any worker is up, for the release `version` (""; the rules of every release).
  std::optional<std::string> (*refusal_at_release)(const casefile::Case& c, std::string_view version);
  // `c` within what the worker of `hello` builds: generated cases and every shrink candidate.
  casefile::Case (*within)(casefile::Case c, const WorkerHello& hello);
  // A case given by flags, as this framework runs it (DeepSpeed: its section with its defaults).
  casefile::Case (*from_flags)(casefile::Case c);
  // The case section only this framework reads, where `c` holds one, as one line naming it and
  // the target that runs it ("deepspeed: a DeepSpeed case (...); run it with --target deepspeed"):
  // what makes `c` this framework's case without a target section, and what every other target
  // refuses (other_frameworks_section reads the table, so a framework's section is stated once).
  std::optional<std::string> (*own_section)(const casefile::Case& c);
  // The configuration the worker builds the framework with, sent with each case
  // (`case-<K>.engine.json`) and printed by `tally show`; nullopt: the worker derives it all from
  // the case (megatron-core: `tally show` prints Megatron-LM's flags instead).
  std::optional<nlohmann::ordered_json> (*engine_config)(const casefile::Case& c);
  // One line of what the worker gives the framework, for `tally show` ("" for none).
  std::string (*model_description)(const casefile::Case& c);
  // A sweep's cases of one layout and model (Target::sweep_variants).
  std::vector<std::pair<std::string, casefile::Case>> (*sweep_variants)(const casefile::Case& base);
  // The framework's code that computes `c`'s norm ("layerwise", "DeepSpeedZeroOptimizer"): what a
  // known finding is tied to (fuzz/known.h), so a defect found again on that code is known.
  std::string (*norm_code)(const casefile::Case& c);
  // `c` as tally's model of the release `version` runs it (the release's own rules as catalog
  // faults, gradnorm/releases.h), without its target section; nullopt where tally has no model of
  // that release. A sweep holds the release's verdict against it, and the known findings take
  // their corners from it (fuzz/known.h). nullptr: tally models no release of this framework.
  std::optional<casefile::Case> (*release_model_case)(const casefile::Case& c, std::string_view version) = nullptr;
  // Where the worker runs the framework's own reduction of the gradients: its reduction groups for
  // `c`, whose shares of every gradient are sent with the case (run/contributions.h); nullptr or
  // nullopt: the worker sets the reduced gradients itself.
  std::optional<ReductionGroups> (*reduction_groups)(const casefile::Case& c) = nullptr;
};

// Whether `c`'s gradients enter before the own reduction of the framework named `framework` (its
// row's reduction_groups; false for a framework whose worker sets them reduced), or, for "model",
// before tally's model of Megatron's reduction (gradnorm/reduction.h).
bool gradients_enter_before_reduction(std::string_view framework, const casefile::Case& c);

// Every real target, in the order --help lists them: each row is defined in its framework's folder
// (run/<framework>/target_row.cpp) and listed in run/target.cpp.
std::span<const FrameworkTarget* const> framework_targets();

// What the case reader knows of the real frameworks (each row's name and section): what every
// command that reads or writes a case file passes to casefile's reader.
casefile::FrameworkSchemas case_frameworks();

// The row of `name`; nullptr when tally has none.
const FrameworkTarget* framework_target(std::string_view name);

// The framework a case belongs to: its target section's, else the one whose section it holds;
// nullptr for a case of tally's model.
const FrameworkTarget* framework_of(const casefile::Case& c);

// Why `framework` does not run `c`: it holds what only another framework runs (that framework's
// row's own_section: its case section, megatron-core's layer-wise parameter layout), as one line
// naming the target that does; nullopt when none.
std::optional<std::string> other_frameworks_section(const casefile::Case& c, std::string_view framework);

// "megatron-core, deepspeed, torchtitan": the names, for messages and --help.
std::string framework_names(std::string_view separator = ", ");

// The framework of `row` through the workers of `options` (its command, timeouts, folder; the
// engine configuration is the row's). Throws std::runtime_error when the work folder cannot be
// made.
std::unique_ptr<Target> framework_target(const FrameworkTarget& row, WorkerOptions options);

// `base` under each of tally's optimizer models, named by them ("plain", "distributed", ...): the
// sweep axis of tally's model and of megatron-core.
std::vector<std::pair<std::string, casefile::Case>> optimizer_variants(const casefile::Case& base);

// `base` with its gradients before Megatron's reduction, run by DDP's all-reduce and by the
// distributed optimizer's: the sweep variants "plain-unreduced" and "distributed-unreduced".
std::vector<std::pair<std::string, casefile::Case>> unreduced_variants(const casefile::Case& base);

// Why a worker cannot plant fault `name` (its own reason, where it gives one); nullopt when it can.
std::optional<std::string> why_not_planted(const std::string& name, const FaultPlants& plants);

// "name (why)" for each of `faults` that `plants` cannot plant, joined by "; " ("" when it plants all).
std::string unplantable(const vocab::FaultSet& faults, const FaultPlants& plants);

}  // namespace tally::run
