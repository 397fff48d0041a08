// A real target: a real framework's worker executes tally's cases with the framework's own code
// and writes per-rank manifests, which the one judge reads (oracle/judge.h), as `tally check`
// does. The worker is a process group that stays up across cases (torchrun and its ranks, started
// from a command line), one per world size, and speaks files in a queue folder
// (docs/real-targets.md):
//
//   tally  -> worker  case-<K>.engine.json     the framework's configuration, where tally writes it
//                                              (run/target.h: DeepSpeed's deepspeed.initialize)
//                     case-<K>.json            the case (casefile/case_file.h), K = 1, 2, ...
//                     case-<K>.gradients.json  every logical param: name, shape, offset into
//                     case-<K>.gradients.f32   the values tally's generator gives it (float32,
//                                              little-endian, row-major), so the framework holds
//                                              exactly the gradients the truth is made of
//                     case-<K>.shares-<N>.f32  where the worker runs the framework's own reduction:
//                                              each rank's share of every gradient, for a group of
//                                              N ranks (run/contributions.h)
//                     stop                     the worker exits
//   worker -> tally   hello.json               framework, version, world, once it is up
//                                              (run/worker_files.h reads it and the result)
//                     case-<K>/                the manifests of case K (docs/manifest.md)
//                     case-<K>.result.json     {"status": "ok" | "error", "message": ...}, last
// A case's faults are planted in the framework at run time by the worker, for that case only
// (hello.json lists those it can plant).
//
// Every file is written to a temporary name and renamed, so neither side reads a partial one;
// tally reads only regular files of the queue (a FIFO there would block it). The worker is told
// tally's process id and exits when tally is gone, also in the middle of a case.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "casefile/case.h"
#include "oracle/verdict.h"
#include "run/contributions.h"
#include "run/worker_files.h"

namespace tally::run {

struct SentRequest;  // run/target_run.h

// How a worker's answer is judged: the folder of manifests its run of `c` left, and the request it
// answered. The target supplies it (run/target.cpp: as a run of the case, run/target_run.h); the
// pool only carries the case to the worker and the answer back.
using WorkerJudge = std::function<oracle::Verdict(const casefile::Case& c, const std::string& manifests, const SentRequest& sent)>;

struct WorkerOptions {
  // The command that starts a worker; "{world}" is replaced by the case's world, and tally
  // appends `--queue DIR --parent-pid PID`. Run by /bin/sh.
  std::string command;
  // Where the queue folders go; empty: a fresh folder under the system's temporary folder,
  // removed when the pool is destroyed.
  std::string work_dir;
  double start_seconds = 900;  // until hello.json (imports, process groups)
  double case_seconds = 300;   // until a case's result
  double stop_seconds = 10;    // until a worker asked to stop (or retiring) ends by itself
  WorkerJudge judge;  // required: WorkerPool refuses options without one
  // The case settings a worker's hello may say it cannot run on its machine (FrameworkTarget::cannot_run).
  std::vector<std::string_view> cannot_run_settings;
  bool keep_passing = false;   // keep the manifests of passing runs too (else only failing ones)
  std::ostream* progress = nullptr;  // one line per worker started or lost
  // The configuration sent with each case as case-<K>.engine.json (run/target.h); none when it
  // returns nullopt or is empty.
  std::function<std::optional<std::string>(const casefile::Case&)> engine_config;
  // The framework's reduction groups of a case, whose shares of every gradient are sent with it
  // (run/contributions.h); none when it returns nullopt.
  std::function<std::optional<ReductionGroups>(const casefile::Case&)> reduction_groups;
};

// One case executed by a worker and judged (WorkerOptions::judge).
struct WorkerRun {
  oracle::Verdict verdict;
  std::string manifests;  // the folder of the run's manifests; empty when it wrote none
  double seconds = 0.0;   // from the request to the result, judging excluded
};

// The logical gradients of a case, as the request files hold them.
struct LogicalGradients {
  // The request's identity (16 hex digits): a digest of the case as sent, the index and the values.
  // It is in the index, and every rank's manifest of the run must echo it.
  std::string case_digest;
  std::string index_json;     // case-<K>.gradients.json
  std::vector<float> values;  // case-<K>.gradients.f32, in the index's order
  // With `reduction`: each group size's shares of every value (run/contributions.h), sent as
  // case-<K>.shares-<N>.f32; the index says the sizes, the divisor and how many were given whole.
  std::map<int, DealtShares> shares;
};
// `reduction`: where the worker runs the framework's own reduction, the groups its contributions
// are dealt over (the index's `shares`, left out of the digest as derived from the case).
LogicalGradients logical_gradients(const casefile::Case& c, const std::optional<ReductionGroups>& reduction = std::nullopt);

// Replaces every "{world}" in `command`.
std::string worker_command_for(const std::string& command, int world);

// Workers by world, started on first use and stopped (asked, then killed) on destruction. Not
// thread-safe: one case at a time.
class WorkerPool {
 public:
  // Throws std::invalid_argument when `options` has no judge.
  explicit WorkerPool(WorkerOptions options);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // The worker of `world`, started if needed. Throws std::runtime_error when it cannot start:
  // the message holds the end of its log.
  const WorkerHello& hello(int world);

  // Executes `c` on the worker of its world. A worker that reports an error, dies or exceeds
  // case_seconds gives an infra-error verdict naming it (a dead or late worker is restarted for
  // the next case). The manifests of a run that did not pass stay until the pool is destroyed.
  WorkerRun execute(const casefile::Case& c);

  // The folder of the most recent failing run of `c` (its manifests), if any.
  std::optional<std::string> manifests_of(const casefile::Case& c) const;

 private:
  struct Worker;
  Worker& worker(int world);
  // Asks the worker to exit (a stop file) and waits a while for it, unless `ask` is false; then
  // tells its launcher to terminate, and after a short grace kills every process left of it
  // (run/process_tree.h: ranks in sessions of their own too). Says how it ended.
  enum class Ended { by_itself, terminated, killed };
  Ended stop(Worker& w, bool ask = true);
  // Where the worker wrote `retiring` before the result of `after_case`: says so on the progress
  // stream and waits for it to exit (then stops it), so the next case starts a fresh worker.
  void retire_if_asked(Worker& w, const std::string& after_case);
  // The end of a worker's log for an infrastructure error's message;
  // the pool then keeps its temporary folder, so the log the message names outlives tally.
  std::string kept_log_tail(const Worker& w);

  WorkerOptions options_;
  std::string root_;
  bool own_root_ = false;
  bool keep_root_ = false;  // an infrastructure error named a log in root_
  std::map<int, std::unique_ptr<Worker>> workers_;
  std::map<std::string, std::string> failing_runs_;  // canonical case text -> manifests folder
};


}  // namespace tally::run
