// What `tally fuzz` and `tally mutants` share: stopping on Ctrl-C between cases, durations on the
// command line, and how cases and rates are written in their reports.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "cli/commands.h"
#include "fuzz/campaign.h"
#include "fuzz/shrink.h"
#include "topologies/parallel_config.h"

namespace tally::cli {

// While in scope, SIGINT and SIGTERM set a flag instead of ending the process: the case in
// progress finishes (a shrink in progress writes what it has), then the summary. A second signal
// ends the process as usual.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
  const std::atomic<bool>* flag() const;
  bool interrupted() const;

 private:
  void (*previous_int_)(int) = nullptr;
  void (*previous_term_)(int) = nullptr;
};

// A duration (cli/number_flags.h) in seconds. Throws UsageError naming `flag`.
double parse_duration(const std::string& text, const std::string& flag);

std::string seconds_text(double seconds);              // "12.3s"
std::string rate_text(std::int64_t cases, double seconds);  // cases per second, "4123"
// "world 2 (tp 2, ep 2, etp 1)": the axes that are not 1, and the order when not the default.
std::string world_text(const topologies::ParallelConfig& c);
// "gpt, 1 layer, 2 experts: 31 params, 412 elements" or "custom: 1 param, 3 elements".
std::string model_text(const casefile::Case& c);
// `text` with `prefix` before every line.
std::string indent(const std::string& text, const std::string& prefix);

// The line that says where a campaign stopped at an infrastructure error and why ("infrastructure
// error at case 3: megatron-core worker (world 2): the worker exited during case-1"), then the
// rest of its message (a worker's log tail) indented, and where the case and message were saved.
std::string infra_stop_text(const fuzz::InfraStop& stop);
// The same as JSON: case, while_shrinking, call, message, saved case and message file (null
// without a corpus).
nlohmann::ordered_json infra_stop_json(const fuzz::InfraStop& stop);

}  // namespace tally::cli
