#include "kernels/clip_scale.h"

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace tally::kernels {

std::vector<float> clip_scale_cpu(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                                  const ClipSpec& clip) {
  std::int64_t total = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (auto error = check_shard(shards[i]))
      throw std::invalid_argument("clip_scale_cpu: shard " + std::to_string(i) + " (param " +
                                  std::to_string(shards[i].param_id) + "): " + *error);
    total += visited_numel(shards[i]);
  }
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(total));
  for (const ShardDesc& shard : shards) {
    // The box with leading dimensions of size 1 up to kMaxDims (a scalar is one element).
    std::array<std::int64_t, kMaxDims> shape{1, 1, 1, 1}, offset{}, extent{1, 1, 1, 1};
    const int pad = kMaxDims - shard.ndim;
    for (int d = 0; d < shard.ndim; ++d) {
      shape[pad + d] = shard.shape[d];
      offset[pad + d] = shard.offset[d];
      extent[pad + d] = shard.extent[d];
    }
    const std::int64_t begin = shard.range ? shard.range->begin : 0;
    const std::int64_t end = shard.range ? shard.range->end : box_numel(shard);
    const std::uint64_t key = stream_key(gen.seed, shard.param_id);
    for (std::int64_t r = begin; r < end; ++r) {
      std::int64_t rest = r, logical = 0, stride = 1;
      for (int d = kMaxDims - 1; d >= 0; --d) {
        logical += (offset[d] + rest % extent[d]) * stride;
        rest /= extent[d];
        stride *= shape[d];
      }
      const float g = stored_value(gen.mode, gen.dtype, key, static_cast<std::uint64_t>(logical));
      out.push_back(clip.store_as ? apply_clip(g, clip.coefficient, *clip.store_as)
                                  : apply_clip(g, clip.coefficient));
    }
  }
  return out;
}

}  // namespace tally::kernels
