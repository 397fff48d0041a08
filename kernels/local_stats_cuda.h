// CUDA twins of local_stats_cpu (kernels/local_stats.h) and clip_scale_cpu (kernels/clip_scale.h):
// the same signatures (LocalStatsFn, ClipScaleFn), the same contracts, gradient values generated
// on the device by kernels/gradient_generator.h (no gradient is copied to the device). No CUDA
// types here, so CPU-only code includes this header; a build without CUDA links a stand-in
// (local_stats_cuda_unavailable.cpp) whose cuda_device_available says why and whose functions
// throw CudaError. Both functions use the calling thread's current CUDA device and block until
// their results are on the host.
//
// One call = one host-to-device copy (the shard descriptors, the (shard, chunk) work list and the
// statistics wanted), two launches that cover all shards, one device-to-host copy:
//   1. chunk pass: a group of kStatsLanes = 8 consecutive threads per (shard, chunk, statistic);
//      thread l sums the terms of the chunk's elements with v % 8 == l in increasing v, starting
//      from +0; three butterfly shuffles form ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7));
//      the chunk's sum goes to a buffer. The statistics (squares, then each p) are the grid's y
//      dimension. abs-max and the zero count are per chunk (exact).
//   2. shard pass: one thread per (shard, statistic) adds the shard's chunk sums in chunk order,
//      starting from +0.
//   3. on the host: the shard sums are added in input order, starting from +0, in the
//      accumulation type: local_stats.h's step 4, the CPU's own code path.
// Every product and sum is one correctly rounded operation (__fmul_rn, __dadd_rn, ..., and the file
// is compiled with --fmad=false), so the order is local_stats.h's documented one, step for step.
//
// Determinism contract: FIXED ORDER. Same inputs, same bits, run to run and on any grid (the order
// does not depend on the launch shape or on timing: no atomics on floating-point values).
// Agreement with local_stats_cpu: BIT FOR BIT in every gradient mode, dtype and accumulation for
// the sum of squares, integer p in [1, 8], abs-max, the zero count and the element count. The one
// exception is a p-sum for non-integer p: its term is pow(|g|, p) (CUDA's pow, 2 ulp, for fp64;
// for fp32 CUDA's double pow of the widened operands rounded once to float) against the host
// library's pow/powf (glibc: under 1 ulp), so individual terms may differ by a few ulp; the sums
// still follow the same order, and tests/kernels/local_stats_gpu_test.cpp checks them against the
// bound that this implies.
//
// Errors: std::invalid_argument for invalid input (as local_stats_cpu, checked on the host before
// anything touches the device); CudaError for any failing CUDA call, naming the call, file:line
// and CUDA's message. Sizes: at most 2^31 - 1 chunks of kStatsChunk elements per call for the
// statistics, 2^31 - 1 chunks for clip_scale_cuda (its output lives in host memory).
#pragma once

#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/clip_scale.h"
#include "kernels/gradient_generator.h"
#include "kernels/local_stats.h"

namespace tally::kernels {

// A CUDA runtime failure (never a statistic that differs): the harness reports it as an
// infrastructure error.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// True when this build has the CUDA kernels and the current process sees a CUDA device that can
// run them; otherwise false, with the reason in *why (when why is not null): no CUDA in this build,
// no device, a driver error, or a device the kernels were not built for.
bool cuda_device_available(std::string* why);

LocalStats local_stats_cuda(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                            const StatsOptions& options);

// The clipped values are computed into a device buffer and copied back.
std::vector<float> clip_scale_cuda(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                                   const ClipSpec& clip);

}  // namespace tally::kernels
