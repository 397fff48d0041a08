// The nccl engine of the process backend (run/backend.h): one process per GPU, k ranks each,
// NCCL reductions (comm/nccl_communicator.h) and the CUDA local statistics. Built with
// TALLY_HAVE_MPI; without TALLY_HAVE_NCCL it only says why it is not there.
#include <stdexcept>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "run/backend.h"
#include "kernels/local_stats_cuda.h"

namespace tally::run {

namespace {

#if TALLY_HAVE_NCCL
// One NcclCommunicator for the whole job: its NCCL communicators are keyed by process set and
// shared by every configuration; configure() only adds the missing ones.
class NcclEngine final : public RankEngine {
 public:
  NcclEngine(const comm::MpiSession& session, int ranks_per_gpu)
      : communicator_(session, comm::NcclOptions{ranks_per_gpu, 0.0, false}) {}
  std::string_view name() const override { return "nccl"; }
  int ranks_per_process() const override { return communicator_.ranks_per_gpu(); }
  comm::Communicator& prepare(const topologies::RankLayout& layout, bool,
                              std::span<const topologies::Family> families) override {
    communicator_.configure(layout, families);
    return communicator_;
  }
  kernels::LocalStatsFn local_stats() const override { return kernels::local_stats_cuda; }
  kernels::ClipScaleFn clip_scale() const override { return kernels::clip_scale_cuda; }

 private:
  comm::NcclCommunicator communicator_;
};
#endif

}  // namespace

bool nccl_engine_available(std::string* why) {
#if TALLY_HAVE_NCCL
  // A build with the backend on a machine without a usable GPU (CI's): say so before MPI starts.
  std::string reason;
  if (!kernels::cuda_device_available(&reason)) {
    if (why) *why = "no usable CUDA device here (" + reason + ")";
    return false;
  }
  return true;
#else
  if (why) *why = "this tally was built without the nccl backend (needs CUDA, MPI and NCCL; "
                  "configure with -DTALLY_ENABLE_NCCL=ON)";
  return false;
#endif
}

std::unique_ptr<RankEngine> make_nccl_engine(const comm::MpiSession& session, int ranks_per_gpu) {
#if TALLY_HAVE_NCCL
  // Every process creates it together: one that fails leaves the others waiting.
  try {
    return std::make_unique<NcclEngine>(session, ranks_per_gpu);
  } catch (const std::exception& error) {
    session.end_job(error.what());
  }
#else
  (void)session, (void)ranks_per_gpu;
  std::string why;
  nccl_engine_available(&why);
  throw std::runtime_error(why);
#endif
}

}  // namespace tally::run
