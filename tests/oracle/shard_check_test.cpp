#include "oracle/shard_check.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/model_gen.h"
#include "topologies/rank_layout.h"

namespace tally::oracle {
namespace {

using kernels::Dtype;
using kernels::GeneratorSpec;
using kernels::GradientMode;
using kernels::ShardDesc;
using topologies::CustomParam;
using topologies::LocalParam;
using topologies::LogicalModel;
using topologies::ModelKind;
using topologies::ModelSpec;
using topologies::ParamClass;
using topologies::RankLayout;
using topologies::Slice;

// Distinct values, so a wrong index reads a different value; uniform is the cheapest such mode.
const GeneratorSpec kSpec{17, GradientMode::uniform, Dtype::fp32};

ModelSpec one_param(std::vector<std::int64_t> shape) {
  ModelSpec s;
  s.kind = ModelKind::custom;
  CustomParam p;
  p.name = "t";
  p.param_class = ParamClass::replicated;
  p.shape = std::move(shape);
  s.params = {p};
  return s;
}

LocalParam local(int id, std::vector<std::int64_t> offset, std::vector<std::int64_t> extent) {
  LocalParam p;
  p.logical_id = id;
  p.slice.rank = static_cast<int>(offset.size());
  for (std::size_t d = 0; d < offset.size(); ++d) {
    p.slice.offset[d] = offset[d];
    p.slice.extent[d] = extent[d];
  }
  return p;
}

ShardDesc desc_of(const LogicalModel& model, const LocalParam& p) {
  ShardDesc s;
  const topologies::Shape& shape = model.param(p.logical_id).shape;
  s.param_id = static_cast<std::uint64_t>(p.logical_id);
  s.ndim = shape.rank;
  for (int d = 0; d < shape.rank; ++d) {
    s.shape[d] = shape.dims[d];
    s.offset[d] = p.slice.offset[d];
    s.extent[d] = p.slice.extent[d];
  }
  return s;
}

RC_GTEST_PROP(ShardCheck, EveryRankOfRandomValidCasesReadsItsEigenBlock, ()) {
  const auto [config, spec] = *tally::testing::valid_case(3);
  const LogicalModel model(spec, config);
  const RankLayout layout(config);
  std::vector<LocalParam> locals;
  for (int rank = 0; rank < layout.world(); ++rank) {
    topologies::local_params(model, layout, rank, locals);
    const std::optional<ShardMismatch> m = verify_shards(model, kSpec, locals);
    RC_ASSERT(!m.has_value());
    // The descriptors the kernels would get, each narrowed to a random range.
    for (const LocalParam& p : locals) {
      ShardDesc d = desc_of(model, p);
      const std::int64_t n = p.slice.numel();
      const std::int64_t begin = *rc::gen::inRange<std::int64_t>(0, n + 1);
      d.range = kernels::ElementRange{begin, *rc::gen::inRange<std::int64_t>(begin, n + 1)};
      RC_ASSERT(!verify_shard(model, kSpec, d).has_value());
    }
  }
}

// Random boxes of a 4-D tensor: inside, they pass; overhanging, the report names the first
// element outside, found here by scanning.
RC_GTEST_PROP(ShardCheck, RandomBoxesOfAFourDimensionalTensor, ()) {
  const std::vector<std::int64_t> shape = {3, 4, 2, 5};
  const LogicalModel model(one_param(shape));
  std::vector<std::int64_t> offset(4), extent(4);
  for (int d = 0; d < 4; ++d) {
    offset[d] = *rc::gen::inRange<std::int64_t>(0, shape[d] + 1);
    extent[d] = *rc::gen::inRange<std::int64_t>(0, shape[d] + 2 - offset[d]);
  }
  const LocalParam p = local(0, offset, extent);
  std::int64_t first_out = -1, v = 0;
  for (std::int64_t a = 0; a < extent[0]; ++a)
    for (std::int64_t b = 0; b < extent[1]; ++b)
      for (std::int64_t c = 0; c < extent[2]; ++c)
        for (std::int64_t e = 0; e < extent[3]; ++e, ++v)
          if (first_out < 0 && (offset[0] + a >= shape[0] || offset[1] + b >= shape[1] ||
                                offset[2] + c >= shape[2] || offset[3] + e >= shape[3]))
            first_out = v;
  const std::optional<ShardMismatch> m = verify_shard(model, kSpec, p);
  if (first_out < 0) {
    RC_ASSERT(!m.has_value());
  } else {
    RC_ASSERT(m.has_value());
    RC_ASSERT(m->rank_element == first_out);
    RC_ASSERT(std::isnan(m->expected));
  }
}

TEST(ShardCheck, HandlesOneToFourDims) {
  const std::vector<std::vector<std::int64_t>> shapes = {{11}, {6, 5}, {2, 3, 4}, {2, 3, 2, 3}};
  for (const auto& shape : shapes) {
    const LogicalModel model(one_param(shape));
    std::vector<std::int64_t> offset(shape.size(), 0), extent = shape;
    EXPECT_FALSE(verify_shard(model, kSpec, local(0, offset, extent)).has_value());
    offset.back() = 1;
    extent.back() -= 1;
    EXPECT_FALSE(verify_shard(model, kSpec, local(0, offset, extent)).has_value());
  }
}

TEST(ShardCheck, BatchesLargeTensorsByRows) {
  // 3000 rows of 700: a batch holds 1497 rows, so the box spans three batches.
  const LogicalModel model(one_param({3000, 700}));
  EXPECT_FALSE(verify_shard(model, kSpec, local(0, {1, 350}, {2998, 350})).has_value());
}

TEST(ShardCheck, OverhangingSliceFailsAtTheFirstElementOutside) {
  const LogicalModel model(one_param({6, 5}));
  // Columns 3..5 of a 5-column tensor: the third column of the box is outside; a rank that
  // flattens it reads row 1, column 0 (logical element 5) instead.
  const std::optional<ShardMismatch> m = verify_shard(model, kSpec, local(0, {0, 3}, {6, 3}));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->param, 0);
  EXPECT_EQ(m->rank_element, 2);
  EXPECT_EQ(m->read_element, 5u);
  EXPECT_TRUE(std::isnan(m->expected));
  EXPECT_EQ(m->got, kernels::gradient_value(kSpec, 0, 5));
  EXPECT_NE(m->reason.find("outside"), std::string::npos) << m->reason;
  EXPECT_NE(describe(*m).find("rank element 2"), std::string::npos) << describe(*m);

  // A range that starts past the first bad element still reports the first one in range.
  ShardDesc d = desc_of(model, local(0, {0, 3}, {6, 3}));
  d.range = kernels::ElementRange{3, 18};
  const std::optional<ShardMismatch> ranged = verify_shard(model, kSpec, d);
  ASSERT_TRUE(ranged.has_value());
  EXPECT_EQ(ranged->rank_element, 5);
  // A range that stops before it passes: elements 0, 1 are inside.
  d.range = kernels::ElementRange{0, 2};
  EXPECT_FALSE(verify_shard(model, kSpec, d).has_value());
}

TEST(ShardCheck, RangeStoppingShortOfAnOverhangIsCompared) {
  // The box overhangs dim 2 (columns 2..4 of 4) and dim 0 (rows past the end); the range reads
  // only elements inside, which are compared against the box clipped to the tensor.
  const LogicalModel model(one_param({3, 3, 4}));
  ShardDesc d = desc_of(model, local(0, {1, 1, 2}, {4, 2, 3}));
  d.range = kernels::ElementRange{0, 2};
  EXPECT_FALSE(verify_shard(model, kSpec, d).has_value());
  d.range = kernels::ElementRange{3, 5};  // (0, 1, 0), (0, 1, 1)
  EXPECT_FALSE(verify_shard(model, kSpec, d).has_value());
  d.range = kernels::ElementRange{6, 8};  // rows 2: (1, 0, 0), (1, 0, 1)
  EXPECT_FALSE(verify_shard(model, kSpec, d).has_value());
  d.range = kernels::ElementRange{3, 6};  // (0, 1, 2) lies outside
  const std::optional<ShardMismatch> m = verify_shard(model, kSpec, d);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rank_element, 5);
  d.range = kernels::ElementRange{12, 14};  // box row 2 is logical row 3 of 3: outside
  ASSERT_TRUE(verify_shard(model, kSpec, d).has_value());
  EXPECT_EQ(verify_shard(model, kSpec, d)->rank_element, 12);
}

TEST(ShardCheck, OffsetPastTheEndFails) {
  const LogicalModel model(one_param({6, 5}));
  const std::optional<ShardMismatch> m = verify_shard(model, kSpec, local(0, {6, 0}, {1, 5}));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rank_element, 0);
  EXPECT_EQ(m->read_element, 30u);
}

TEST(ShardCheck, WrongDimensionCountFails) {
  const LogicalModel model(one_param({6, 5}));
  const std::optional<ShardMismatch> m = verify_shard(model, kSpec, local(0, {0}, {30}));
  ASSERT_TRUE(m.has_value());
  EXPECT_NE(m->reason.find("1 dims"), std::string::npos) << m->reason;
}

TEST(ShardCheck, UnknownParamFails) {
  const LogicalModel model(one_param({6, 5}));
  EXPECT_TRUE(verify_shard(model, kSpec, local(3, {0, 0}, {6, 5})).has_value());
  EXPECT_TRUE(verify_shard(model, kSpec, local(-1, {0, 0}, {6, 5})).has_value());
}

TEST(ShardCheck, DescriptorWithTheWrongShapeFailsEvenWithEqualValues) {
  // The rank flattens column block [0:6, 2:4] of a 6 x 5 tensor with the strides of 6 x 4: the
  // row-1 elements come from the wrong place. All ones: the values cannot show it, the index can.
  const LogicalModel model(one_param({6, 5}));
  const LocalParam p = local(0, {0, 2}, {6, 2});
  for (const GeneratorSpec& spec : {kSpec, GeneratorSpec{0, GradientMode::ones, Dtype::fp32}}) {
    ShardDesc d = desc_of(model, p);
    EXPECT_FALSE(verify_shard(model, spec, d).has_value());
    d.shape[1] = 4;
    const std::optional<ShardMismatch> m = verify_shard(model, spec, d);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->rank_element, 2);  // row 1, column 2
    EXPECT_EQ(m->read_element, 6u);  // 1 * 4 + 2, not 1 * 5 + 2
    EXPECT_NE(m->reason.find("logical element 7"), std::string::npos) << m->reason;
  }
}

TEST(ShardCheck, RangeOutsideTheBoxFails) {
  const LogicalModel model(one_param({6, 5}));
  ShardDesc d = desc_of(model, local(0, {0, 0}, {3, 5}));
  d.range = kernels::ElementRange{10, 16};
  EXPECT_TRUE(verify_shard(model, kSpec, d).has_value());
  d.range = kernels::ElementRange{5, 4};
  EXPECT_TRUE(verify_shard(model, kSpec, d).has_value());
  d.range = kernels::ElementRange{4, 4};  // empty: nothing read, nothing wrong
  EXPECT_FALSE(verify_shard(model, kSpec, d).has_value());
}

TEST(ShardCheck, AWrongSliceInARealShardingIsCaught) {
  topologies::ParallelConfig c;
  c.world = 4;
  c.tp = 2;
  c.etp = 2;
  const LogicalModel model(ModelSpec{}, c);
  const RankLayout layout(c);
  std::vector<LocalParam> locals = topologies::local_params(model, layout, 1);
  ASSERT_FALSE(verify_shards(model, kSpec, locals).has_value());
  // Shift the first TP-split param's block one past its end (TP rank 1 of 2 reads block 2).
  for (LocalParam& p : locals) {
    if (p.partition_dim < 0) continue;
    p.slice.offset[p.partition_dim] += p.slice.extent[p.partition_dim];
    const std::optional<ShardMismatch> m = verify_shards(model, kSpec, locals);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->param, p.logical_id);
    EXPECT_EQ(m->rank_element, 0);
    return;
  }
  FAIL() << "no TP-split param on rank 1";
}

}  // namespace
}  // namespace tally::oracle
