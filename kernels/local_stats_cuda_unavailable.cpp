// The stand-in for kernels/local_stats.cu in a build without CUDA (TALLY_HAVE_CUDA off): the API
// exists, says why it cannot run, and throws if called anyway.
#include "kernels/local_stats_cuda.h"

namespace tally::kernels {
namespace {
constexpr const char* kReason =
    "tally was built without CUDA (TALLY_ENABLE_CUDA=OFF, or no CUDA compiler at configure time)";
}

bool cuda_device_available(std::string* why) {
  if (why) *why = kReason;
  return false;
}

LocalStats local_stats_cuda(std::span<const ShardDesc>, const GeneratorSpec&, const StatsOptions&) {
  throw CudaError(std::string("local_stats_cuda: ") + kReason);
}

std::vector<float> clip_scale_cuda(std::span<const ShardDesc>, const GeneratorSpec&,
                                   const ClipSpec&) {
  throw CudaError(std::string("clip_scale_cuda: ") + kReason);
}

}  // namespace tally::kernels
