#include "kernels/clip_scale.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>
#include "tests/support/shards.h"

namespace tally::kernels {
namespace {

using testing::box;

// Shards in input order, each in row-major box order narrowed to its range; every value is
// apply_clip of the stored gradient value.
TEST(ClipScale, EachVisitedElementInOrderIsApplyClip) {
  const std::vector<ShardDesc> shards = {
      box(0, {6, 5}, {1, 2}, {4, 3}),  // rows of 3
      box(1, {2, 3, 4, 5}, {1, 0, 1, 2}, {1, 3, 2, 3}, ElementRange{4, 15}),
      box(2, {}, {}, {}),              // a scalar
      box(3, {4, 0}, {0, 0}, {4, 0}),  // no elements
  };
  // The visited logical indices, written out by hand.
  std::vector<std::pair<std::uint64_t, std::int64_t>> order;
  for (std::int64_t r = 1; r < 5; ++r)
    for (std::int64_t c = 2; c < 5; ++c) order.emplace_back(0, r * 5 + c);
  std::vector<std::int64_t> box1;
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t c = 1; c < 3; ++c)
      for (std::int64_t d = 2; d < 5; ++d) box1.push_back(((1 * 3 + b) * 4 + c) * 5 + d);
  for (std::int64_t v = 4; v < 15; ++v) order.emplace_back(1, box1[v]);
  order.emplace_back(2, 0);

  for (GradientMode mode : {GradientMode::normal, GradientMode::dyadic, GradientMode::uniform}) {
    for (std::optional<Dtype> store : {std::optional<Dtype>{}, std::optional<Dtype>{Dtype::bf16},
                                       std::optional<Dtype>{Dtype::fp16}}) {
      const GeneratorSpec gen{42, mode, Dtype::bf16};
      const ClipSpec clip{0.3f, store};
      const std::vector<float> got = clip_scale_cpu(shards, gen, clip);
      ASSERT_EQ(got.size(), order.size());
      for (std::size_t i = 0; i < order.size(); ++i) {
        const float g = gradient_value(gen, order[i].first, order[i].second);
        const float want = store ? apply_clip(g, 0.3f, *store) : apply_clip(g, 0.3f);
        EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want)) << i;
      }
    }
  }
  EXPECT_TRUE(clip_scale_cpu({}, {1, GradientMode::ones, Dtype::fp32}, ClipSpec{}).empty());
}

TEST(ClipScale, InvalidShardThrows) {
  const std::vector<ShardDesc> bad = {box(0, {4, 5}, {0, 0}, {4, 5}, ElementRange{3, 21})};
  EXPECT_THROW(clip_scale_cpu(bad, {1, GradientMode::ones, Dtype::fp32}, ClipSpec{}),
               std::invalid_argument);
}

}  // namespace
}  // namespace tally::kernels
