// The nccl backend's communicator: one process per GPU under mpirun, k virtual ranks per GPU.
// No CUDA or NCCL types in this header (the CPU-only build compiles it); the implementation
// exists only where tally was configured with CUDA and NCCL (TALLY_HAVE_NCCL), see
// nccl_available(). Needs the mpi backend's MpiSession for the unique id and the job's shape.
//
// Process p drives GPU p % (visible devices) and the ranks [p*k, (p+1)*k) of the layout.
// all_reduce(rank, ...) accumulates the contributions of the group's members on this process,
// in group order (like sim). When the last local member of a group has arrived:
//   - a group whose members all live on this process is complete (no NCCL call);
//   - otherwise the local partial waits for end_phase(), which issues every partial's NCCL
//     all-reduce (ncclFloat64 / ncclInt64, ncclSum / ncclMax) in one canonical global order
//     (family, group index, sequence) inside one ncclGroupStart/End, on device buffers (one
//     host-to-device copy, one device-to-host copy), then copies the result to every local
//     member's buffer.
// NCCL communicators: a group's cross-GPU reduction runs among the processes that hold its
// members, so communicators are keyed by that process set, created once (ncclCommSplit of the
// world communicator, collective over every process, in the same order everywhere) and cached
// for the life of the job: many configurations share them (with 2 GPUs there is exactly one,
// the world communicator). Communicators are non-blocking (ncclConfig_t blocking = 0); every
// wait polls ncclCommGetAsyncError / cudaEventQuery against the timeout, so a member that never
// joins becomes InfraError naming the collective (after ncclCommAbort), never a hung job.
//
// Determinism contract: FIXED ORDER within a process (group order over the local members);
// across GPUs NCCL's order, which for a given topology and NCCL version is fixed run to run
// (with 2 GPUs a single a + b, commutative). So: the same bits run to run; bit for bit equal to
// sim wherever every partial sum is exact (the exact gradient modes, the integer counts and
// every max); in random modes within the tolerance bound (a sum over n contributions grouped
// differently has at most n - 1 roundings, as sim's). A max of doubles goes through ncclMax as a
// packed buffer (comm/communicator.h, pack_for_max), so NaN propagates exactly as in sim.
//
// Errors: every CUDA and NCCL call is checked (TALLY_CUDA_CHECK / TALLY_NCCL_CHECK in the
// implementation) and a failure throws InfraError naming the call, file:line, the process's
// MPI rank and the library's message.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "comm/communicator.h"

namespace tally::comm {

class MpiSession;

// Whether this build has the nccl backend.
bool nccl_available();

struct NcclOptions {
  int ranks_per_gpu = 1;  // k: process p runs ranks [p*k, (p+1)*k)
  // A wait on NCCL longer than this is a hang: InfraError. Default: half the session's
  // timeout, so the process stuck in NCCL names the collective before a process waiting for
  // results (MpiSession's watchdog) gives up.
  double timeout_seconds = 0.0;
  // Blocking NCCL communicators (ncclConfig_t blocking = 1), for comparison in benchmarks: a
  // hang inside a collective is still caught (the wait polls the stream), but one inside
  // communicator creation is not. Default: non-blocking.
  bool blocking = false;
};

// Counters, for benchmarks and tests.
struct NcclStats {
  std::int64_t phases = 0;            // end_phase calls that issued NCCL work
  std::int64_t nccl_all_reduces = 0;  // ncclAllReduce calls issued
  std::int64_t local_only = 0;        // collectives completed without NCCL
  int communicators = 0;              // NCCL communicators held (the world one included)
};

class NcclCommunicator final : public Communicator {
 public:
  // Collective over every process of the session: picks the device, creates the world NCCL
  // communicator (unique id from MPI rank 0). Throws InfraError on a CUDA/NCCL failure.
  NcclCommunicator(const MpiSession& session, NcclOptions options);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Sets the layout of the next collectives and creates the NCCL communicators that the groups
  // of `families` need and that do not exist yet. Collective: every process calls it with the
  // same layout and families, in the same order. The layout must outlive its use, and its world
  // must be processes * k (InfraError otherwise: the caller checks the case first).
  void configure(const topologies::RankLayout& layout,
                 std::span<const topologies::Family> families);

  // The ranks this process runs: [p*k, (p+1)*k).
  std::span<const int> local_ranks() const;
  int device() const;
  int ranks_per_gpu() const;
  NcclStats stats() const;

  void all_reduce(int rank, const Group& group, std::span<double> values, ReduceOp op,
                  std::string_view label) override;
  void all_reduce(int rank, const Group& group, std::span<std::int64_t> values, ReduceOp op,
                  std::string_view label) override;
  void end_phase() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tally::comm
