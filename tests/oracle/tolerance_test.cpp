#include "oracle/tolerance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "kernels/clip_scale.h"   // apply_clip: compared with the bound, not used by it
#include "kernels/local_stats.h"  // local_stats_cpu: measured against the bound

namespace tally::oracle {
namespace {

using kernels::Accumulation;
using kernels::Dtype;
using kernels::GeneratorSpec;
using kernels::GradientMode;
using topologies::CustomParam;
using topologies::LogicalModel;
using topologies::LogicalParam;
using topologies::ModelKind;
using topologies::ModelSpec;
using topologies::ParamClass;

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Tolerance, ChainLengthFollowsTheDocumentedOrder) {
  // 1 square + 255 lane additions + 3 tree levels + 31 chunk additions + 3 shard additions.
  EXPECT_EQ(local_chain_length(std::int64_t{1} << 16, 4, 1), 1 + 255 + 3 + 31 + 3);
  // 100 elements: 13 per lane at most, one chunk, one shard.
  EXPECT_EQ(local_chain_length(100, 1, 0), 12 + 3);
  EXPECT_EQ(local_chain_length(1, 1, 0), 3);
  EXPECT_EQ(unit_roundoff(Accumulation::fp32), 0x1p-24);
  EXPECT_EQ(unit_roundoff(Accumulation::fp64), 0x1p-53);
  EXPECT_NEAR(gamma_of(100 * 0x1p-24), 100 * 0x1p-24, 1e-9);
  EXPECT_EQ(gamma_of(1.0), kInf);
}

GroupTruth group(double sum_squares, std::int64_t elements, double max_norm = 0.0) {
  GroupTruth g;
  g.elements = elements;
  g.sum_squares = sum_squares;
  g.norm = std::sqrt(sum_squares);
  g.clip = clip_truth(max_norm, g.norm);
  return g;
}

TEST(Tolerance, ExactModesWithFp64AreBitForBit) {
  ReductionModel m;
  m.exact_mode = true;
  m.shard_elements = 1 << 20;
  m.shards = 40;
  m.reduction_groups = {8, 16};
  GroupTruth g = group(12345.0, 12345, 50.0);
  g.p_norms = {{1.0, 12345.0, 12345.0}, {3.0, 12345.0, std::pow(12345.0, 1.0 / 3.0)}};
  const Tolerance t = tolerance(m, g);
  EXPECT_EQ(t.sum_squares, 0.0);
  EXPECT_EQ(t.norm, 0.0);
  EXPECT_EQ(t.p_sums, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(t.p_norms, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(t.clip_coefficient, 0.0);
  EXPECT_TRUE(t.clip_decision_certain);
  const ClipScales scales = clip_scales(t, g.clip);
  EXPECT_EQ(scales.low, static_cast<float>(g.clip.coefficient));
  EXPECT_EQ(scales.high, scales.low);
  EXPECT_EQ(error_ratio(g.norm, g.norm, t.norm), 0.0);
  EXPECT_EQ(error_ratio(std::nextafter(g.norm, 0.0), g.norm, t.norm), kInf);

  // Children combined as sqrt(sum n_i^2) round even exact sums: a few ulps, not zero.
  m.children = 2;
  const Tolerance chained = tolerance(m, g);
  EXPECT_GT(chained.norm, 0.0);
  EXPECT_LT(chained.norm, 8 * 0x1p-53 * g.norm);
  // fp32 accumulation of exact values is not exact.
  m.children = 1;
  m.local = Accumulation::fp32;
  EXPECT_GT(tolerance(m, g).norm, 0.0);
}

TEST(Tolerance, BoundsGrowWithTheChain) {
  ReductionModel m;
  m.local = Accumulation::fp32;
  m.shard_elements = 1000;
  const GroupTruth g = group(1000.0, 1000, 10.0);
  const Tolerance small = tolerance(m, g);
  m.shard_elements = 1 << 20;
  m.reduction_groups = {64};
  const Tolerance large = tolerance(m, g);
  EXPECT_LT(small.sum_squares, large.sum_squares);
  EXPECT_LT(small.norm, large.norm);
  EXPECT_LT(small.clip_coefficient, large.clip_coefficient);
  const ClipScales small_scales = clip_scales(small, g.clip), large_scales = clip_scales(large, g.clip);
  EXPECT_LE(large_scales.low, small_scales.low);
  EXPECT_GE(large_scales.high, small_scales.high);
  EXPECT_LT(large_scales.low, large_scales.high);
  // The norm's relative bound is about half the sum's, plus the sqrt's rounding.
  EXPECT_NEAR(large.norm / g.norm, large.sum_squares / g.sum_squares / 2, 2 * 0x1p-24);
}

TEST(Tolerance, ClipDecisionNearOneIsUncertain) {
  ReductionModel m;
  m.local = Accumulation::fp32;
  m.shard_elements = 4096;
  const GroupTruth far = group(100.0, 4096, 5.0);  // coefficient ~0.5
  EXPECT_TRUE(tolerance(m, far).clip_decision_certain);
  const GroupTruth near = group(100.0, 4096, 10.0 + 1e-6);  // coefficient 1 within rounding
  EXPECT_FALSE(tolerance(m, near).clip_decision_certain);
}

// The false FAIL of ci/fuzz seed 8243660598208285121 (case 78850): rank-encoded fp32 gradients
// summed in fp32 are exact values, but their coefficient carries the accumulation's rounding, so a
// clipped value one fp32 ulp from the truth's product is one the path can make.
TEST(Tolerance, ExactGradientsAccumulatedInFp32ClipWithinTheCoefficientsRounding) {
  ReductionModel m;
  m.exact_mode = true;
  m.local = Accumulation::fp32;
  m.shard_elements = 1 << 16;
  m.shards = 500;
  m.reduction_groups = {8};
  const GroupTruth g = group(400.0, 265792, 1.0);  // coefficient ~0.05
  const Tolerance t = tolerance(m, g);
  ASSERT_GT(t.clip_coefficient, 0.0);
  const ClipScales scales = clip_scales(t, g.clip);
  EXPECT_LT(scales.low, scales.high);
  const float stored = 0.04446f;
  const float truths = stored * static_cast<float>(g.clip.coefficient);
  EXPECT_TRUE(clipped_within(truths, stored, scales));
  EXPECT_TRUE(clipped_within(std::nextafter(truths, 1.0f), stored, scales));
  EXPECT_TRUE(clipped_within(std::nextafter(truths, 0.0f), stored, scales));
  // A clipping fault is still far outside: the coefficient halved, or not applied at all.
  EXPECT_FALSE(clipped_within(truths / 2, stored, scales));
  EXPECT_FALSE(clipped_within(stored, stored, scales));
}

TEST(Tolerance, ClippedWithinIsExactlyTheProductsOfTheExtremeScales) {
  const ClipScales scales{0.25f, std::nextafter(0.25f, 1.0f)};
  for (float stored : {3.0f, -3.0f, 1e-30f, -7.5e12f}) {
    const float low = stored * scales.low, high = stored * scales.high;
    EXPECT_TRUE(clipped_within(low, stored, scales)) << stored;
    EXPECT_TRUE(clipped_within(high, stored, scales)) << stored;
    constexpr float kFloatInf = std::numeric_limits<float>::infinity();
    const float below = std::nextafter(std::min(low, high), -kFloatInf);
    const float above = std::nextafter(std::max(low, high), kFloatInf);
    EXPECT_FALSE(clipped_within(below, stored, scales)) << stored;
    EXPECT_FALSE(clipped_within(above, stored, scales)) << stored;
  }
  EXPECT_FALSE(clipped_within(std::numeric_limits<float>::quiet_NaN(), 1.0f, scales));
  // A certain coefficient leaves one scale: the truth's applied coefficient.
  Tolerance certain;
  const float quarter = static_cast<float>(clip_truth(1.0, 4.0).coefficient);  // 1 / (4 + 1e-6)
  EXPECT_EQ(clip_scales(certain, clip_truth(1.0, 4.0)), (ClipScales{quarter, quarter}));
  EXPECT_EQ(clip_scales(certain, clip_truth(1.0, 0.5)), (ClipScales{1.0f, 1.0f}));
  // An uncertain decision reaches 1: not clipping at all is a value the path can make.
  Tolerance loose;
  loose.clip_coefficient = 1e-3;
  EXPECT_EQ(clip_scales(loose, clip_truth(1.0, 1.0)).high, 1.0f);
}

TEST(Tolerance, ErrorRatio) {
  EXPECT_EQ(error_ratio(1.5, 1.0, 1.0), 0.5);
  EXPECT_EQ(error_ratio(1.0, 1.0, 0.0), 0.0);
  EXPECT_EQ(error_ratio(std::nan(""), 1.0, 1.0), kInf);
}

// ---- Random normal data summed in the documented order --------------------------------------

// The path's local sum over one shard (a whole 1-D param), written from kernels/local_stats.h's
// documented order: 8 lanes per chunk of kStatsChunk, a 3-level tree, chunk sums in order.
template <class A, class Term>
A shard_sum(const std::vector<float>& values, Term term) {
  A sum = A(0);
  const std::int64_t n = static_cast<std::int64_t>(values.size());
  for (std::int64_t first = 0; first < n; first += kernels::kStatsChunk) {
    A lanes[8] = {};
    const std::int64_t end = std::min(n, first + kernels::kStatsChunk);
    for (std::int64_t v = first; v < end; ++v) lanes[(v - first) % 8] += term(static_cast<A>(values[v]));
    sum += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
           ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
  return sum;
}

// Products kept out of FMAs, as the kernels build them.
template <class A>
A mul(A a, A b) {
  if constexpr (sizeof(A) == sizeof(float)) return kernels::detail::mulf(a, b);
  else return kernels::detail::mul(a, b);
}

template <class A>
struct Power {
  double p;
  A operator()(A a) const {
    a = std::fabs(a);
    if (p == std::floor(p) && p >= 1 && p <= 8) {
      A r = a;
      for (int k = 1; k < static_cast<int>(p); ++k) r = mul(r, a);
      return r;
    }
    return std::pow(a, static_cast<A>(p));
  }
};

constexpr int kRanks = 4;
constexpr int kShardsPerRank = 2;
const std::vector<std::int64_t> kSizes = {40000, 9000, 3000, 25000, 777, 18000, 2048, 60000};

ModelSpec shards_model() {
  ModelSpec s;
  s.kind = ModelKind::custom;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    CustomParam p;
    p.name = "shard" + std::to_string(i);
    p.param_class = ParamClass::replicated;
    p.shape = {kSizes[i]};
    s.params.push_back(p);
  }
  return s;
}

struct Observed {
  double worst = 0.0;  // max error / bound over seeds and statistics
  double sum_ratio = 0.0, norm_ratio = 0.0;  // max over seeds, sum of squares and norm only
};

// Rank r holds params r * kShardsPerRank ...; local sums in A, reduced over the ranks in R.
template <class A, class R>
Observed run_random(Accumulation local, Accumulation reduction, GradientMode mode) {
  const LogicalModel model(shards_model());
  const std::vector<double> p_values = {1.0, 3.0, 1.5};
  ReductionModel m;
  m.local = local;
  m.reduction = reduction;
  m.shard_elements = *std::max_element(kSizes.begin(), kSizes.end());
  m.shards = kShardsPerRank;
  m.reduction_groups = {kRanks};
  Observed seen;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const GeneratorSpec spec{seed, mode, Dtype::fp32};
    std::vector<std::vector<float>> values;
    for (const LogicalParam& p : model.params()) {
      values.emplace_back();
      for (std::int64_t e = 0; e < p.numel; ++e)
        values.back().push_back(kernels::gradient_value(spec, static_cast<std::uint64_t>(p.id),
                                                        static_cast<std::uint64_t>(e)));
    }
    const double max_norm = std::sqrt(static_cast<double>(model.total_elements())) / 2;
    const GroundTruth truth = ground_truth(model, spec, {p_values, max_norm, false});
    const Tolerance t = tolerance(m, truth.main);

    auto reduce = [&](auto term) {
      R total = R(0);
      for (int r = 0; r < kRanks; ++r) {
        A local_sum = A(0);
        for (int s = 0; s < kShardsPerRank; ++s)
          local_sum += shard_sum<A>(values[r * kShardsPerRank + s], term);
        total += static_cast<R>(local_sum);
      }
      return total;
    };
    const R squares = reduce([](A a) { return mul(a, a); });
    const R norm = std::sqrt(squares);
    const double sum_ratio = error_ratio(squares, truth.main.sum_squares, t.sum_squares);
    const double norm_ratio = error_ratio(norm, truth.main.norm, t.norm);
    seen.sum_ratio = std::max(seen.sum_ratio, sum_ratio);
    seen.norm_ratio = std::max(seen.norm_ratio, norm_ratio);
    seen.worst = std::max({seen.worst, sum_ratio, norm_ratio});
    for (std::size_t i = 0; i < p_values.size(); ++i) {
      const R sum = reduce(Power<A>{p_values[i]});
      const R root = static_cast<R>(std::pow(sum, static_cast<R>(1.0) / static_cast<R>(p_values[i])));
      seen.worst = std::max({seen.worst, error_ratio(sum, truth.main.p_norms[i].sum, t.p_sums[i]),
                             error_ratio(root, truth.main.p_norms[i].norm, t.p_norms[i])});
    }
    // The clip coefficient from the path's norm, in the reduction type, and every clipped element.
    EXPECT_TRUE(truth.main.clip.applies);
    EXPECT_TRUE(t.clip_decision_certain);
    const R coefficient = static_cast<R>(max_norm) / (norm + static_cast<R>(1e-6));
    seen.worst = std::max(seen.worst, error_ratio(coefficient, truth.main.clip.coefficient,
                                                  t.clip_coefficient));
    const float scale = static_cast<float>(coefficient);
    for (const LogicalParam& p : model.params())
      for (std::int64_t e = 0; e < p.numel; e += 7) {
        const float g = values[p.id][e];
        const float got = kernels::apply_clip(g, scale);
        EXPECT_TRUE(clipped_within(got, g, clip_scales(t, truth.main.clip)))
            << "element " << e << " of param " << p.id << ": " << got << " from " << g;
      }
  }
  return seen;
}

void expect_within_and_tight(const Observed& seen, const std::string& what) {
  std::cout << what << ": max error/bound " << seen.worst << " (sum of squares "
            << seen.sum_ratio << ", norm " << seen.norm_ratio << ")\n";
  ::testing::Test::RecordProperty(what + "_worst_ratio", std::to_string(seen.worst));
  ::testing::Test::RecordProperty(what + "_norm_ratio", std::to_string(seen.norm_ratio));
  EXPECT_LE(seen.worst, 1.0) << what;
  // Not absurdly loose: the observed error of the sum of squares is within 1e4 of the bound.
  EXPECT_GE(seen.sum_ratio, 1e-4) << what;
  EXPECT_GE(seen.norm_ratio, 1e-4) << what;
}

TEST(Tolerance, RandomNormalFp32LocalFp64Reduction) {
  expect_within_and_tight(run_random<float, double>(Accumulation::fp32, Accumulation::fp64,
                                                    GradientMode::normal),
                          "fp32_local_fp64_reduction");
}

TEST(Tolerance, RandomNormalFp32Everywhere) {
  // Megatron-LM: the local fp32 sum is all-reduced as a fp32 tensor, sqrt in fp32.
  expect_within_and_tight(run_random<float, float>(Accumulation::fp32, Accumulation::fp32,
                                                   GradientMode::normal),
                          "fp32_everywhere");
}

// The kernels' own CPU implementation stays within the bound too (a test may call the kernels'
// sums; the oracle never does).
TEST(Tolerance, LocalStatsCpuStaysWithinTheBound) {
  const LogicalModel model(shards_model());
  for (Accumulation accumulation : {Accumulation::fp32, Accumulation::fp64}) {
    ReductionModel m;
    m.local = accumulation;
    m.shard_elements = *std::max_element(kSizes.begin(), kSizes.end());
    m.shards = kShardsPerRank;
    m.reduction_groups = {kRanks};
    double worst = 0.0;
    for (std::uint64_t seed = 1; seed <= 4; ++seed) {
      const GeneratorSpec spec{seed, GradientMode::normal, Dtype::bf16};
      const GroundTruth truth = ground_truth(model, spec, {{1.0, 3.0, 2.5}, 0.0, false});
      const Tolerance t = tolerance(m, truth.main);
      double squares = 0.0;
      std::vector<double> p_sums(3, 0.0);
      for (int r = 0; r < kRanks; ++r) {
        std::vector<kernels::ShardDesc> shards;
        for (int s = 0; s < kShardsPerRank; ++s) {
          const LogicalParam& p = model.param(r * kShardsPerRank + s);
          shards.push_back(kernels::whole_tensor(static_cast<std::uint64_t>(p.id),
                                                 {p.shape.dims.data(), static_cast<std::size_t>(p.shape.rank)}));
        }
        const kernels::Stats local =
            kernels::local_stats_cpu(shards, spec, {accumulation, {1.0, 3.0, 2.5}, false}).total;
        squares += local.sum_squares;
        for (std::size_t i = 0; i < p_sums.size(); ++i) p_sums[i] += local.p_sums[i];
      }
      worst = std::max({worst, error_ratio(squares, truth.main.sum_squares, t.sum_squares),
                        error_ratio(std::sqrt(squares), truth.main.norm, t.norm)});
      for (std::size_t i = 0; i < p_sums.size(); ++i)
        worst = std::max(worst, error_ratio(p_sums[i], truth.main.p_norms[i].sum, t.p_sums[i]));
    }
    std::cout << "local_stats_cpu " << kernels::accumulation_name(accumulation)
              << ": max error/bound " << worst << "\n";
    EXPECT_LE(worst, 1.0) << kernels::accumulation_name(accumulation);
  }
}

TEST(Tolerance, RandomUniformFp64) {
  const Observed seen =
      run_random<double, double>(Accumulation::fp64, Accumulation::fp64, GradientMode::uniform);
  std::cout << "fp64: max error/bound " << seen.worst << " (sum of squares " << seen.sum_ratio
            << ", norm " << seen.norm_ratio << ")\n";
  EXPECT_LE(seen.worst, 1.0);
  EXPECT_GE(seen.sum_ratio, 1e-4);
}

}  // namespace
}  // namespace tally::oracle
