// The stored gradient values of a run of consecutive logical elements, from the generator (the
// one input the oracle shares with the path under test), the mode and dtype resolved once per
// run rather than per element.
#pragma once

#include <cstdint>

#include "kernels/gradient_generator.h"

namespace tally::oracle::detail {

template <kernels::GradientMode M, kernels::Dtype D, class T>
void fill_stored(T* out, std::int64_t n, std::uint64_t key, std::int64_t first) {
  for (std::int64_t j = 0; j < n; ++j)
    out[j] = static_cast<T>(kernels::stored_value<M, D>(key, static_cast<std::uint64_t>(first + j)));
}

template <kernels::GradientMode M, class T>
void fill_stored(T* out, std::int64_t n, kernels::Dtype dtype, std::uint64_t key, std::int64_t first) {
  switch (dtype) {
    case kernels::Dtype::fp32: return fill_stored<M, kernels::Dtype::fp32>(out, n, key, first);
    case kernels::Dtype::bf16: return fill_stored<M, kernels::Dtype::bf16>(out, n, key, first);
    case kernels::Dtype::fp16: return fill_stored<M, kernels::Dtype::fp16>(out, n, key, first);
  }
}

// out[j] = the stored value of element first + j of the stream `key`, j < n.
template <class T>
void fill_stored(T* out, std::int64_t n, const kernels::GeneratorSpec& spec, std::uint64_t key,
                 std::int64_t first) {
  using kernels::GradientMode;
  if (kernels::states_values(spec)) {
    for (std::int64_t j = 0; j < n; ++j)
      out[j] = static_cast<T>(kernels::stated_value(spec, key, static_cast<std::uint64_t>(first + j)));
    return;
  }
  switch (spec.mode) {
    case GradientMode::ones: return fill_stored<GradientMode::ones>(out, n, spec.dtype, key, first);
    case GradientMode::zeros: return fill_stored<GradientMode::zeros>(out, n, spec.dtype, key, first);
    case GradientMode::dyadic: return fill_stored<GradientMode::dyadic>(out, n, spec.dtype, key, first);
    case GradientMode::uniform: return fill_stored<GradientMode::uniform>(out, n, spec.dtype, key, first);
    case GradientMode::normal: return fill_stored<GradientMode::normal>(out, n, spec.dtype, key, first);
    case GradientMode::sparse: return fill_stored<GradientMode::sparse>(out, n, spec.dtype, key, first);
    case GradientMode::rank_encoded:
      return fill_stored<GradientMode::rank_encoded>(out, n, spec.dtype, key, first);
  }
}

}  // namespace tally::oracle::detail
