// TALLY_CUDA_CHECK(call): a CUDA runtime call that must succeed. On failure it throws
// kernels::CudaError naming the call, file:line and CUDA's own name and message for the error
//; never compiled out. For CUDA translation units only (it needs cudaError_t).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/local_stats_cuda.h"

namespace tally::kernels::detail {

inline std::string cuda_error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

inline void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw CudaError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                  cuda_error_text(status));
}

}  // namespace tally::kernels::detail

#define TALLY_CUDA_CHECK(call) \
  ::tally::kernels::detail::cuda_check((call), #call, __FILE__, __LINE__)
