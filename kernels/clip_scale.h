// Clipped gradient values of one rank's shards: kernels::apply_clip (below) applied to the
// stored value of every visited element, for the later check of clipped gradients. clip_scale_cpu
// is the CPU implementation; clip_scale_cuda (kernels/local_stats_cuda.h) is its CUDA twin with
// the same signature (ClipScaleFn) and contract.
//
// Contract. The result holds one float per visited element: the shards in input order, each in
// its visited order (local_stats.h: the box's row-major order, narrowed to the range), so element
// v of shard s is at (sum of visited_numel of the shards before s) + v. Its value is
// apply_clip(gradient_value(gen, param_id, i), coefficient) or, with store_as set,
// apply_clip(gradient_value(...), coefficient, *store_as): one fp32 product, no FMA, then (with
// store_as) one rounding to that dtype, widened back to float. Every element is computed on its
// own, so the result is exact and independent of any order: implementations agree bit for bit.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "kernels/gradient_generator.h"
#include "kernels/local_stats.h"

namespace tally::kernels {

// Clipping as Megatron-LM's clip_grad_by_total_norm_fp32 applies it: multi_tensor_scale computes
// float(grad) * scale in fp32 with a float scale (a Python-float coefficient enters as
// static_cast<float>), rounded once, no FMA. The second form stores the result back in the
// gradient's dtype (bf16 decoupled_grad), rounded to nearest even.
TALLY_HOST_DEVICE inline float apply_clip(float stored_grad, float coefficient) {
  return detail::mulf(stored_grad, coefficient);
}
TALLY_HOST_DEVICE inline float apply_clip(float stored_grad, float coefficient, Dtype storage) {
  return round_to(static_cast<double>(apply_clip(stored_grad, coefficient)), storage);
}


struct ClipSpec {
  float coefficient = 1.0f;       // the clip coefficient as Megatron-LM passes it (a float)
  std::optional<Dtype> store_as;  // absent: the fp32 product itself
  friend bool operator==(const ClipSpec&, const ClipSpec&) = default;
};

using ClipScaleFn = std::vector<float> (*)(std::span<const ShardDesc> shards,
                                           const GeneratorSpec& gen, const ClipSpec& clip);

// Throws std::invalid_argument (naming the shard and check_shard's message) for an invalid shard.
std::vector<float> clip_scale_cpu(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                                  const ClipSpec& clip);

}  // namespace tally::kernels
