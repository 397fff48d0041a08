// The documents a framework's worker writes and tally reads (docs/real-targets.md, "The queue
// folder"): hello.json and case-<K>.result.json. Read as strictly as every other input of tally:
// an unknown key, a wrong type or a value out of range is an error naming the field and the rule,
// so a field one side adds that the other does not know fails at once instead of being ignored.
// docs/schemas/hello.schema.json and result.schema.json describe the same documents; the tests
// (tests/run/border_schemas_test.cpp) hold these readers and the schemas to each other.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tally::run {

// The catalog faults a worker can plant in its framework at run time (the real mutation score),
// each with how; and the others with why not.
struct FaultPlants {
  std::map<std::string, std::string> planted;      // fault name -> what the worker replaces
  std::map<std::string, std::string> not_planted;  // fault name -> why it has no counterpart
};

// What a worker says once it is up.
struct WorkerHello {
  std::string framework;  // "megatron-core"
  std::string version;    // "0.19.2"
  std::string producer;   // the manifests' producer line
  int world = 0;
  FaultPlants plants;
  // The gradient dtypes the framework computes in on this machine ("fp32", "bf16", "fp16");
  // empty: every one (DeepSpeed's CPU accelerator has no fp16 on CPUs without it).
  std::vector<std::string> dtypes;
  // The worker builds models under Megatron-LM's build-time rules (hello "model_rules":
  // "megatron"): a stand-in executing cases with tally's own model. A real DeepSpeed worker takes
  // models Megatron refuses (expert biases with expert TP).
  bool megatron_model_rules = false;
  // Case settings the framework cannot run on this machine (hello "cannot_run", e.g.
  // DeepSpeed's FusedAdam where its op did not build: the settings its row's cannot_run names), each with why.
  std::map<std::string, std::string> cannot_run;
  // Where the worker runs, for the log: its torch.distributed backend ("nccl", "gloo") and the
  // GPUs its ranks see; empty and absent when it does not say.
  std::string backend;
  std::optional<int> devices;
};

// A worker's outcome of one case.
struct WorkerResult {
  bool ok = false;                // "status": "ok"; else "error" or "refused"
  // "status": "refused": the framework declined the case while it set it up, with a check of its
  // own (tally_adapters.queue.framework_setup); `message` is the framework's.
  bool refused = false;
  std::string message;            // the first failing rank's message; empty when ok
  std::optional<double> seconds;  // the worker's own measure of the case
};

// Why a "refused" result cannot be taken as the framework's own check declining the case: its
// message must name the framework's exception and say what it said ("rank 0: ValueError: ...", the
// form tally_adapters.queue.framework_setup gives). nullopt when it does.
std::optional<std::string> refusal_not_the_frameworks(std::string_view message);

// The largest hello.json, case-<K>.result.json and retiring read.
inline constexpr std::size_t kMaxHelloBytes = std::size_t{1} << 20;
inline constexpr std::size_t kMaxResultBytes = std::size_t{4} << 20;
inline constexpr std::size_t kMaxRetiringBytes = std::size_t{64} << 10;

// hello.json's text. `cannot_run_settings`: the case settings its "cannot_run" may name (the
// framework's row says them, run/target.h). Throws std::invalid_argument, one line naming the field
// and the rule ("hello.world: expected a positive integer, got 2.5").
WorkerHello read_hello(std::string_view text, std::span<const std::string_view> cannot_run_settings);

// case-<K>.result.json's text. Throws std::invalid_argument, one line naming the field and the
// rule ("result.status: expected one of ok, error, got \"done\"").
WorkerResult read_result(std::string_view text);

}  // namespace tally::run
