#include "run/run_case.h"
#include "fuzz/generators.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "casefile/case_file.h"
#include "fuzz/sweep.h"
#include "run/target.h"
#include "tests/support/config_gen.h"
#include "tests/support/show.h"
#include "topologies/presets.h"
#include "topologies/rank_layout.h"

namespace tally::fuzz {

inline void showValue(const casefile::Case& c, std::ostream& os) {
  os << topologies::describe(c.topology) << ", vpp " << c.topology.vpp << ", instances "
     << c.topology.dist_opt_instances << "\n"
     << topologies::describe(c.model) << "\noptimizer "
     << vocab::optimizer_model_name(c.path.optimizer) << ", "
     << kernels::mode_name(c.path.gradients.generator.mode) << " "
     << kernels::dtype_name(c.path.gradients.generator.dtype) << ", faults "
     << vocab::fault_list(c.path.faults);
}

namespace {

using topologies::ParallelConfig;

CaseGenOptions fault_free(int max_world) {
  CaseGenOptions o;
  o.topology.max_world = max_world;
  return o;
}

// Megatron-LM's assumption, checked the slow way: every rank's index in its TP group equals its
// index in its ETP group, and the groups hold the same ranks.
// Whether every rank's group of `dense` is its group of `expert`, at the same index.
bool same_groups(const ParallelConfig& c, topologies::Family dense, topologies::Family expert) {
  const topologies::RankLayout layout(c);
  for (int rank = 0; rank < c.world; ++rank) {
    if (layout.index_in(dense, rank) != layout.index_in(expert, rank)) return false;
    const std::span<const int> a = layout.group_ranks(dense, rank);
    const std::span<const int> b = layout.group_ranks(expert, rank);
    if (!std::equal(a.begin(), a.end(), b.begin(), b.end())) return false;
  }
  return true;
}

RC_GTEST_PROP(Generators, CasesAreValid, ()) {
  CaseGenOptions o;
  o.topology.max_world = *rc::gen::element(1, 8, 64, 256);
  o.topology.grow_with_size = *rc::gen::arbitrary<bool>();
  for (const vocab::FaultInfo& info : vocab::fault_catalog())
    if (*rc::gen::arbitrary<bool>()) o.faults.push_back(info.fault);
  o.big_zeros_one_in = 10;
  const casefile::Case c = *gen_case(o);
  const std::optional<std::string> error = casefile::check_case(c);
  RC_ASSERT(!error);
  RC_ASSERT(c.topology.world <= o.topology.max_world);
  RC_ASSERT(megatron_layout_assumptions_hold(c.topology));
  RC_ASSERT(c.path.faults.count() == (o.faults.empty() ? 0 : 1));
}

RC_GTEST_PROP(Generators, ConfigsRespectTheirBounds, ()) {
  TopologyGenOptions o;
  o.max_world = *rc::gen::inRange(1, 200);
  o.max_axis = *rc::gen::inRange(0, 5);
  o.max_vpp = *rc::gen::inRange(1, 4);
  o.grow_with_size = false;
  o.avoid_megatron_corners = *rc::gen::arbitrary<bool>();
  const ParallelConfig c = *gen_config(o);
  RC_ASSERT(!topologies::check_config(c));
  RC_ASSERT(c.world <= o.max_world);
  if (o.max_axis > 0)
    for (int size : {c.tp, c.cp, c.pp, topologies::dp(c)}) RC_ASSERT(size <= o.max_axis);
  RC_ASSERT(c.vpp <= o.max_vpp);
  if (c.dist_opt_instances > 1) RC_ASSERT(c.order == topologies::kDefaultOrder);
  if (o.avoid_megatron_corners) RC_ASSERT(megatron_layout_assumptions_hold(c));
}

// The stride test of megatron_layout_assumptions_hold against the rank layout itself.
RC_GTEST_PROP(Generators, LayoutAssumptionAgreesWithTheRankLayout, ()) {
  const ParallelConfig c = *testing::valid_config(4);
  const bool dense_experts = c.ep == 1 && c.etp == c.tp && c.egtp == c.gtp;
  const bool expected =
      !(c.dist_opt_instances > 1 && c.order != topologies::kDefaultOrder) &&
      (!dense_experts || (same_groups(c, topologies::Family::tp, topologies::Family::expt_tp) &&
                          same_groups(c, topologies::Family::gtp, topologies::Family::expt_gtp)));
  RC_ASSERT(megatron_layout_assumptions_hold(c) == expected);
}

// The instances corner, exactly: over every layout of world 8 with every number of
// distributed-optimizer instances it allows, tally's model of Megatron's distributed optimizer (no
// fault, dense and MoE) miscounts exactly where the instances' stats groups split their shards, and
// never in Megatron-LM's two orders.
TEST(Generators, InstancesSplitTheirShardsExactlyWhereTheFaultFreeModelMiscounts) {
  int split = 0, whole = 0;
  for (const SweepLayout& layout : sweep_layouts(8).layouts) {
    const int dp_cp = topologies::dp(layout.config) * layout.config.cp;
    for (int k = 2; k <= dp_cp; ++k) {
      ParallelConfig c = layout.config;
      c.dist_opt_instances = k;
      if (dp_cp % k != 0 || topologies::check_config(c) || experts_as_dense_with_other_groups(c)) continue;
      const bool splits = instances_split_their_shards(c);
      if (c.order == topologies::kDefaultOrder || c.order == "tp-cp-ep-pp-dp") EXPECT_FALSE(splits) << topologies::describe(c);
      (splits ? split : whole) += 1;
      for (SweepFeature feature : {SweepFeature::dense, SweepFeature::moe}) {
        const SweepModel model = sweep_model(c, feature);
        if (!model.model) continue;
        casefile::Case kase;
        kase.topology = c;
        kase.model = *model.model;
        kase.path.optimizer = vocab::OptimizerModel::distributed;
        kase.path.gradients.generator.mode = kernels::GradientMode::ones;
        kase.path.max_norm = 1.0;
        if (casefile::check_case(kase)) continue;
        EXPECT_EQ(run::run_case(kase).kind == oracle::Verdict::Kind::pass, !splits)
            << topologies::describe(c) << " (" << sweep_feature_name(feature) << ")";
      }
    }
  }
  EXPECT_GT(split, 0);
  EXPECT_GT(whole, 0);
}

// The fault-free property: with no fault switched on, every generated case passes.
RC_GTEST_PROP(Generators, FaultFreeCasesPass, ()) {
  CaseGenOptions o = fault_free(*rc::gen::element(4, 16, 64));
  o.big_zeros_one_in = 0;  // 75 ms each
  const casefile::Case c = *gen_case(o);
  const oracle::Verdict verdict = run::run_case(c);
  RC_ASSERT(verdict.kind == oracle::Verdict::Kind::pass);
}

// Every generated case survives its case file: written, read back, the same case.
RC_GTEST_PROP(Generators, CasesRoundTripThroughCaseFiles, ()) {
  CaseGenOptions o;
  for (const vocab::FaultInfo& info : vocab::fault_catalog())
    if (*rc::gen::arbitrary<bool>()) o.faults.push_back(info.fault);
  o.big_zeros_one_in = 10;
  casefile::Case c = *gen_case(o);
  if (*rc::gen::arbitrary<bool>()) c.expect = casefile::Expectation{};
  const casefile::Case back = casefile::case_from_text(casefile::case_to_text(c), "generated", run::case_frameworks());
  RC_ASSERT(back == c);
}

// The size parameter bounds the world: size 0 gives one rank, size 100 up to max_world.
TEST(Generators, WorldGrowsWithSize) {
  CaseGenOptions o = fault_free(64);
  int largest = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    EXPECT_EQ(gen_case(o)(rc::Random(seed), 0).value().topology.world, 1);
    EXPECT_LE(gen_case(o)(rc::Random(seed), 50).value().topology.world, 8);
    largest = std::max(largest, gen_case(o)(rc::Random(seed), 100).value().topology.world);
  }
  EXPECT_GT(largest, 16);
  EXPECT_LE(largest, 64);
}

// Over a campaign's worth of cases, every axis, order kind and model feature the faults need
// shows up, in reasonable proportions.
TEST(Generators, CoverEveryAxisAndFeature) {
  const CaseGenOptions o = fault_free(64);
  std::map<std::string, int> seen;
  std::set<std::string> orders;
  const int n = 3000;
  for (int i = 0; i < n; ++i) {
    const casefile::Case c = generate_case(o, 11, i).value();
    const ParallelConfig& t = c.topology;
    const topologies::ModelSpec& m = c.model;
    orders.insert(t.order);
    seen["tp>1"] += t.tp > 1;
    seen["cp>1"] += t.cp > 1;
    seen["pp>1"] += t.pp > 1;
    seen["dp>1"] += topologies::dp(t) > 1;
    seen["ep>1"] += t.ep > 1;
    seen["etp!=tp"] += t.etp != t.tp;
    seen["ep>1,tp>1,etp=1"] += t.ep > 1 && t.tp > 1 && t.etp == 1;
    seen["vpp>1"] += t.vpp > 1;
    seen["instances>1"] += t.dist_opt_instances > 1;
    seen["order!=default"] += t.order != topologies::kDefaultOrder;
    seen["world>=32"] += t.world >= 32;
    seen["odd world"] += t.world % 2 == 1 && t.world > 1;
    seen["custom"] += m.kind == topologies::ModelKind::custom;
    seen["moe"] += m.num_experts > 0;
    seen["expert biases"] += m.kind == topologies::ModelKind::gpt && m.num_experts > 0 && m.add_bias_linear;
    seen["attention sink"] += m.softmax_type == topologies::SoftmaxType::learnable;
    seen["mtp"] += m.mtp_num_layers > 0;
    seen["tied, pp>1"] += m.kind == topologies::ModelKind::gpt && !m.untie_embeddings_and_output_weights && t.pp > 1;
    seen["uneven stages"] += m.first_stage_layers.has_value() || m.last_stage_layers.has_value();
    seen["shared expert"] += m.moe_shared_expert_intermediate_size > 0;
    for (int k = 0; k < vocab::kOptimizerModelCount; ++k)
      seen["optimizer " + std::string(vocab::optimizer_models()[k].name)] +=
          c.path.optimizer == vocab::optimizer_models()[k].model;
    seen["fp32 accumulation"] += c.path.accumulation == kernels::Accumulation::fp32;
    seen["bf16"] += c.path.gradients.generator.dtype == kernels::Dtype::bf16;
    seen["buckets"] += c.path.bucket_elements > 0;
    seen["p-norms"] += !c.path.p_values.empty();
    seen["no clipping"] += c.path.max_norm == 0.0;
    seen["class-selective"] += c.path.gradients.class_mask != ~std::uint32_t{0};
  }
  for (const auto& [what, count] : seen) {
    EXPECT_GE(count, n / 100) << what;
    EXPECT_LE(count, n * 95 / 100) << what;
  }
  EXPECT_EQ(seen.size(), 30u);
  EXPECT_GE(orders.size(), 30u);
}

// The big-zeros scenario (the trigger of zero-count-in-float32, a thousand times the cost of a
// usual case): one case in 20 when that is the case's fault, about one in 20,000 otherwise.
TEST(Generators, BigZerosMostlyForItsFault) {
  auto big_zeros = [](const CaseGenOptions& o, int n) {
    int count = 0;
    for (int i = 0; i < n; ++i) {
      const casefile::Case c = generate_case(o, 2, i).value();
      if (c.model.params.empty() || c.model.params.front().name != "big") continue;
      ++count;
      EXPECT_EQ(c.model.params.front().shape, std::vector<std::int64_t>{kBigZerosElements});
      EXPECT_EQ(c.path.gradients.generator.mode, kernels::GradientMode::zeros);
      EXPECT_LE(c.topology.world, 4);
    }
    return count;
  };
  CaseGenOptions targeted;
  targeted.faults = {vocab::Fault::zero_count_in_float32};
  const int found = big_zeros(targeted, 2000);
  EXPECT_GE(found, 60);
  EXPECT_LE(found, 160);
  EXPECT_LE(big_zeros(CaseGenOptions{}, 2000), 2);
  CaseGenOptions other = targeted;
  other.faults = {vocab::Fault::no_dedup_filter};
  EXPECT_LE(big_zeros(other, 2000), 2);
}

// A campaign of presets: every case's model is one of them exactly as it lays out on the case's
// configuration, both are drawn, the cases are valid, and their shrinks stay presets.
TEST(Generators, PresetCampaignsDrawOnlyThePresetsOnTheirConfigurations) {
  CaseGenOptions o = fault_free(64);
  o.presets = {topologies::Preset::gpt_oss, topologies::Preset::llama3};
  o.big_zeros_one_in = 1;  // never with presets: they are GPT models
  std::map<std::string, int> drawn;
  for (int i = 0; i < 400; ++i) {
    const rc::Shrinkable<casefile::Case> shrinkable = generate_case(o, 9, i);
    const casefile::Case c = shrinkable.value();
    ASSERT_FALSE(casefile::check_case(c)) << *casefile::check_case(c);
    ++drawn[c.model.preset];
    const std::optional<topologies::Preset> preset = topologies::preset_from_name(c.model.preset);
    ASSERT_TRUE(preset) << "case " << i << "'s model is no preset: '" << c.model.preset << "'";
    const topologies::PresetModel expected = topologies::preset_model(*preset, c.topology);
    ASSERT_TRUE(expected.model) << c.model.preset << ": " << expected.why_none;
    EXPECT_TRUE(*expected.model == c.model) << "case " << i;
    if (i % 40 == 0)
      if (rc::Maybe<rc::Shrinkable<casefile::Case>> shrunk = shrinkable.shrinks().next())
        EXPECT_TRUE(shrunk->value().model.preset == "gpt-oss" || shrunk->value().model.preset == "llama3");
  }
  EXPECT_EQ(drawn.size(), 2u);
  EXPECT_GE(drawn["gpt-oss"], 120);
  EXPECT_GE(drawn["llama3"], 120);
}

// casefile::Case i of a campaign is a function of (seed, i) alone.
TEST(Generators, SameSeedSameCases) {
  const CaseGenOptions o = fault_free(64);
  int differ = 0;
  for (int i = 0; i < 50; ++i) {
    const casefile::Case c = generate_case(o, 5, i).value();
    EXPECT_TRUE(generate_case(o, 5, i).value() == c) << "case " << i;
    differ += !(generate_case(o, 6, i).value() == c);
  }
  EXPECT_GE(differ, 45);
}

// Shrinking walks towards the simplest choice: the minimal shrink of every case is the
// smallest case (one rank, default order, one layer) when any failure will do.
TEST(Generators, EveryCaseShrinksToTheSimplest) {
  const CaseGenOptions o = fault_free(64);
  for (int i = 90; i < 100; ++i) {
    rc::Shrinkable<casefile::Case> current = generate_case(o, 3, i);
    for (int steps = 0; steps < 10000; ++steps) {
      rc::Maybe<rc::Shrinkable<casefile::Case>> first = current.shrinks().next();
      if (!first) break;
      current = *first;
    }
    const casefile::Case c = current.value();
    EXPECT_EQ(c.topology.world, 1);
    EXPECT_EQ(c.topology.order, topologies::kDefaultOrder);
    EXPECT_EQ(c.model.kind, topologies::ModelKind::gpt);
    EXPECT_EQ(c.model.num_layers, 1);
    EXPECT_EQ(c.model.num_experts, 0);
    EXPECT_EQ(c.path.optimizer, vocab::OptimizerModel::plain);
    EXPECT_EQ(c.path.gradients.generator.mode, kernels::GradientMode::ones);
  }
}

}  // namespace
}  // namespace tally::fuzz
