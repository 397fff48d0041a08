#include "oracle/ground_truth.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/clip_scale.h"  // apply_clip: the kernel the oracle's own product must match
#include "oracle/detail/compensated_sum.h"
#include "tests/support/model_gen.h"
#include "tests/support/configs.h"

namespace tally::oracle {
namespace {

using kernels::Dtype;
using kernels::GeneratorSpec;
using kernels::GradientMode;
using topologies::CustomParam;
using topologies::GradNormGroup;
using topologies::LogicalModel;
using topologies::LogicalParam;
using topologies::ModelKind;
using topologies::ModelSpec;
using topologies::ParallelConfig;
using topologies::ParamClass;

CustomParam param(std::string name, ParamClass c, std::vector<std::int64_t> shape,
                  bool mtp = false, int expert = -1) {
  CustomParam p;
  p.name = std::move(name);
  p.param_class = c;
  p.shape = std::move(shape);
  p.mtp = mtp;
  p.expert = expert;
  return p;
}

// Three main params and two MTP params, 1 to 3 dims.
ModelSpec small_custom() {
  ModelSpec s;
  s.kind = ModelKind::custom;
  s.params = {param("w", ParamClass::column, {6, 5}), param("b", ParamClass::replicated, {7}),
              param("cube", ParamClass::row, {2, 4, 3}),
              param("mtp.w", ParamClass::column, {4, 3}, true),
              param("mtp.b", ParamClass::replicated, {5}, true)};
  return s;
}

ModelSpec moe_gpt() {
  ModelSpec s;
  s.num_layers = 2;
  s.hidden_size = 16;
  s.num_attention_heads = 4;
  s.vocab_size = 64;
  s.num_experts = 4;
  s.moe_ffn_hidden_size = 8;
  s.mtp_num_layers = 1;
  s.mtp_detach_heads = true;
  return s;
}

// Specs x topologies for the count invariants (docs/megatron-reference.md §7).
std::vector<LogicalModel> models() {
  std::vector<LogicalModel> out;
  out.emplace_back(ModelSpec{});
  out.emplace_back(ModelSpec{}, testing::config_of(8, 2, 2, 1, 2));
  ModelSpec untied;
  untied.untie_embeddings_and_output_weights = true;
  untied.swiglu = true;
  out.emplace_back(untied, testing::config_of(4, 2, 1, 1, 2));
  ModelSpec moe = moe_gpt();
  moe.add_bias_linear = false;
  out.emplace_back(moe, testing::config_of(8, 2, 1, 2, 1));
  out.emplace_back(moe, testing::config_of(8, 2, 1, 4, 2));
  out.emplace_back(moe_gpt(), testing::config_of(8, 2, 1, 2, 1));
  out.emplace_back(small_custom());
  out.emplace_back(small_custom(), testing::config_of(4, 2, 1, 1, 2));
  return out;
}

std::int64_t elements(const LogicalModel& model, GradNormGroup group) {
  return model.total_elements(group);
}

TEST(GroundTruth, AllOnesGivesSqrtNBitForBit) {
  for (const LogicalModel& model : models()) {
    for (Dtype dtype : kernels::kAllDtypes) {
      SCOPED_TRACE(topologies::describe(model.spec()) + " " + std::string(kernels::dtype_name(dtype)));
      const GroundTruth truth = ground_truth(model, {7, GradientMode::ones, dtype}, {{1.0, 3.0}, 0.0, false});
      const std::int64_t n_main = elements(model, GradNormGroup::main);
      const std::int64_t n_mtp = elements(model, GradNormGroup::mtp);
      ASSERT_EQ(n_main + n_mtp, model.total_elements());
      EXPECT_EQ(truth.main.elements, n_main);
      EXPECT_EQ(truth.main.sum_squares, static_cast<double>(n_main));
      EXPECT_EQ(truth.main.norm, std::sqrt(static_cast<double>(n_main)));
      EXPECT_EQ(truth.mtp.norm, std::sqrt(static_cast<double>(n_mtp)));
      EXPECT_EQ(truth.main.abs_max, 1.0);
      EXPECT_EQ(truth.zeros, 0);
      ASSERT_EQ(truth.main.p_norms.size(), 2u);
      EXPECT_EQ(truth.main.p_norms[0].sum, static_cast<double>(n_main));
      EXPECT_EQ(truth.main.p_norms[0].norm, static_cast<double>(n_main));
      EXPECT_EQ(truth.main.p_norms[1].sum, static_cast<double>(n_main));
      EXPECT_EQ(truth.main.p_norms[1].norm, std::pow(static_cast<double>(n_main), 1.0 / 3.0));
      // Ledger: every logical param once, numel elements, in its own group.
      ASSERT_EQ(truth.ledger.size(), model.params().size());
      std::int64_t counted = 0;
      for (const LogicalParam& p : model.params()) {
        EXPECT_EQ(truth.ledger[p.id], (LedgerEntry{p.id, p.grad_norm_group, p.numel}));
        counted += truth.ledger[p.id].count;
      }
      EXPECT_EQ(counted, model.total_elements());
    }
  }
}

RC_GTEST_PROP(GroundTruth, AllOnesGivesSqrtNOnRandomModels, ()) {
  const auto [config, spec] = *tally::testing::valid_case(3);
  const LogicalModel model(spec, config);
  const GroundTruth truth = ground_truth(model, {1, GradientMode::ones, Dtype::bf16}, {});
  const std::int64_t n_main = model.total_elements(GradNormGroup::main);
  RC_ASSERT(truth.main.norm == std::sqrt(static_cast<double>(n_main)));
  RC_ASSERT(truth.mtp.norm ==
            std::sqrt(static_cast<double>(model.total_elements(GradNormGroup::mtp))));
  RC_ASSERT(truth.zeros == 0);
}

TEST(GroundTruth, AllZerosGivesZeroCountN) {
  for (const LogicalModel& model : models()) {
    const GroundTruth truth =
        ground_truth(model, {3, GradientMode::zeros, Dtype::fp32}, {{2.0}, 1.0, true});
    EXPECT_EQ(truth.zeros, model.total_elements());  // MTP zeros counted too
    EXPECT_EQ(truth.main.zeros, elements(model, GradNormGroup::main));
    EXPECT_EQ(truth.main.norm, 0.0);
    EXPECT_EQ(truth.main.sum_squares, 0.0);
    EXPECT_EQ(truth.main.abs_max, 0.0);
    EXPECT_EQ(truth.main.p_norms[0].norm, 0.0);
    EXPECT_FALSE(truth.main.clip.applies);  // 1 / (0 + 1e-6) > 1
    EXPECT_EQ(truth.main.clip.coefficient, 1.0 / 1e-6);
    std::int64_t zeros = 0;
    for (const ParamTruth& p : truth.per_param) zeros += p.zeros;
    EXPECT_EQ(zeros, model.total_elements());
  }
}

// The hand computation: the documented dyadic formula k/8, k = floor(hi32(h) * 17 / 2^32) - 8
// with h the element's first draw, squares and powers summed in long double (exact here: a few
// hundred multiples of 2^-12).
struct Hand {
  long double squares[2] = {0, 0};  // main, mtp
  long double cubes[2] = {0, 0};
  long double abs_max[2] = {0, 0};
  std::int64_t zeros = 0;
};

Hand by_hand(const LogicalModel& model, std::uint64_t seed) {
  Hand hand;
  for (const LogicalParam& p : model.params()) {
    const std::uint64_t key = kernels::stream_key(seed, static_cast<std::uint64_t>(p.id));
    const int g = p.grad_norm_group == GradNormGroup::mtp ? 1 : 0;
    for (std::int64_t e = 0; e < p.numel; ++e) {
      const std::uint64_t h = kernels::detail::draw(key, static_cast<std::uint64_t>(e), 0);
      const int k = static_cast<int>(((h >> 32) * 17u) >> 32) - 8;
      const long double v = static_cast<long double>(k) / 8.0L;
      // The generator's stored value is that formula.
      EXPECT_EQ(kernels::gradient_value({seed, GradientMode::dyadic, Dtype::bf16},
                                        static_cast<std::uint64_t>(p.id), static_cast<std::uint64_t>(e)),
                static_cast<float>(v));
      hand.squares[g] += v * v;
      hand.cubes[g] += std::fabs(v * v * v);
      hand.abs_max[g] = std::max(hand.abs_max[g], std::fabs(v));
      hand.zeros += k == 0 ? 1 : 0;
    }
  }
  return hand;
}

TEST(GroundTruth, DyadicMatchesHandComputationExactly) {
  const LogicalModel model(small_custom());
  for (std::uint64_t seed : {0ull, 1ull, 42ull, 0xDEADBEEFull}) {
    const Hand hand = by_hand(model, seed);
    const GroundTruth truth =
        ground_truth(model, {seed, GradientMode::dyadic, Dtype::bf16}, {{3.0}, 0.0, false});
    EXPECT_EQ(truth.main.sum_squares, static_cast<double>(hand.squares[0]));
    EXPECT_EQ(truth.mtp.sum_squares, static_cast<double>(hand.squares[1]));
    EXPECT_EQ(truth.main.norm, std::sqrt(static_cast<double>(hand.squares[0])));
    EXPECT_EQ(truth.main.p_norms[0].sum, static_cast<double>(hand.cubes[0]));
    EXPECT_EQ(truth.main.abs_max, static_cast<double>(hand.abs_max[0]));
    EXPECT_EQ(truth.mtp.abs_max, static_cast<double>(hand.abs_max[1]));
    EXPECT_EQ(truth.zeros, hand.zeros);
  }
}

TEST(GroundTruth, RankEncodedSumsAreExact) {
  const LogicalModel model(moe_gpt(), testing::config_of(8, 2, 1, 2, 1));
  const GeneratorSpec spec{5, GradientMode::rank_encoded, Dtype::fp16};
  const GroundTruth truth = ground_truth(model, spec, {{}, 0.0, true});
  // Squares are 4^(c-3): count each class, the sum is exact.
  std::int64_t per_class[7] = {};
  for (const LogicalParam& p : model.params()) {
    if (p.grad_norm_group != GradNormGroup::main) continue;
    for (std::int64_t e = 0; e < p.numel; ++e) {
      const float v = kernels::gradient_value(spec, static_cast<std::uint64_t>(p.id),
                                              static_cast<std::uint64_t>(e));
      int c = 0;
      while (std::ldexp(1.0, c - 3) != std::fabs(v)) ++c;
      ++per_class[c];
    }
  }
  double expected = 0.0;
  for (int c = 0; c < 7; ++c) expected += static_cast<double>(per_class[c]) * std::ldexp(1.0, 2 * (c - 3));
  EXPECT_EQ(truth.main.sum_squares, expected);
  double from_params = 0.0;
  for (const ParamTruth& p : truth.per_param)
    if (p.group == GradNormGroup::main) from_params += p.sum_squares;
  EXPECT_EQ(from_params, expected);
}

TEST(GroundTruth, MtpIsExcludedFromTheMainNormAndCountedInZeros) {
  const LogicalModel model(small_custom());
  const std::int64_t n_main = 6 * 5 + 7 + 2 * 4 * 3, n_mtp = 4 * 3 + 5;
  const GroundTruth ones = ground_truth(model, {0, GradientMode::ones, Dtype::fp32}, {});
  EXPECT_EQ(ones.main.sum_squares, static_cast<double>(n_main));
  EXPECT_EQ(ones.mtp.sum_squares, static_cast<double>(n_mtp));
  EXPECT_EQ(ones.mtp.elements, n_mtp);
  const GroundTruth zeros = ground_truth(model, {0, GradientMode::zeros, Dtype::fp32}, {});
  EXPECT_EQ(zeros.zeros, n_main + n_mtp);
  EXPECT_EQ(zeros.main.zeros, n_main);
  EXPECT_EQ(zeros.mtp.zeros, n_mtp);

  // A model without MTP params: the MTP group is all zero.
  ModelSpec spec = small_custom();
  spec.params.resize(3);
  const GroundTruth no_mtp = ground_truth(LogicalModel(spec), {0, GradientMode::normal, Dtype::fp32}, {});
  EXPECT_EQ(no_mtp.mtp, (GroundTruth{}.mtp));
}

TEST(GroundTruth, ClipAtHalfTheNormWithAllOnes) {
  for (const LogicalModel& model : models()) {
    const double n = static_cast<double>(elements(model, GradNormGroup::main));
    const double max_norm = std::sqrt(n) / 2.0;
    const GeneratorSpec spec{11, GradientMode::ones, Dtype::fp32};
    const GroundTruth truth = ground_truth(model, spec, {{}, max_norm, false});
    const double coefficient = max_norm / (std::sqrt(n) + 1e-6);
    EXPECT_EQ(truth.main.clip.coefficient, coefficient);
    EXPECT_TRUE(truth.main.clip.applies);
    EXPECT_EQ(truth.main.clip.scale(), static_cast<float>(coefficient));
    // The MTP group is clipped with its own norm.
    const double mtp_norm = std::sqrt(static_cast<double>(elements(model, GradNormGroup::mtp)));
    EXPECT_EQ(truth.mtp.clip.coefficient, max_norm / (mtp_norm + 1e-6));
    const float clipped = kernels::apply_clip(1.0f, static_cast<float>(coefficient));
    for (const LogicalParam& p : model.params()) {
      const ClipTruth& clip = truth.group(p.grad_norm_group).clip;
      const float want = clip.applies ? kernels::apply_clip(1.0f, clip.scale()) : 1.0f;
      if (p.grad_norm_group == GradNormGroup::main) {
        EXPECT_EQ(want, clipped);
      }
      for (std::int64_t e = 0; e < p.numel; ++e)
        ASSERT_EQ(expected_clipped(truth, model, spec, p.id, static_cast<std::uint64_t>(e)), want)
            << p.name << " element " << e;
    }
  }
}

TEST(GroundTruth, NoClippingAtOrAboveTheNorm) {
  const LogicalModel model(small_custom());
  const GeneratorSpec spec{2, GradientMode::normal, Dtype::bf16};
  const GroundTruth truth = ground_truth(model, spec, {{}, 1e9, false});
  EXPECT_FALSE(truth.main.clip.applies);
  EXPECT_GT(truth.main.clip.coefficient, 1.0);
  EXPECT_EQ(truth.main.clip.applied(), 1.0);
  for (std::uint64_t e = 0; e < 30; ++e)
    EXPECT_EQ(expected_clipped(truth, model, spec, 0, e), kernels::gradient_value(spec, 0, e));
  // max_norm 0 disables clipping.
  const GroundTruth off = ground_truth(model, spec, {});
  EXPECT_FALSE(off.main.clip.applies);
  EXPECT_EQ(off.main.clip.coefficient, 0.0);  // the raw quotient: never what a path applies
  EXPECT_EQ(off.main.clip.applied(), 1.0);
  EXPECT_EQ(clip_truth(0.0, 0.0).applied(), 1.0);
  const ClipTruth half = clip_truth(2.0, 4.0 - 1e-6);
  EXPECT_TRUE(half.applies);
  EXPECT_EQ(half.applied(), half.coefficient);
}

TEST(GroundTruth, ClippedValueStoredBackInBf16) {
  const ClipTruth clip = clip_truth(1.0, 3.0);
  ASSERT_TRUE(clip.applies);
  const float g = 1.2345678f;
  EXPECT_EQ(clipped_value(clip, g), kernels::apply_clip(g, clip.scale()));
  EXPECT_EQ(clipped_value(clip, g, Dtype::bf16), kernels::apply_clip(g, clip.scale(), Dtype::bf16));
  EXPECT_EQ(clipped_value(clip_truth(10.0, 3.0), g, Dtype::bf16), g);
}

TEST(GroundTruth, ParameterNormIsTheSameComputationOnParameterValues) {
  const LogicalModel model(moe_gpt(), testing::config_of(8, 2, 1, 2, 1));
  const GeneratorSpec params{99, GradientMode::ones, Dtype::fp32};
  const GroundTruth p = parameter_truth(model, params, {});
  EXPECT_EQ(p.main.norm, std::sqrt(static_cast<double>(model.total_elements(GradNormGroup::main))));
  const GeneratorSpec normal{99, GradientMode::normal, Dtype::bf16};
  EXPECT_EQ(parameter_truth(model, normal, {{1.5}, 0.0, true}),
            ground_truth(model, normal, {{1.5}, 0.0, true}));
}

TEST(GroundTruth, PerParamStatisticsAddUpToTheGroups) {
  const LogicalModel model(moe_gpt(), testing::config_of(8, 2, 1, 2, 1));
  const GroundTruth truth = ground_truth(model, {4, GradientMode::dyadic, Dtype::fp32}, {{}, 0.0, true});
  ASSERT_EQ(truth.per_param.size(), model.params().size());
  double squares[2] = {0, 0}, abs_max[2] = {0, 0};
  std::int64_t zeros = 0;
  for (const ParamTruth& p : truth.per_param) {
    const int g = p.group == GradNormGroup::mtp ? 1 : 0;
    EXPECT_EQ(p.numel, model.param(p.param).numel);
    squares[g] += p.sum_squares;  // exact: dyadic
    abs_max[g] = std::max(abs_max[g], p.abs_max);
    zeros += p.zeros;
  }
  EXPECT_EQ(squares[0], truth.main.sum_squares);
  EXPECT_EQ(squares[1], truth.mtp.sum_squares);
  EXPECT_EQ(abs_max[0], truth.main.abs_max);
  EXPECT_EQ(abs_max[1], truth.mtp.abs_max);
  EXPECT_EQ(zeros, truth.zeros);
  EXPECT_TRUE(ground_truth(model, {4, GradientMode::dyadic, Dtype::fp32}, {}).per_param.empty());
}

TEST(GroundTruth, RejectsBadOptions) {
  const LogicalModel model(small_custom());
  const GeneratorSpec spec{};
  constexpr double inf = std::numeric_limits<double>::infinity();
  for (double p : {0.0, -1.0, std::nan(""), inf})
    EXPECT_THROW(ground_truth(model, spec, {{p}, 0.0, false}), std::invalid_argument) << p;
  EXPECT_THROW(ground_truth(model, spec, {{}, -1.0, false}), std::invalid_argument);
  EXPECT_THROW(ground_truth(model, spec, {{}, inf, false}), std::invalid_argument);
}

// ---- Accuracy of the compensated sums ---------------------------------------------------------

TEST(CompensatedSum, BeatsNaiveSummationOnAnAdversarialInput) {
  // 1 followed by 2^20 terms of 2^-60: each is below half an ulp of 1, so a naive sum never
  // moves; the exact sum 1 + 2^-40 is a double.
  detail::CompensatedSum sum;
  double naive = 1.0;
  sum.add(1.0);
  for (int i = 0; i < (1 << 20); ++i) {
    sum.add(0x1p-60);
    naive += 0x1p-60;
  }
  EXPECT_EQ(naive, 1.0);
  EXPECT_EQ(sum.value(), 1.0 + 0x1p-40);
  // Merging block accumulators keeps the low part.
  detail::CompensatedSum a, b, merged;
  a.add(1.0);
  for (int i = 0; i < 1000; ++i) b.add(0x1p-60);
  merged.merge(a);
  merged.merge(b);
  EXPECT_EQ(merged.value(), 1.0 + 1000 * 0x1p-60);
}

TEST(GroundTruth, SumOfSquaresIsWithinOneUlpOfTheExactSum) {
  // One 1024 x 1024 param of normal values, plus a few small ones: 2^20 + addends. The exact
  // reference sums the (exact) double squares in binary128.
  ModelSpec spec;
  spec.kind = ModelKind::custom;
  spec.params = {param("big", ParamClass::replicated, {1024, 1025}),
                 param("small", ParamClass::replicated, {3, 3})};
  const LogicalModel model(spec);
  const GeneratorSpec gen{2024, GradientMode::normal, Dtype::fp32};
  __float128 exact = 0;
  double naive = 0.0;
  for (const LogicalParam& p : model.params())
    for (std::int64_t e = 0; e < p.numel; ++e) {
      const double g = kernels::gradient_value(gen, static_cast<std::uint64_t>(p.id),
                                               static_cast<std::uint64_t>(e));
      exact += static_cast<__float128>(g * g);
      naive += g * g;
    }
  const double truth = ground_truth(model, gen, {}).main.sum_squares;
  const double reference = static_cast<double>(exact);
  const double truth_error = std::fabs(static_cast<double>(static_cast<__float128>(truth) - exact));
  const double naive_error = std::fabs(static_cast<double>(static_cast<__float128>(naive) - exact));
  const double ulp = std::nextafter(reference, INFINITY) - reference;
  EXPECT_LE(truth_error, (1.0 + 0x1p-9) * 0x1p-53 * reference);
  EXPECT_LE(truth_error, ulp);
  EXPECT_GT(naive_error, 4 * ulp) << "naive " << naive_error / ulp << " ulp";
  RecordProperty("naive_error_ulp", std::to_string(naive_error / ulp));
}

}  // namespace
}  // namespace tally::oracle
