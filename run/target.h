// The real targets: one row per framework tally executes cases on through its worker
// (run/framework_worker.h). A row holds everything tally knows of the framework: its name, the
// command that starts its worker, the case space its worker builds (refusals naming the rule,
// and the restriction of generated cases and shrinks to it), the case section it owns, and the
// engine configuration sent with each case. cli/ reads the table and names no framework; adding
// a framework is a folder run/<framework>/ and one row here (docs/architecture.md).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "run/framework_worker.h"

namespace tally::run {

struct FrameworkTarget {
  std::string_view name;            // as --target, a case file's target.framework and a worker's hello name it
  std::string_view default_worker;  // run by /bin/sh with {world} replaced (tally appends --queue, --parent-pid)
  // Why the worker that said `hello` cannot execute `c` (one line naming the field and the rule);
  // nullopt when it can.
  std::optional<std::string> (*unsupported)(const casefile::Case& c, const WorkerHello& hello);
  // The same before any worker is up, for the release `version` (""; the rules of every release).
  std::optional<std::string> (*unsupported_at)(const casefile::Case& c, std::string_view version);
  // `c` within what the worker of `hello` builds: generated cases and every shrink candidate.
  casefile::Case (*within)(casefile::Case c, const WorkerHello& hello);
  // A case given by flags, as this framework runs it (DeepSpeed: its section with its defaults).
  casefile::Case (*from_flags)(casefile::Case c);
  // Whether `c` is this framework's case without a target section (DeepSpeed: its section).
  bool (*owns)(const casefile::Case& c);
  // The configuration the worker builds the framework with, sent with each case
  // (`case-<K>.engine.json`) and printed by `tally show`; nullopt: the worker derives it all from
  // the case (megatron-core: `tally show` prints Megatron-LM's flags instead).
  std::optional<nlohmann::ordered_json> (*engine_config)(const casefile::Case& c);
  // One line of what the worker gives the framework, for `tally show` ("" for none).
  std::string (*model_description)(const casefile::Case& c);
};

// Every real target, in the order --help lists them.
std::span<const FrameworkTarget> framework_targets();

// The row of `name`; nullptr when tally has none.
const FrameworkTarget* framework_target(std::string_view name);

// The framework a case belongs to: its target section's, else the one whose section it holds;
// nullptr for a case of tally's model.
const FrameworkTarget* framework_of(const casefile::Case& c);

// "megatron-core, deepspeed": the names, for messages and --help.
std::string framework_names(std::string_view separator = ", ");

}  // namespace tally::run
