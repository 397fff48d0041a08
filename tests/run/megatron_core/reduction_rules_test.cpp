// Gradients before megatron-core's own reduction (gradients.enter before_reduction,
// run/megatron_core/rules.h): the groups tally deals each gradient over, the cases the worker
// refuses with the reason, the generated cases that take it, the case file's field, and what
// tally's model and the release's model do with such a case.
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "run/deepspeed/rules.h"
#include "run/megatron_core/rules.h"
#include "run/megatron_core/section.h"
#include "run/megatron_core/target_row.h"
#include "run/target.h"
#include "tests/support/worker_rule_cases.h"

namespace tally::run {
namespace {

// The founding case (TP 2, EP 2, ETP 1, world 2) with its gradients before the reduction.
casefile::Case unreduced_case() {
  casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.pass.json", case_frameworks());
  c.expect.reset();
  c.path.gradients.before_reduction = true;
  return c;
}

casefile::Case with_topology(casefile::Case c, int world, int tp, int pp, int ep) {
  c.topology.world = world;
  c.topology.tp = tp;
  c.topology.pp = pp;
  c.topology.ep = ep;
  c.topology.etp = 1;
  return c;
}

bool starts_with(const std::optional<std::string>& text, std::string_view prefix) {
  return text && text->rfind(prefix, 0) == 0;
}

TEST(MegatronCoreReduction, GroupsAreDpCpAndExpertDpDividedByDpCp) {
  casefile::Case c = with_topology(unreduced_case(), 8, 2, 1, 2);  // DP 4, expert DP 4
  c.model.num_experts = 4;
  EXPECT_EQ(megatron_core_reduction_groups(c), (ReductionGroups{{4}, 4}));
  c = with_topology(c, 8, 1, 1, 4);  // DP 8, expert DP 2
  EXPECT_EQ(megatron_core_reduction_groups(c), (ReductionGroups{{8, 2}, 8}));
  c.model.num_experts = 0;
  EXPECT_EQ(megatron_core_reduction_groups(c), (ReductionGroups{{8}, 8}));
}

TEST(MegatronCoreReduction, ATiedEmbeddingAcrossStagesAndQkLayernormsAcrossTp) {
  casefile::Case c = with_topology(unreduced_case(), 8, 2, 2, 1);  // DP 2
  c.model.num_experts = 0;
  c.model.num_layers = 2;
  EXPECT_EQ(megatron_core_reduction_groups(c), (ReductionGroups{{2, 4}, 2}));
  c.model.untie_embeddings_and_output_weights = true;
  EXPECT_EQ(megatron_core_reduction_groups(c), (ReductionGroups{{2}, 2}));
  c.model.qk_layernorm = true;
  EXPECT_EQ(megatron_core_reduction_groups(c), (ReductionGroups{{2, 4}, 2}));
  c.topology.pp = 1;
  c.topology.tp = 4;
  EXPECT_EQ(megatron_core_reduction_groups(c), (ReductionGroups{{2, 8}, 2}));
}

TEST(MegatronCoreReduction, NoGroupsWhereTheGradientsEnterAfterIt) {
  casefile::Case c = unreduced_case();
  c.path.gradients.before_reduction = false;
  EXPECT_EQ(megatron_core_reduction_groups(c), std::nullopt);
  EXPECT_EQ(megatron_core_target().reduction_groups(c), std::nullopt);
}

TEST(MegatronCoreReduction, RefusedWhereTheSharesCannotBeExactOrTheReductionIsNotRun) {
  casefile::Case c = unreduced_case();
  c.model.add_bias_linear = false;
  ASSERT_EQ(megatron_core_refusal(c, "0.19.2"), std::nullopt);
  EXPECT_TRUE(starts_with(megatron_core_refusal(c, "0.16.1"),
                          "gradients.enter before_reduction: tally's worker does not build it with megatron-core 0.16.1"));

  casefile::Case three = with_topology(c, 6, 2, 1, 1);  // DP 3
  EXPECT_TRUE(starts_with(megatron_core_refusal(three, "0.19.2"), "gradients.enter before_reduction at DP x CP 3:"));

  casefile::Case fsdp = with_topology(c, 2, 1, 1, 1);
  fsdp.path.optimizer = vocab::OptimizerModel::distributed;
  kMegatronFsdpSection.set(fsdp, {});
  EXPECT_EQ(megatron_core_refusal(fsdp, "0.19.2"), std::nullopt) << "Megatron-FSDP's own reduction runs too";
  EXPECT_TRUE(starts_with(megatron_core_refusal(with_topology(fsdp, 6, 2, 1, 1), "0.19.2"),
                          "gradients.enter before_reduction at DP x CP 3:"));

  const std::map<std::string, std::string> declined{{"gradients.enter", "a stand-in"}};
  EXPECT_EQ(megatron_core_refusal(c, "0.19.2", {}, declined),
            "gradients.enter before_reduction: tally's worker does not build megatron-core's own gradient reduction "
            "on this machine: a stand-in");
}

// tally's model runs it too (gradnorm/reduction.h), so the field is no framework's section; the
// other frameworks reduce in their own ways and say so.
TEST(MegatronCoreReduction, MegatronCoreAndTallysModelRunIt) {
  const casefile::Case c = unreduced_case();
  EXPECT_EQ(framework_of(c), nullptr);
  EXPECT_FALSE(other_frameworks_section(c, "deepspeed"));
  EXPECT_TRUE(starts_with(deepspeed_refusal(c, "0.19.8"), "gradients.enter before_reduction:"));
  // The release's model of it reduces too, over the groups the release's layout gives each param;
  // where tally's model cannot reduce (DP x CP 3), it is the norm of the reduced gradients.
  const std::optional<casefile::Case> model = megatron_core_target().release_model_case(c, "0.19.2");
  ASSERT_TRUE(model);
  EXPECT_TRUE(model->path.gradients.before_reduction);
  casefile::Case odd = c;
  odd.topology = {.world = 3};
  const std::optional<casefile::Case> odd_model = megatron_core_target().release_model_case(odd, "0.19.2");
  ASSERT_TRUE(odd_model);
  EXPECT_FALSE(odd_model->path.gradients.before_reduction);
}

TEST(MegatronCoreReduction, TheCaseFileWritesTheFieldOnlyWhenBefore) {
  const casefile::Case c = unreduced_case();
  const std::string text = casefile::case_to_text(c);
  EXPECT_NE(text.find("\"enter\": \"before_reduction\""), std::string::npos);
  EXPECT_EQ(casefile::case_from_text(text, "unreduced", case_frameworks()), c);
  casefile::Case after = c;
  after.path.gradients.before_reduction = false;
  EXPECT_EQ(casefile::case_to_text(after).find("\"enter\""), std::string::npos);
  std::string bad = text;
  bad.replace(bad.find("\"before_reduction\""), 18, "\"during\"");
  try {
    casefile::case_from_text(bad, "bad", case_frameworks());
    FAIL() << "a gradients.enter of \"during\" was read";
  } catch (const casefile::CaseFileError& error) {
    EXPECT_NE(std::string(error.what()).find("case.gradients.enter"), std::string::npos) << error.what();
  }
}

RC_GTEST_PROP(MegatronCoreReduction, GeneratedCasesTakeItOnlyWhereTheWorkerRunsIt, ()) {
  const int world = *rc::gen::element(2, 4, 6, 8);
  const std::string version = *rc::gen::element<std::string>("0.16.1", "0.19.2");
  const casefile::Case c = *fuzz::gen_case(testing::gpt_cases_within(world, [&version](casefile::Case c, std::uint64_t draw) {
    return within_megatron_core(std::move(c), version, {}, draw);
  }));
  RC_ASSERT(!megatron_core_refusal(c, version));
  if (c.path.gradients.before_reduction) RC_ASSERT(version == "0.19.2");
}

TEST(MegatronCoreReduction, AboutHalfTheCasesTheWorkerReducesTakeIt) {
  int before = 0, draws = 0;
  for (std::uint64_t draw = 0; draw < 800; draw += 5) {  // a multiple of 5 draws Megatron-FSDP
    casefile::Case c = unreduced_case();
    c.path.gradients.before_reduction = false;
    c = within_megatron_core(std::move(c), "0.19.2", {}, draw + 1);
    before += c.path.gradients.before_reduction;
    ++draws;
  }
  EXPECT_GT(before, draws / 3);
  EXPECT_LT(before, 2 * draws / 3);
  // A worker that says it cannot run it gets none.
  casefile::Case c = unreduced_case();
  c = within_megatron_core(std::move(c), "0.19.2", {}, 81, {{"gradients.enter", "a stand-in"}});
  EXPECT_FALSE(c.path.gradients.before_reduction);
}

TEST(MegatronCoreReduction, ASweepRunsDdpTheDistributedOptimizerAndMegatronFsdpOnUnreducedGradients) {
  casefile::Case base = unreduced_case();
  base.path.gradients.before_reduction = false;
  std::set<std::string> unreduced;
  for (const auto& [name, c] : megatron_core_target().sweep_variants(base))
    if (c.path.gradients.before_reduction) unreduced.insert(name);
  EXPECT_EQ(unreduced, (std::set<std::string>{"plain-unreduced", "distributed-unreduced", "fsdp-no_shard-unreduced",
                                              "fsdp-optim-unreduced", "fsdp-optim_grads-unreduced",
                                              "fsdp-optim_grads_params-unreduced"}));
}

}  // namespace
}  // namespace tally::run
