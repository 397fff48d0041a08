// The mpi backend: one process per rank. MPI types stay out of this header so code that only
// names the backend builds without MPI; everything here exists only when tally was configured
// with MPI (TALLY_HAVE_MPI), see mpi_available().
//
// Determinism: MPI_Allreduce's summation order is the MPI library's; with the exact gradient
// modes every sum is exact, so verdicts are bit-identical to `sim`; in random modes they agree
// within the derived bound (a sum over G ranks in any order has at most G - 1 roundings).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace tally::comm {

// Whether this build has the mpi backend.
bool mpi_available();

// The exit code of every process of a job that end_job ends: the CLI's kExitInfra
// (cli/usage_error.h), an infrastructure failure.
inline constexpr int kJobEndedExitCode = 3;

struct MpiOptions {
  double timeout_seconds = 60.0;  // a collective waiting longer is a hang: InfraError
};

// The process's MPI environment: MPI_Init on construction (InfraError when it fails; it asks for
// MPI_THREAD_MULTIPLE, see blocking_call), MPI_Finalize on destruction, after a barrier under the
// watchdog (a missing process ends the job instead of blocking MPI_Finalize). Collectives here
// (broadcast, gather) run under the same watchdog as the communicator's: waiting longer than
// the timeout throws InfraError.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv, MpiOptions options);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const MpiOptions& options() const { return options_; }

  // `bytes` of `root` to every process (others' `bytes` are replaced). `patient`: wait without
  // a deadline (a rank waiting for rank 0's next case while rank 0 writes files or shrinks).
  void broadcast(std::string& bytes, int root, const std::string& what, bool patient = false) const;
  // Every process's `bytes`, in rank order, on `root` (empty elsewhere).
  std::vector<std::string> gather(const std::string& bytes, int root, const std::string& what) const;
  // Runs `call`, a blocking MPI call that has no non-blocking form (MPI_Comm_split), under the
  // watchdog: a member stopped inside it would block every other member forever, so a guard
  // thread ends the job (end_job) when it has not returned within the timeout. `what` names
  // the call; a failing return code is InfraError.
  void blocking_call(const std::string& what, const std::function<int()>& call) const;
  // The one way out of a hang or of any failure that leaves other processes waiting: flushes
  // stdout, prints "tally: rank <r>: infrastructure failure: <what>" as one line on stderr and
  // ends every process of the job with kJobEndedExitCode (MPI_Abort). Never returns. Callable
  // from any thread.
  [[noreturn]] void end_job(std::string_view what) const;

 private:
  MpiOptions options_;
  int rank_ = 0;
  int size_ = 1;
  // Whether threads other than the session's may call MPI (MPI_THREAD_MULTIPLE), as the guard
  // of blocking_call does to end the job.
  bool thread_multiple_ = false;
  std::thread::id owner_;
};

// One MPI communicator per group family in `families` (MPI_Comm_split of the world, all created
// when constructed: a collective over every process, in the same order everywhere, so a rank
// that later skips a reduction cannot leave the others blocked in a split). Each split runs as
// a session blocking_call: a member that never completes it ends the job. all_reduce blocks
// until the collective completes, or throws InfraError when it has waited longer than the
// session's timeout; a reduction over a family not created is a programming error.
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const topologies::RankLayout& layout, const MpiSession& session,
                  std::span<const topologies::Family> families);
  ~MpiCommunicator() override;
  // Creates the communicators of `families` not yet created (collective, like the constructor).
  void add_families(std::span<const topologies::Family> families);

  void all_reduce(int rank, const Group& group, std::span<double> values, ReduceOp op,
                  std::string_view label) override;
  void all_reduce(int rank, const Group& group, std::span<std::int64_t> values, ReduceOp op,
                  std::string_view label) override;
  void end_phase() override {}

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tally::comm
