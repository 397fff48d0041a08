// Where a case's ranks run: all in this process (`sim`), one process per rank under mpirun
// (`mpi`), or one process per GPU with k ranks each (`nccl`). The commands that run cases (run, replay, fuzz, mutants) take a Backend and never
// know which; with mpi only rank 0 runs the command and the other ranks serve its cases.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "casefile/case.h"
#include "oracle/judge.h"
#include "oracle/verdict.h"

#include "kernels/clip_scale.h"
#include "kernels/local_stats.h"
#include "topologies/rank_layout.h"

namespace tally::comm {
class Communicator;
class MpiSession;
class MpiCommunicator;
}  // namespace tally::comm

namespace tally::run {

// The rank layout of the last configuration an mpi or nccl job ran.
struct MpiConfigCache;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // The one world this backend runs (a job's process count times its ranks per process), or
  // 0 when every case brings its own (sim).
  virtual int world() const { return 0; }
  // Why `c` does not fit this backend (an mpi job whose size is not the case's world); nullopt
  // when it does.
  virtual std::optional<std::string> misfit(const casefile::Case& /*c*/) const { return std::nullopt; }
  // Whether `run` may be called from several threads at once (sim: a case is a pure function of
  // itself; mpi and nccl: every process serves the cases in one order).
  virtual bool runs_cases_side_by_side() const { return false; }
  // Runs `c` on every rank of its topology and judges it. Throws casefile::InvalidCase when the case is
  // invalid, and NotRunnableHere when it does not fit the backend (misfit).
  virtual oracle::Verdict run(const casefile::Case& c, const oracle::JudgeOptions& judge) = 0;
};

class SimBackend final : public Backend {
 public:
  std::string_view name() const override { return "sim"; }
  bool runs_cases_side_by_side() const override { return true; }
  oracle::Verdict run(const casefile::Case& c, const oracle::JudgeOptions& judge) override;
};

// A case whose world does not fit the job it was given to (an mpi job of another size, an nccl
// job of another G * k). Bad input for `tally run`; `tally replay` reports the case as not
// runnable on this job instead of failing.
class NotRunnableHere : public casefile::InvalidCase {
 public:
  using casefile::InvalidCase::InvalidCase;
};

// How the processes of an MPI job run a case's ranks: process p runs the ranks
// [p*k, (p+1)*k) (k = ranks_per_process) over the communicator prepared for the case's
// configuration, with the engine's local-statistics function. mpi: one rank per process, MPI
// communicators, the CPU kernels. nccl: k ranks per GPU, NCCL (comm/nccl_communicator.h), the
// CUDA kernels.
class RankEngine {
 public:
  virtual ~RankEngine() = default;
  virtual std::string_view name() const = 0;
  virtual int ranks_per_process() const = 0;
  // The communicator for `layout` reducing over the groups of `families`. Collective: every
  // process calls it for every case, in the same order, with the same arguments. `new_layout`:
  // `layout` differs from the previous call's (which may since have been destroyed).
  virtual comm::Communicator& prepare(const topologies::RankLayout& layout, bool new_layout,
                                      std::span<const topologies::Family> families) = 0;
  virtual kernels::LocalStatsFn local_stats() const = 0;
  virtual kernels::ClipScaleFn clip_scale() const = 0;
};

// The mpi engine (TALLY_HAVE_MPI builds).
std::unique_ptr<RankEngine> make_mpi_engine(const comm::MpiSession& session);
// Whether this build has the nccl engine; the reason when not.
bool nccl_engine_available(std::string* why);
// The nccl engine (TALLY_HAVE_NCCL builds; throws std::runtime_error elsewhere). Collective:
// creates the world NCCL communicator; a failure there (a watchdog expiry, a CUDA or NCCL
// error) ends the job (comm::MpiSession::end_job).
std::unique_ptr<RankEngine> make_nccl_engine(const comm::MpiSession& session, int ranks_per_gpu);

// Runs on rank 0 of an MPI job (TALLY_HAVE_MPI builds only): broadcasts each case to the
// other processes, runs rank 0's part, gathers every rank's result and judges. A failure from
// the broadcast to the gather (a watchdog expiry, an MPI error) never reaches the command: it
// ends the whole job (comm::MpiSession::end_job: exit code 3 and one line naming what waited).
// The engine says how many ranks each process runs and over what (default: mpi).
class MpiBackend final : public Backend {
 public:
  explicit MpiBackend(const comm::MpiSession& session);
  MpiBackend(const comm::MpiSession& session, std::unique_ptr<RankEngine> engine);
  ~MpiBackend() override;
  std::string_view name() const override;
  int world() const override;
  std::optional<std::string> misfit(const casefile::Case& c) const override;
  oracle::Verdict run(const casefile::Case& c, const oracle::JudgeOptions& judge) override;
  // Tells the other ranks to stop serving and to exit with `exit_code` (a failure ends the job).
  void finish(int exit_code);
  RankEngine& engine() { return *engine_; }

 private:
  const comm::MpiSession& session_;
  std::unique_ptr<RankEngine> engine_;
  std::unique_ptr<MpiConfigCache> cached_;
};

// The loop of processes 1..N-1: run the cases rank 0 broadcasts until it finishes; returns the
// exit code rank 0 finished with, so every process of the job exits alike; any failure on the
// way ends the job (comm::MpiSession::end_job). `engine` must be the same kind as rank 0's
// (default: mpi).
int serve_mpi_cases(const comm::MpiSession& session);
int serve_mpi_cases(const comm::MpiSession& session, RankEngine& engine);

}  // namespace tally::run
