// DeepSpeed's rules (run/deepspeed/rules.h): what the worker builds, DeepSpeed's own refusals as
// rules, and every generated case one it builds.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "run/deepspeed/engine.h"
#include "run/deepspeed/rules.h"
#include "run/deepspeed/section.h"
#include "topologies/logical_model.h"
#include "topologies/model_spec.h"
#include "topologies/presets.h"
#include "vocab/optimizer_models.h"
#include "tests/support/founding_case.h"
#include "tests/support/worker_rule_cases.h"

namespace tally::run {
namespace {

using testing::founding_case;

RC_GTEST_PROP(DeepSpeedTarget, EveryGeneratedCaseIsOneTheWorkerBuilds, ()) {
  const int world = *rc::gen::element(2, 4, 8);
  fuzz::CaseGenOptions options = testing::gpt_cases_of_world(world);
  // A machine without fp16 (DeepSpeed's CPU accelerator on most CPUs), or one with every dtype.
  const std::vector<std::string> dtypes =
      *rc::gen::element(std::vector<std::string>{}, std::vector<std::string>{"fp32", "bf16"});
  options.restrict_to = [dtypes](casefile::Case c) {
    const std::uint64_t draw = c.path.gradients.generator.seed;
    return within_deepspeed(std::move(c), "0.19.8", {}, draw, dtypes);
  };
  const casefile::Case c = *fuzz::gen_case(options);
  RC_ASSERT(!casefile::check_case(c));
  RC_ASSERT(c.topology.world == world);
  const std::optional<std::string> refusal = deepspeed_refusal(c, "0.19.8", {}, dtypes);
  RC_ASSERT(!refusal);
}

TEST(DeepSpeedTarget, NamesWhatTheWorkerCannotBuild) {
  casefile::Case c = founding_case();  // TP 2, EP 2, ETP 1, world 2: DeepSpeed's legacy expert groups span TP
  c.path.optimizer = vocab::OptimizerModel::plain;
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));
  c.topology.etp = 2;  // with expert TP, EP groups lie within DP 1
  EXPECT_NE(deepspeed_refusal(c, "0.19.8").value_or("").find("topology.ep 2"), std::string::npos);
  c.topology.tp = 1;
  c.topology.etp = 1;
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.zero_stage = 3; });  // the founding case has experts
  EXPECT_EQ(deepspeed_refusal(c, "0.19.8").value_or("").rfind("deepspeed.zero_stage 3 with experts:", 0), 0u);
  c.model.num_experts = 0;
  c.topology.ep = 1;
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));
  c.model.num_experts = 2;
  c.topology.ep = 2;
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.zero_stage = 0; });
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.grad_accum_fp32 = true; });
  c.path.gradients.generator.dtype = kernels::Dtype::bf16;
  EXPECT_NE(deepspeed_refusal(c, "0.19.8").value_or("").find("NotImplementedError"), std::string::npos);
  casefile::keep_only_section(c, "");
  EXPECT_EQ(deepspeed_refusal(c, "0.19.8").value_or("").rfind("deepspeed:", 0), 0u);
  c = founding_case();
  c.topology.tp = c.topology.etp = 1;
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  EXPECT_EQ(deepspeed_refusal(c, "0.19.8").value_or("").rfind("optimizer.model layerwise:", 0), 0u);
}

// accelerate's prepare (deepspeed.launcher accelerate) takes what it can give DeepSpeed: TP 1 or
// AutoTP over the whole world, no pipeline, and a path whose engine keeps a norm for clip_grad_norm_.
TEST(DeepSpeedTarget, BuildsThroughAccelerateWhereItsPrepareCan) {
  casefile::Case c = founding_case();
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = {.world = 2, .ep = 2};
  c.path.gradients.generator.dtype = kernels::Dtype::bf16;
  kDeepSpeedSection.set(c, {.zero_stage = 2, .launcher = DeepSpeedLauncher::accelerate});
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8")) << deepspeed_refusal(c, "0.19.8").value_or("");
  EXPECT_EQ(deepspeed_norm_code(c), "DeepSpeedZeroOptimizer through accelerate");
  const auto refusal = [](const casefile::Case& c) { return deepspeed_refusal(c, "0.19.8").value_or(""); };
  c.path.gradients.generator.dtype = kernels::Dtype::fp32;
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.zero_stage = 0; });
  EXPECT_NE(refusal(c).find("engine.py:3502-3519"), std::string::npos) << refusal(c);
  c.path.gradients.generator.dtype = kernels::Dtype::bf16;
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8")) << refusal(c);
  casefile::Case tp = c;
  tp.topology = {.world = 2, .tp = 2, .ep = 1};
  tp.path.gradients.stated.clear();
  EXPECT_NE(refusal(tp).find("accelerator.py:2394-2433"), std::string::npos) << refusal(tp);
  // The same case through deepspeed.initialize builds.
  kDeepSpeedSection.change(tp, [&](DeepSpeedConfig& d) { d.launcher = DeepSpeedLauncher::deepspeed; });
  EXPECT_FALSE(deepspeed_refusal(tp, "0.19.8")) << refusal(tp);
  // Generated cases draw the launcher, and never one accelerate cannot build.
  fuzz::CaseGenOptions options = testing::gpt_cases_of_world(4);
  int through_accelerate = 0;
  for (std::uint64_t draw = 0; draw < 256; ++draw) {
    casefile::Case drawn = founding_case();
    drawn.topology = {.world = 4, .ep = 2};
    drawn.path.gradients.generator.seed = draw;
    drawn = within_deepspeed(drawn, "0.19.8", {}, draw, {"fp32", "bf16"});
    if (kDeepSpeedSection.of(drawn)->launcher == DeepSpeedLauncher::accelerate) ++through_accelerate;
    EXPECT_FALSE(deepspeed_refusal(drawn, "0.19.8", {}, {"fp32", "bf16"})) << refusal(drawn);
  }
  EXPECT_GT(through_accelerate, 0);
}

// DeepSpeed 0.19.8 refuses offload with AutoEP folded over AutoTP at deepspeed.initialize
// (auto_ep_folding.py:249); a campaign once drew such a case and ended at the framework's refusal.
TEST(DeepSpeedTarget, RefusesOffloadWithAutoEpFoldedOverAutoTpAsDeepSpeedDoes) {
  casefile::Case c = founding_case();
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = {.world = 4, .tp = 2, .ep = 2, .etp = 1};
  c.model.swiglu = true;
  c.model.add_bias_linear = false;
  c.path.gradients.stated.clear();
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.zero_stage = 1; });
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.autotp = d.autoep = true; });
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8")) << deepspeed_refusal(c, "0.19.8").value_or("");
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.offload_optimizer = true; });
  EXPECT_NE(deepspeed_refusal(c, "0.19.8").value_or("").find("auto_ep_folding.py:249"), std::string::npos)
      << deepspeed_refusal(c, "0.19.8").value_or("");
  // Generated cases never ask for it: offload stays, the folding goes.
  for (std::uint64_t draw = 0; draw < 64; ++draw) {
    const casefile::Case within = within_deepspeed(c, "0.19.8", {}, draw, {}, false, {});
    EXPECT_FALSE(kDeepSpeedSection.of(within)->offload_optimizer && kDeepSpeedSection.of(within)->autoep && within.topology.tp > 1);
  }
}

// The worker plants the reduction faults in the engine's bucket all-reduce (ZeRO 0), and DeepSpeed
// always reduces each rank's share itself: the path's gradients.enter, which the generator gives a
// case with a reduction fault, is dropped.
TEST(DeepSpeedTarget, AReductionFaultDrawsZeroZero) {
  FaultPlants plants;
  plants.planted["grads-averaged-twice"] = "allreduce_bucket divides again";
  for (std::uint64_t draw = 0; draw < 64; ++draw) {
    casefile::Case c = founding_case();
    c.path.optimizer = vocab::OptimizerModel::plain;
    c.path.faults = vocab::FaultSet::of({vocab::Fault::grads_averaged_twice});
    c.path.gradients.before_reduction = true;
    c = within_deepspeed(std::move(c), "0.19.8", plants, draw);
    EXPECT_FALSE(c.path.gradients.before_reduction);
    ASSERT_TRUE(c.path.faults.has(vocab::Fault::grads_averaged_twice));
    EXPECT_EQ(kDeepSpeedSection.of(c)->zero_stage, 0) << "draw " << draw;
    EXPECT_FALSE(deepspeed_refusal(c, "0.19.8", plants));
  }
}

TEST(DeepSpeedTarget, RunsPipelinesAtZeroZeroAndOne) {
  casefile::Case c = founding_case();
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = {.world = 8, .tp = 2, .pp = 2};
  c.model = {};
  c.model.num_layers = 4;
  kDeepSpeedSection.set(c, DeepSpeedConfig{1, false, 128});
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.zero_stage = 2; });
  EXPECT_NE(deepspeed_refusal(c, "0.19.8").value_or("").find("ZeRO 2 and 3 are incompatible"), std::string::npos);
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.zero_stage = 0; });
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.grad_accum_fp32 = true; });
  c.path.gradients.generator.dtype = kernels::Dtype::bf16;
  EXPECT_NE(deepspeed_refusal(c, "0.19.8").value_or("").find("NotImplementedError"), std::string::npos)
      << "bf16 with fp32 accumulation needs ZeRO in a pipeline too";
  c.topology.vpp = 2;
  EXPECT_EQ(deepspeed_refusal(c, "0.19.8").value_or("").rfind("topology.vpp:", 0), 0u);
  c = founding_case();
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = {.world = 4, .pp = 2, .ep = 2};
  c.model.num_layers = 2;
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8")) << "EP 2 within each stage's two ranks";
  c.topology = {.world = 4, .pp = 4};
  c.model.num_layers = 4;
  c.model.num_experts = 2;
  c.topology.ep = 1;
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));

  casefile::Case dense = founding_case();
  dense.path.optimizer = vocab::OptimizerModel::plain;
  dense.topology = {.world = 8, .tp = 2, .pp = 2, .vpp = 2};
  dense.model = {};
  dense.model.num_layers = 8;
  ASSERT_FALSE(casefile::check_case(dense)) << *casefile::check_case(dense);
  for (std::uint64_t draw = 0; draw < 16; ++draw) {
    const casefile::Case within = within_deepspeed(dense, "0.19.8", {}, draw);
    ASSERT_FALSE(casefile::check_case(within)) << *casefile::check_case(within);
    EXPECT_FALSE(deepspeed_refusal(within, "0.19.8"));
    EXPECT_EQ(within.topology.pp, 2) << "a dense model keeps its pipeline";
    EXPECT_EQ(within.topology.vpp, 1);
    EXPECT_LE(kDeepSpeedSection.of(within)->zero_stage, 1);
  }
  c.topology = {.world = 8, .pp = 2, .ep = 8};
  c.model.num_experts = 8;
  const casefile::Case moe = within_deepspeed(c, "0.19.8", {}, 0);
  EXPECT_EQ(moe.topology.pp, 2) << "experts keep the pipeline too";
  EXPECT_EQ(moe.topology.world, 8);
  EXPECT_LE(moe.topology.ep, 4) << "EP within a stage's four ranks";
  c.topology.ep = 4;
  c.model.num_layers = 2;
  c.model.moe_layer_freq = 2;  // layer 0 has experts, layer 1 (stage 1) none
  ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);
  const casefile::Case half = within_deepspeed(c, "0.19.8", {}, 0);
  EXPECT_EQ(half.topology.pp, 1) << "a stage without MoE layers deadlocks DeepSpeed's norm: PP folds into DP";
  EXPECT_EQ(half.topology.world, 8);
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8")) << "a user may still run such a case by hand";
}

// A case of `topology` with the default small model and `experts` experts, under the plain
// optimizer the DeepSpeed target takes.
casefile::Case plain_case(topologies::ParallelConfig topology, int experts) {
  casefile::Case c = founding_case();
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = topology;
  c.model = {};
  c.model.num_experts = experts;
  return c;
}

// `c` without its deepspeed section as the generator draws it, 32 times; each one the worker runs.
std::vector<casefile::Case> drawn_for_deepspeed(casefile::Case c) {
  casefile::keep_only_section(c, "");
  std::vector<casefile::Case> drawn;
  for (std::uint64_t draw = 0; draw < 32; ++draw) {
    drawn.push_back(within_deepspeed(c, "0.19.8", {}, draw));
    EXPECT_FALSE(deepspeed_refusal(drawn.back(), "0.19.8")) << "draw " << draw;
  }
  return drawn;
}

TEST(DeepSpeedTarget, ShardsWithAutoTpOnlyWhereItsModelCan) {
  casefile::Case c = plain_case({.world = 4, .tp = 2}, 0);
  c.model.qk_layernorm = true;
  kDeepSpeedSection.set(c, DeepSpeedConfig{.zero_stage = 1, .autotp = true});
  ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));
  const auto refusal = [](casefile::Case changed) { return deepspeed_refusal(changed, "0.19.8").value_or(""); };
  casefile::Case tp1 = c;
  tp1.topology.tp = tp1.topology.etp = 1;
  EXPECT_EQ(refusal(tp1).rfind("deepspeed.autotp with topology.tp 1:", 0), 0u) << refusal(tp1);
  casefile::Case zero3 = c;
  kDeepSpeedSection.change(zero3, [&](DeepSpeedConfig& d) { d.zero_stage = 3; });
  EXPECT_FALSE(deepspeed_refusal(zero3, "0.19.8")) << "ZeRO 3 gathers AutoTP's shards for the worker's forward";
  casefile::Case piped = c;
  piped.topology = {.world = 4, .tp = 2, .pp = 2};
  piped.model.num_layers = 2;
  ASSERT_FALSE(casefile::check_case(piped)) << *casefile::check_case(piped);
  EXPECT_EQ(refusal(piped).rfind("deepspeed.autotp with topology.pp > 1:", 0), 0u) << refusal(piped);
  casefile::Case moe = c;
  moe.model.num_experts = 2;
  moe.topology.etp = 1;
  ASSERT_FALSE(casefile::check_case(moe)) << *casefile::check_case(moe);
  EXPECT_EQ(refusal(moe).rfind("deepspeed.autotp with experts:", 0), 0u) << refusal(moe);
  EXPECT_FALSE(kDeepSpeedSection.of(within_deepspeed(moe, "0.19.8", {}, 0))->autotp) << "the generator drops what AutoTP can't take";

  int autotp = 0;
  for (const casefile::Case& within : drawn_for_deepspeed(c)) autotp += kDeepSpeedSection.of(within)->autotp;
  EXPECT_GT(autotp, 4) << "AutoTP is drawn";
  EXPECT_LT(autotp, 28) << "so is the worker's own mpu";
}

TEST(DeepSpeedTarget, DrawsFusedAdamWhereItMakesZeroZeroTakeFp16Optimizer) {
  casefile::Case c = plain_case({.world = 4, .tp = 2, .ep = 2, .etp = 1}, 2);
  ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);
  int fused = 0, unfused = 0;
  for (const casefile::Case& within : drawn_for_deepspeed(c)) {
    const DeepSpeedConfig d = *kDeepSpeedSection.of(within);
    if (!d.fused_adam) {
      unfused += d.zero_stage == 0 && within.path.gradients.generator.dtype != kernels::Dtype::fp32;
      continue;
    }
    ++fused;
    EXPECT_EQ(d.zero_stage, 0) << "ZeRO's own norm does not depend on the optimizer it wraps";
    EXPECT_NE(within.path.gradients.generator.dtype, kernels::Dtype::fp32) << "fp32 at ZeRO 0 clips without it";
  }
  EXPECT_GT(fused, 0) << "FP16_Optimizer is drawn";
  EXPECT_GT(unfused, 0) << "so is FP16_UnfusedOptimizer";
  kDeepSpeedSection.set(c, DeepSpeedConfig{.fused_adam = true});
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8")) << "FusedAdam runs at every stage and precision";
}

TEST(DeepSpeedTarget, AWorkerWhoseFusedAdamDidNotBuildIsAskedForNoneAndRefusesItWithItsReason) {
  const std::map<std::string, std::string> cannot_run = {
      {"deepspeed.fused_adam", "DeepSpeed's FusedAdam op did not build on rank 0: RuntimeError: nvcc failed"}};
  casefile::Case c = plain_case({.world = 4, .tp = 2, .ep = 2, .etp = 1}, 2);
  for (std::uint64_t draw = 0; draw < 64; ++draw) {
    const casefile::Case within = within_deepspeed(c, "0.19.8", {}, draw, {}, false, cannot_run);
    EXPECT_FALSE(kDeepSpeedSection.of(within)->fused_adam) << "draw " << draw;
    EXPECT_FALSE(deepspeed_refusal(within, "0.19.8", {}, {}, false, cannot_run)) << "draw " << draw;
  }
  kDeepSpeedSection.set(c, DeepSpeedConfig{.fused_adam = true});
  EXPECT_FALSE(kDeepSpeedSection.of(within_deepspeed(c, "0.19.8", {}, 0, {}, false, cannot_run))->fused_adam)
      << "a shrink keeps within what the worker runs";
  EXPECT_EQ(deepspeed_refusal(c, "0.19.8", {}, {}, false, cannot_run),
            "deepspeed.fused_adam: tally's worker does not build DeepSpeed's FusedAdam on this machine (DeepSpeed's "
            "FusedAdam op did not build on rank 0: RuntimeError: nvcc failed)");
}

TEST(DeepSpeedTarget, OffloadsTheOptimizerAtZeroOneAndTwoOnly) {
  casefile::Case c = plain_case({.world = 4, .ep = 2, .etp = 1}, 2);
  ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);
  int offloaded = 0;
  for (const casefile::Case& within : drawn_for_deepspeed(c)) {
    if (!kDeepSpeedSection.of(within)->offload_optimizer) continue;
    ++offloaded;
    EXPECT_TRUE(kDeepSpeedSection.of(within)->zero_stage == 1 || kDeepSpeedSection.of(within)->zero_stage == 2);
  }
  EXPECT_GT(offloaded, 0) << "ZeRO-Offload is drawn";
  const auto refusal = [](casefile::Case changed) { return deepspeed_refusal(changed, "0.19.8").value_or(""); };
  kDeepSpeedSection.set(c, DeepSpeedConfig{.zero_stage = 2, .offload_optimizer = true});
  EXPECT_EQ(refusal(c), "");
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.zero_stage = 0; });
  EXPECT_EQ(refusal(c).rfind("deepspeed.offload_optimizer with zero_stage 0:", 0), 0u) << refusal(c);
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.zero_stage = 3; });
  c.model.num_experts = 0;
  c.topology.ep = 1;
  EXPECT_EQ(refusal(c).rfind("deepspeed.offload_optimizer with zero_stage 3:", 0), 0u) << refusal(c);
}

TEST(DeepSpeedTarget, DrawsExpertBiasesWithExpertTpWhichMegatronRefuses) {
  casefile::Case c = plain_case({.world = 4, .tp = 2, .ep = 2, .etp = 2}, 2);
  c.model.add_bias_linear = false;  // as tally's generator makes a model with expert TP
  ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);
  int biased = 0;
  for (const casefile::Case& within : drawn_for_deepspeed(c)) {
    if (!within.model.add_bias_linear) continue;
    ++biased;
    EXPECT_EQ(within.topology.etp, 2) << "only with expert TP";
    EXPECT_TRUE(topologies::check_megatron_expert_bias(within.model, within.topology)) << "Megatron would refuse it";
    EXPECT_FALSE(casefile::check_case(within)) << "a DeepSpeed case may have them";
  }
  EXPECT_GT(biased, 0);
  EXPECT_LT(biased, 32);
  for (std::uint64_t draw = 0; draw < 32; ++draw)
    EXPECT_FALSE(within_deepspeed(c, "0.19.8", {}, draw, {}, /*megatron_model_rules=*/true).model.add_bias_linear)
        << "a stand-in running tally's model of Megatron gets none";

  c.model.add_bias_linear = true;
  EXPECT_EQ(casefile::check_case(c).value_or("").rfind("expert biases (add_bias_linear with num_experts 2) need etp 1", 0), 0u)
      << "Megatron's rule, for every case but a DeepSpeed one";
  kDeepSpeedSection.set(c, DeepSpeedConfig{.zero_stage = 1});
  EXPECT_FALSE(casefile::check_case(c));
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));
  EXPECT_EQ(deepspeed_refusal(c, "0.19.8", {}, {}, /*megatron_model_rules=*/true).value_or("").rfind(
                "model: this worker builds models under Megatron-LM's rules", 0),
            0u);
  const casefile::Case for_stand_in = within_deepspeed(c, "0.19.8", {}, 0, {}, /*megatron_model_rules=*/true);
  EXPECT_FALSE(deepspeed_refusal(for_stand_in, "0.19.8", {}, {}, /*megatron_model_rules=*/true))
      << "a case that came with expert biases is made one such a worker builds";
}

TEST(DeepSpeedTarget, ReplacesExpertsWithAutoEpOnlyWhereItsModelCan) {
  casefile::Case c = plain_case({.world = 4, .ep = 2}, 4);
  c.model.swiglu = true;
  c.model.add_bias_linear = false;
  kDeepSpeedSection.set(c, DeepSpeedConfig{.zero_stage = 2, .autoep = true});
  ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));
  const auto refusal = [](casefile::Case changed) { return deepspeed_refusal(changed, "0.19.8").value_or(""); };
  const auto refused_by = [&](casefile::Case changed, const std::string& rule) {
    EXPECT_FALSE(casefile::check_case(changed)) << *casefile::check_case(changed);
    EXPECT_EQ(refusal(changed).rfind(rule, 0), 0u) << refusal(changed);
  };
  casefile::Case dense = c;
  dense.model.num_experts = 0;
  dense.topology.ep = 1;
  refused_by(dense, "deepspeed.autoep without experts:");
  casefile::Case ungated = c;
  ungated.model.swiglu = false;
  refused_by(ungated, "deepspeed.autoep without model.swiglu:");
  casefile::Case biased = c;
  biased.model.add_bias_linear = true;
  refused_by(biased, "deepspeed.autoep with model.add_bias_linear:");
  casefile::Case zero3 = c;
  kDeepSpeedSection.change(zero3, [&](DeepSpeedConfig& d) { d.zero_stage = 3; });
  EXPECT_FALSE(deepspeed_refusal(zero3, "0.19.8")) << "AutoEP's experts are the ones DeepSpeed runs at ZeRO 3";
  kDeepSpeedSection.change(zero3, [&](DeepSpeedConfig& d) { d.autoep = false; });
  refused_by(zero3, "deepspeed.zero_stage 3 with experts: DeepSpeed asserts");
  EXPECT_TRUE(kDeepSpeedSection.of(within_deepspeed(zero3, "0.19.8", {}, 0))->autoep) << "ZeRO 3 with experts takes AutoEP";
  casefile::Case biased_zero3 = zero3;
  biased_zero3.model.add_bias_linear = true;
  ASSERT_FALSE(casefile::check_case(biased_zero3)) << *casefile::check_case(biased_zero3);
  const casefile::Case adapted = within_deepspeed(biased_zero3, "0.19.8", {}, 0);
  EXPECT_TRUE(kDeepSpeedSection.of(adapted)->autoep) << "its experts become AutoEP's: SwiGLU without biases";
  EXPECT_EQ(kDeepSpeedSection.of(adapted)->zero_stage, 3);
  EXPECT_FALSE(adapted.model.add_bias_linear);
  EXPECT_FALSE(deepspeed_refusal(adapted, "0.19.8"));
  casefile::Case tp2 = c;
  tp2.topology.tp = 2;
  tp2.topology.ep = 1;
  refused_by(tp2, "deepspeed.autoep with topology.tp 2 without deepspeed.autotp:");
  casefile::Case folded = tp2;  // AutoEP folded over AutoTP: experts whole (ETP 1), EP > 1
  kDeepSpeedSection.change(folded, [&](DeepSpeedConfig& d) { d.autotp = true; });
  refused_by(folded, "deepspeed.autoep with deepspeed.autotp and topology.ep 1:");
  folded.topology.ep = 2;
  folded.topology.etp = 1;
  EXPECT_FALSE(deepspeed_refusal(folded, "0.19.8")) << refusal(folded);
  // fp16: a folded expert's gradient is fed times TP too (200 x DP 2 x 128 fits, x TP 2 does not)
  casefile::Case fp16 = folded;
  fp16.path.gradients.generator.dtype = kernels::Dtype::fp16;
  fp16.path.gradients.stated = {{"", topologies::ParamClass::replicated, {topologies::StatedGradient::Kind::constant, 200.0, {}}}};
  refused_by(fp16, "deepspeed.loss_scale 128 with gradients.dtype fp16:");
  kDeepSpeedSection.change(fp16, [&](DeepSpeedConfig& d) { d.loss_scale = 64; });
  EXPECT_FALSE(deepspeed_refusal(fp16, "0.19.8")) << refusal(fp16);
  casefile::Case folded_zero3 = folded;
  kDeepSpeedSection.set(folded_zero3, DeepSpeedConfig{.zero_stage = 3});
  const casefile::Case within_zero3 = within_deepspeed(folded_zero3, "0.19.8", {}, 0);
  EXPECT_TRUE(kDeepSpeedSection.of(within_zero3)->autoep && kDeepSpeedSection.of(within_zero3)->autotp)
      << "ZeRO 3 with experts at TP 2 folds AutoEP over AutoTP";
  EXPECT_EQ(kDeepSpeedSection.of(within_zero3)->zero_stage, 3);
  kDeepSpeedSection.change(folded, [&](DeepSpeedConfig& d) { d.autoep = false; });
  refused_by(folded, "deepspeed.autotp with experts:");
  kDeepSpeedSection.change(tp2, [&](DeepSpeedConfig& d) { d.zero_stage = 3; });
  EXPECT_EQ(kDeepSpeedSection.of(within_deepspeed(tp2, "0.19.8", {}, 0))->zero_stage, 2) << "ZeRO 2 where AutoEP cannot take TP";

  int autoep = 0;
  for (const casefile::Case& within : drawn_for_deepspeed(c)) {
    EXPECT_FALSE(kDeepSpeedSection.of(within)->autotp) << "TP 1: no AutoTP, AutoEP unfolded";
    autoep += kDeepSpeedSection.of(within)->autoep;
  }
  EXPECT_GT(autoep, 4) << "AutoEP is drawn";
  EXPECT_LT(autoep, 28) << "so is DeepSpeed's MoE layer";
  EXPECT_FALSE(kDeepSpeedSection.of(within_deepspeed(tp2, "0.19.8", {}, 0))->autoep) << "the generator drops what AutoEP can't take";
}

TEST(DeepSpeedTarget, Fp16GradientsStayWithinRangeAfterTheLossScale) {
  casefile::Case c = founding_case();
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = {.world = 2, .tp = 1, .ep = 2};
  c.path.gradients.generator.mode = kernels::GradientMode::normal;
  c.path.gradients.generator.dtype = kernels::Dtype::fp16;
  c.path.gradients.stated = {{"", topologies::ParamClass::replicated, {topologies::StatedGradient::Kind::scale, 64.0, {}}}};
  kDeepSpeedSection.set(c, DeepSpeedConfig{});  // loss scale 128
  ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);
  // 8.58 x 64 x DP 2 x 128 > 65504: DeepSpeed would skip the step.
  EXPECT_EQ(deepspeed_refusal(c, "0.19.8").value_or("").rfind("deepspeed.loss_scale 128 with gradients.dtype fp16:", 0), 0u)
      << deepspeed_refusal(c, "0.19.8").value_or("");
  const casefile::Case within = within_deepspeed(c, "0.19.8", {}, 0);
  EXPECT_EQ(within.path.gradients.generator.dtype, kernels::Dtype::fp16);
  EXPECT_EQ(kDeepSpeedSection.of(within)->loss_scale, 32) << "the largest power of two that fits: 8.58 x 64 x 2 x 32 < 65504";
  EXPECT_FALSE(deepspeed_refusal(within, "0.19.8"));
  c.path.gradients.stated.front().gradient = {topologies::StatedGradient::Kind::constant, 40000.0, {}};
  ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);  // 40000 x DP 2 > 65504 at loss scale 1
  const casefile::Case bf16 = within_deepspeed(c, "0.19.8", {}, 0);
  EXPECT_EQ(bf16.path.gradients.generator.dtype, kernels::Dtype::bf16);
  EXPECT_FALSE(deepspeed_refusal(bf16, "0.19.8"));
}

TEST(DeepSpeedTarget, ACaseKeepsItsWorldAndItsOwnConfiguration) {
  casefile::Case c = founding_case();
  c.topology = {.world = 8, .tp = 2, .cp = 2, .ep = 2, .etp = 1};
  kDeepSpeedSection.set(c, DeepSpeedConfig{2, false, 256});
  ASSERT_FALSE(casefile::check_case(c));
  const casefile::Case within = within_deepspeed(c, "0.19.8", {}, 0);
  EXPECT_FALSE(casefile::check_case(within));
  EXPECT_FALSE(deepspeed_refusal(within, "0.19.8"));
  EXPECT_EQ(within.topology.world, 8);
  EXPECT_EQ(within.topology.cp * within.topology.pp, 1);
  EXPECT_EQ(kDeepSpeedSection.of(within), kDeepSpeedSection.of(c)) << "a case's own configuration is kept";
}


// Issue 50: every refusal names DeepSpeed's own check it mirrors (file:line at 0.19.8) or says
// plainly that tally's worker does not build the case. One case per rule, each refused by that rule
// (its text begins with `rule`), its text holding the citation or the words its kind asks for.
// A preset without PP, AutoEP or ZeRO 3, TP through AutoTP and experts at EP 1, is built as its
// transformers class (adapters/tally_adapters/deepspeed/families.py), which has gpt-oss's sinks and
// DeepSeek-V3's multi-latent attention but no MTP layer; elsewhere the worker's own model has none.
TEST(DeepSpeedTarget, BuildsAPresetAsItsTransformersClassWithItsSinksAndLatentAttention) {
  const topologies::ParallelConfig config{.world = 4};
  casefile::Case c = founding_case();
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = config;
  c.model = *topologies::preset_model(topologies::Preset::gpt_oss, config).model;
  kDeepSpeedSection.set(c, DeepSpeedConfig{.zero_stage = 1});
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_TRUE(builds_family(c, *kDeepSpeedSection.of(c)));
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));
  EXPECT_EQ(within_deepspeed(c, "0.19.8", {}, 0).model.softmax_type, topologies::SoftmaxType::learnable);
  kDeepSpeedSection.set(c, DeepSpeedConfig{.zero_stage = 3, .autoep = true});  // not the class: no sinks there
  EXPECT_FALSE(builds_family(c, *kDeepSpeedSection.of(c)));
  EXPECT_NE(deepspeed_refusal(c, "0.19.8").value_or("").find("model.softmax_type learnable"), std::string::npos);
  EXPECT_EQ(within_deepspeed(c, "0.19.8", {}, 0).model.softmax_type, topologies::SoftmaxType::vanilla);

  c.model = *topologies::preset_model(topologies::Preset::deepseek_v3, config).model;
  kDeepSpeedSection.set(c, DeepSpeedConfig{.zero_stage = 2});
  ASSERT_FALSE(casefile::check_case(c));
  EXPECT_NE(deepspeed_refusal(c, "0.19.8").value_or("").find("DeepseekV3ForCausalLM"), std::string::npos);
  const casefile::Case within = within_deepspeed(c, "0.19.8", {}, 0);
  EXPECT_TRUE(within.model.multi_latent_attention);
  EXPECT_EQ(within.model.mtp_num_layers, 0);
  EXPECT_FALSE(deepspeed_refusal(within, "0.19.8"));
}

// AutoTP cuts a preset's transformers class by the class's own tensor-parallel plan: the engine
// configuration names only the size; the worker's own model gets its layer specs.
TEST(DeepSpeedTarget, AutoTpCutsAPresetsClassByItsOwnPlan) {
  casefile::Case c = founding_case();
  c.path.optimizer = vocab::OptimizerModel::plain;
  c.topology = {.world = 2, .tp = 2, .etp = 2};
  c.model = *topologies::preset_model(topologies::Preset::llama3, {.world = 2}).model;
  c.model.num_query_groups = 2;  // a Llama whose KV heads AutoTP can cut in two
  kDeepSpeedSection.set(c, DeepSpeedConfig{.zero_stage = 1, .autotp = true});
  ASSERT_FALSE(casefile::check_case(c));
  ASSERT_TRUE(builds_family(c, *kDeepSpeedSection.of(c)));
  EXPECT_FALSE(deepspeed_refusal(c, "0.19.8"));
  EXPECT_EQ(deepspeed_engine_config(c)["tensor_parallel"], nlohmann::ordered_json({{"autotp_size", 2}}));
  c.model.preset.clear();
  EXPECT_TRUE(deepspeed_engine_config(c)["tensor_parallel"].contains("partition_config"));
}

TEST(DeepSpeedTarget, EveryRefusalCitesDeepSpeedsCheckOrSaysTheWorkerDoesNotBuildIt) {
  enum class Says { citation, not_built, either };
  struct Row {
    std::string name;
    std::function<std::optional<std::string>()> refusal;
    std::string rule;  // how its text begins
    Says says;
  };
  const auto section = [](casefile::Case c, DeepSpeedConfig d) {
    kDeepSpeedSection.set(c, d);
    return c;
  };
  const auto refused = [](const casefile::Case& c) { return [c] { return deepspeed_refusal(c, "0.19.8"); }; };
  const casefile::Case dense = section(plain_case({.world = 4, .tp = 2}, 0), {});
  const casefile::Case moe = section(plain_case({.world = 4, .ep = 2}, 2), {});
  ASSERT_FALSE(deepspeed_refusal(dense, "0.19.8")) << *deepspeed_refusal(dense, "0.19.8");
  ASSERT_FALSE(deepspeed_refusal(moe, "0.19.8")) << *deepspeed_refusal(moe, "0.19.8");
  const auto changed = [](casefile::Case c, const std::function<void(casefile::Case&)>& change) {
    change(c);
    return c;
  };
  // AutoEP's kind of experts (SwiGLU without biases) on `topology`.
  const auto autoep_case = [&](topologies::ParallelConfig topology, int experts, DeepSpeedConfig d) {
    casefile::Case c = plain_case(topology, experts);
    c.model.swiglu = true;
    c.model.add_bias_linear = false;
    d.autoep = true;
    return section(c, d);
  };
  const auto bf16 = [](casefile::Case& c) { c.path.gradients.generator.dtype = kernels::Dtype::bf16; };
  FaultPlants no_plants;
  const std::vector<Row> rows = {
      {"custom model", refused(changed(dense, [](casefile::Case& c) { c.model.kind = topologies::ModelKind::custom; })),
       "model.kind custom:", Says::not_built},
      {"another framework's section",
       refused(changed(dense, [](casefile::Case& c) { c.sections["torchtitan"] = casefile::FrameworkSection{nlohmann::ordered_json::object(), false}; })),
       "torchtitan:", Says::not_built},
      {"gradients before the reduction",
       refused(changed(dense, [](casefile::Case& c) { c.path.gradients.before_reduction = true; })),
       "gradients.enter before_reduction:", Says::not_built},
      {"MTP", refused(changed(dense, [](casefile::Case& c) { c.model.mtp_num_layers = 1; })), "model.mtp_num_layers:",
       Says::not_built},
      {"attention sinks",
       refused(changed(dense, [](casefile::Case& c) { c.model.softmax_type = topologies::SoftmaxType::learnable; })),
       "model.softmax_type learnable:", Says::not_built},
      {"multi-latent attention",
       refused(changed(dense, [](casefile::Case& c) {
         c.model.multi_latent_attention = true;
         c.model.num_query_groups.reset();
       })),
       "model.multi_latent_attention:", Says::not_built},
      {"GTP", refused(changed(dense, [](casefile::Case& c) { c.topology.gtp = 2; })), "topology.gtp/egtp:",
       Says::not_built},
      {"CP", refused(changed(dense, [](casefile::Case& c) { c.topology.cp = 2; })), "topology.cp:", Says::not_built},
      {"VPP", refused(changed(dense, [](casefile::Case& c) { c.topology.vpp = 2; })), "topology.vpp:", Says::not_built},
      {"order", refused(changed(dense, [](casefile::Case& c) { c.topology.order = "tp-cp-ep-pp-dp"; })),
       "topology.order tp-cp-ep-pp-dp:", Says::not_built},
      {"optimizer instances", refused(changed(dense, [](casefile::Case& c) { c.topology.dist_opt_instances = 2; })),
       "topology.dist_opt_instances:", Says::not_built},
      {"ETP neither 1 nor TP",
       refused(section(plain_case({.world = 8, .tp = 4, .ep = 2, .etp = 2}, 2), {})), "topology.etp 2 with tp 4:",
       Says::not_built},
      {"EP not dividing the experts", refused(section(plain_case({.world = 4, .ep = 2}, 3), {})),
       "topology.ep 2: DeepSpeed's MoE layer asserts", Says::citation},
      {"EP not dividing a stage's ranks", refused(section(plain_case({.world = 4, .ep = 8}, 8), {})),
       "topology.ep 8: without expert TP", Says::citation},
      {"EP not dividing DP with expert TP", refused(section(plain_case({.world = 4, .tp = 2, .ep = 4, .etp = 2}, 4), {})),
       "topology.ep 4: with expert TP", Says::citation},
      {"AutoEP's EP not dividing a stage's ranks", refused(autoep_case({.world = 4, .ep = 8}, 8, {})),
       "topology.ep 8 with deepspeed.autoep: DeepSpeed raises ValueError unless", Says::citation},
      {"AutoEP's EP above the experts", refused(autoep_case({.world = 4, .ep = 4}, 2, {})),
       "topology.ep 4 with deepspeed.autoep: DeepSpeed raises ValueError, autoep_size exceeds", Says::citation},
      {"AutoEP's EP not dividing the experts", refused(autoep_case({.world = 4, .ep = 4}, 6, {})),
       "topology.ep 4 with deepspeed.autoep: DeepSpeed raises ValueError, num_experts=6", Says::citation},
      {"Megatron's optimizer model",
       refused(changed(dense, [](casefile::Case& c) { c.path.optimizer = vocab::OptimizerModel::distributed; })),
       "optimizer.model distributed:", Says::not_built},
      {"p-norms", refused(changed(dense, [](casefile::Case& c) { c.path.p_values = {1.0}; })), "statistics.p_norms:",
       Says::not_built},
      {"a fault the worker does not plant",
       [&] {
         const casefile::Case faulty = changed(dense, [](casefile::Case& c) {
           c.path.faults = vocab::FaultSet::of({vocab::Fault::grads_averaged_twice});
         });
         return deepspeed_refusal(faulty, "0.19.8", no_plants);
       },
       "faults:", Says::not_built},
      {"fp16 the accelerator lacks",
       [&] {
         const casefile::Case fp16 =
             changed(dense, [](casefile::Case& c) { c.path.gradients.generator.dtype = kernels::Dtype::fp16; });
         return deepspeed_refusal(fp16, "0.19.8", {}, {"fp32", "bf16"});
       },
       "gradients.dtype fp16: DeepSpeed's accelerator", Says::citation},
      {"bf16 the accelerator lacks",
       [&] { return deepspeed_refusal(changed(dense, bf16), "0.19.8", {}, {"fp32"}); },
       "gradients.dtype bf16: DeepSpeed's accelerator", Says::citation},
      {"fp32 the worker lacks", [&] { return deepspeed_refusal(dense, "0.19.8", {}, {"bf16"}); }, "gradients.dtype fp32:",
       Says::not_built},
      {"no deepspeed section", refused(changed(dense, [](casefile::Case& c) { casefile::keep_only_section(c, ""); })),
       "deepspeed: the case has no DeepSpeed configuration", Says::not_built},
      {"FusedAdam that did not build",
       [&] {
         return deepspeed_refusal(section(dense, {.fused_adam = true}), "0.19.8", {}, {}, false,
                                  {{"deepspeed.fused_adam", "DeepSpeed's FusedAdam op did not build"}});
       },
       "deepspeed.fused_adam:", Says::not_built},
      {"expert biases under Megatron-LM's rules",
       [&] {
         casefile::Case c = section(plain_case({.world = 4, .tp = 2, .ep = 2, .etp = 2}, 2), {});
         c.model.add_bias_linear = true;
         return deepspeed_refusal(c, "0.19.8", {}, {}, /*megatron_model_rules=*/true);
       },
       "model: this worker builds models under Megatron-LM's rules", Says::not_built},
      {"fp16 beyond its range",
       refused(changed(moe,
                       [](casefile::Case& c) {
                         c.path.gradients.generator.dtype = kernels::Dtype::fp16;
                         c.path.gradients.stated = {{"", topologies::ParamClass::replicated,
                                                     {topologies::StatedGradient::Kind::constant, 40000.0, {}}}};
                       })),
       "deepspeed.loss_scale 128 with gradients.dtype fp16:", Says::citation},
      {"AutoTP at TP 1",
       refused(section(plain_case({.world = 4}, 0), {.autotp = true})), "deepspeed.autotp with topology.tp 1:",
       Says::citation},
      {"AutoTP with PP",
       refused(changed(section(plain_case({.world = 4, .tp = 2, .pp = 2}, 0), {.autotp = true}),
                       [](casefile::Case& c) { c.model.num_layers = 2; })),
       "deepspeed.autotp with topology.pp > 1:", Says::not_built},
      {"AutoTP with DeepSpeed's MoE layer",
       refused(section(plain_case({.world = 4, .tp = 2, .ep = 2}, 2), {.autotp = true})), "deepspeed.autotp with experts:",
       Says::not_built},
      {"AutoEP with TP from an mpu", refused(autoep_case({.world = 4, .tp = 2}, 2, {})),
       "deepspeed.autoep with topology.tp 2 without deepspeed.autotp:", Says::citation},
      {"AutoEP folded with expert TP", refused(autoep_case({.world = 4, .tp = 2, .ep = 2, .etp = 2}, 2, {.autotp = true})),
       "deepspeed.autoep with deepspeed.autotp and topology.etp 2:", Says::citation},
      {"AutoEP folded at EP 1", refused(autoep_case({.world = 4, .tp = 2}, 2, {.autotp = true})),
       "deepspeed.autoep with deepspeed.autotp and topology.ep 1:", Says::citation},
      {"AutoEP folded with offload",
       refused(autoep_case({.world = 4, .tp = 2, .ep = 2}, 2, {.zero_stage = 1, .autotp = true, .offload_optimizer = true})),
       "deepspeed.offload_optimizer with deepspeed.autoep folded", Says::citation},
      {"AutoEP without experts", refused(autoep_case({.world = 4}, 0, {})), "deepspeed.autoep without experts:",
       Says::citation},
      {"AutoEP with PP",
       refused(changed(autoep_case({.world = 4, .pp = 2, .ep = 2}, 2, {}), [](casefile::Case& c) { c.model.num_layers = 2; })),
       "deepspeed.autoep with topology.pp > 1:", Says::not_built},
      {"AutoEP without SwiGLU",
       refused(changed(autoep_case({.world = 4, .ep = 2}, 2, {}), [](casefile::Case& c) { c.model.swiglu = false; })),
       "deepspeed.autoep without model.swiglu:", Says::not_built},
      {"AutoEP with expert biases",
       refused(changed(autoep_case({.world = 4, .ep = 2}, 2, {}), [](casefile::Case& c) { c.model.add_bias_linear = true; })),
       "deepspeed.autoep with model.add_bias_linear:", Says::not_built},
      {"ZeRO 3 with DeepSpeed's MoE layer", refused(section(moe, {.zero_stage = 3})),
       "deepspeed.zero_stage 3 with experts:", Says::citation},
      {"ZeRO 2 in a pipeline",
       refused(changed(section(plain_case({.world = 4, .tp = 2, .pp = 2}, 0), {.zero_stage = 2}),
                       [](casefile::Case& c) { c.model.num_layers = 2; })),
       "deepspeed.zero_stage 2 with topology.pp > 1:", Says::citation},
      {"fp32 accumulation at ZeRO 3",
       refused(changed(section(dense, {.zero_stage = 3, .grad_accum_fp32 = true}), bf16)),
       "deepspeed.grad_accum_fp32 with zero_stage 3:", Says::not_built},
      {"fp32 accumulation of fp32", refused(section(dense, {.zero_stage = 1, .grad_accum_fp32 = true})),
       "deepspeed.grad_accum_fp32 with gradients.dtype fp32:", Says::not_built},
      {"offload at ZeRO 0", refused(section(dense, {.offload_optimizer = true})),
       "deepspeed.offload_optimizer with zero_stage 0:", Says::either},
      {"offload at ZeRO 3",
       refused(section(dense, {.zero_stage = 3, .offload_optimizer = true})),
       "deepspeed.offload_optimizer with zero_stage 3:", Says::not_built},
      {"offload in a pipeline",
       refused(changed(section(plain_case({.world = 4, .tp = 2, .pp = 2}, 0), {.zero_stage = 1, .offload_optimizer = true}),
                       [](casefile::Case& c) { c.model.num_layers = 2; })),
       "deepspeed.offload_optimizer with topology.pp > 1:", Says::not_built},
      {"fp32 accumulation of bf16 at ZeRO 0",
       refused(changed(section(dense, {.grad_accum_fp32 = true}), bf16)),
       "deepspeed.grad_accum_fp32 with zero_stage 0:", Says::citation},
      {"accelerate with a pipeline",
       refused(changed(section(plain_case({.world = 4, .pp = 2}, 0), {.launcher = DeepSpeedLauncher::accelerate}),
                       [](casefile::Case& c) { c.model.num_layers = 2; })),
       "deepspeed.launcher accelerate with topology.pp > 1:", Says::citation},
      {"accelerate with TP from an mpu",
       refused(changed(section(dense, {.launcher = DeepSpeedLauncher::accelerate}), bf16)),
       "deepspeed.launcher accelerate with topology.tp 2 without deepspeed.autotp:", Says::citation},
      {"the Trainer with FusedAdam",
       refused(changed(section(plain_case({.world = 4}, 0), {.zero_stage = 1, .fused_adam = true,
                                                             .launcher = DeepSpeedLauncher::trainer}), bf16)),
       "deepspeed.launcher trainer with deepspeed.fused_adam:", Says::either},
      {"the Trainer with AutoTP",
       refused(section(dense, {.zero_stage = 1, .autotp = true, .launcher = DeepSpeedLauncher::trainer})),
       "deepspeed.launcher trainer with deepspeed.autotp:", Says::either},
      {"the Trainer with DeepSpeed's MoE layer",
       refused(changed(section(moe, {.zero_stage = 1, .launcher = DeepSpeedLauncher::trainer}), bf16)),
       "deepspeed.launcher trainer with DeepSpeed's MoE layer", Says::citation},
      {"the Trainer's bf16 without a bf16 GPU",
       [&] {
         return deepspeed_refusal(changed(section(plain_case({.world = 4}, 0), {.zero_stage = 1,
                                                                                .launcher = DeepSpeedLauncher::trainer}),
                                          bf16),
                                  "0.19.8", {}, {}, false,
                                  {{"deepspeed.launcher", "the Trainer with bf16: TrainingArguments raises ValueError "
                                                          "(transformers/training_args.py:1745-1750 at 5.18.0)"}});
       },
       "deepspeed.launcher trainer with gradients.dtype bf16:", Says::citation},
      {"accelerate at fp32 ZeRO 0",
       refused(section(plain_case({.world = 4}, 0), {.launcher = DeepSpeedLauncher::accelerate})),
       "deepspeed.launcher accelerate with gradients.dtype fp32 at zero_stage 0:", Says::citation},
  };
  const std::regex citation("[A-Za-z0-9_/]+\\.py:[0-9]+");
  const std::string not_built = "tally's worker does not build";
  for (const Row& row : rows) {
    const std::string why = row.refusal().value_or("");
    EXPECT_EQ(why.rfind(row.rule, 0), 0u) << row.name << ": " << why;
    const bool cites = std::regex_search(why, citation), says = why.find(not_built) != std::string::npos;
    if (row.says == Says::citation) {
      EXPECT_TRUE(cites) << row.name << ": " << why;
    }
    if (row.says == Says::not_built) {
      EXPECT_TRUE(says) << row.name << ": " << why;
    }
    EXPECT_TRUE(cites || says) << row.name << ": " << why;
  }
}

}  // namespace
}  // namespace tally::run
