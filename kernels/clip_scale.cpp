#include "kernels/clip_scale.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/detail/shard_runs.h"

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
  std::vector<float> out(static_cast<std::size_t>(total));
  float* next = out.data();
  for (const ShardDesc& shard : shards) {
    const std::uint64_t key = stream_key(gen.seed, shard.param_id);
    if (states_values(gen)) {
      detail::for_each_run(shard, [&](std::uint64_t first, std::int64_t count) {
        for (std::int64_t k = 0; k < count; ++k) {
          const float g = stated_value(gen, key, first + static_cast<std::uint64_t>(k));
          *next++ = clip.store_as ? apply_clip(g, clip.coefficient, *clip.store_as)
                                  : apply_clip(g, clip.coefficient);
        }
      });
      continue;
    }
    detail::with_mode_and_dtype(gen.mode, gen.dtype, [&]<GradientMode M, Dtype D>() {
      detail::for_each_run(shard, [&](std::uint64_t first, std::int64_t count) {
        for (std::int64_t k = 0; k < count; ++k) {
          const float g = stored_value<M, D>(key, first + static_cast<std::uint64_t>(k));
          *next++ = clip.store_as ? apply_clip(g, clip.coefficient, *clip.store_as)
                                  : apply_clip(g, clip.coefficient);
        }
      });
    });
  }
  return out;
}

}  // namespace tally::kernels
