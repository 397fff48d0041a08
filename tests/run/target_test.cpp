// The table of real targets (run/target.h): every framework the case reader knows has a row, and
// each row's rules are the framework's.
#include <gtest/gtest.h>

#include <algorithm>

#include "casefile/case_file.h"
#include "run/target.h"
#include "tests/support/founding_case.h"

namespace tally::run {
namespace {

using testing::founding_case;

TEST(FrameworkTargets, EveryFrameworkACaseFileMayNameHasARowAndNoOther) {
  std::vector<std::string> rows, known;
  for (const FrameworkTarget* t : framework_targets()) rows.emplace_back(t->name);
  for (std::string_view name : casefile::kKnownFrameworks) known.emplace_back(name);
  std::sort(rows.begin(), rows.end());
  std::sort(known.begin(), known.end());
  EXPECT_EQ(rows, known);
  EXPECT_EQ(framework_target("paddle"), nullptr);
}

TEST(FrameworkTargets, ACaseBelongsToItsTargetSectionOrToTheSectionItHolds) {
  casefile::Case c = founding_case();
  EXPECT_EQ(framework_of(c), nullptr) << "a case of tally's model";
  c.deepspeed = casefile::DeepSpeedConfig{};
  ASSERT_NE(framework_of(c), nullptr);
  EXPECT_EQ(framework_of(c)->name, "deepspeed");
  c.deepspeed.reset();
  c.target = casefile::RealTarget{"megatron-core", "0.19.2", ""};
  ASSERT_NE(framework_of(c), nullptr);
  EXPECT_EQ(framework_of(c)->name, "megatron-core");
}

TEST(FrameworkTargets, DeepSpeedIsSentEveryKeyOfItsConfigurationMegatronNone) {
  casefile::Case c = founding_case();
  c.topology.ep = 1;
  c.deepspeed = casefile::DeepSpeedConfig{};
  c.deepspeed->zero_stage = 3;
  const std::optional<nlohmann::ordered_json> config = framework_target("deepspeed")->engine_config(c);
  ASSERT_TRUE(config);
  EXPECT_EQ((*config)["zero_optimization"]["stage"], 3);
  EXPECT_EQ((*config)["zero_optimization"]["stage3_param_persistence_threshold"], 0);
  EXPECT_EQ((*config)["zero_allow_untested_optimizer"], true);
  EXPECT_TRUE(config->contains("steps_per_print"));
  EXPECT_FALSE(framework_target("megatron-core")->engine_config(c));
}

TEST(FrameworkTargets, AFlagsCaseGetsTheTargetsOwnSection) {
  const casefile::Case c = founding_case();
  EXPECT_TRUE(framework_target("deepspeed")->from_flags(c).deepspeed);
  EXPECT_FALSE(framework_target("megatron-core")->from_flags(c).deepspeed);
}

// A framework's section is stated once, in its own row: every other target refuses a case holding
// it through the table (other_frameworks_section), naming the target that runs it, and the case
// belongs to that framework. So adding a framework adds a row and edits no other framework's files.
TEST(FrameworkTargets, AFrameworksSectionIsRefusedByEveryOtherTargetThroughTheTable) {
  casefile::Case plain = founding_case();
  for (const FrameworkTarget* t : framework_targets()) EXPECT_FALSE(t->own_section(plain)) << t->name;
  for (const FrameworkTarget* owner : framework_targets()) {
    // The case the row's flags make, or, for a framework whose flags add no section (megatron-core),
    // one that holds what only it runs.
    casefile::Case c = owner->from_flags(plain);
    if (!owner->own_section(c)) c.megatron_fsdp = casefile::MegatronFsdpConfig{};
    const std::optional<std::string> section = owner->own_section(c);
    ASSERT_TRUE(section) << owner->name;
    EXPECT_NE(section->find("--target " + std::string(owner->name)), std::string::npos) << *section;
    ASSERT_NE(framework_of(c), nullptr);
    EXPECT_EQ(framework_of(c)->name, owner->name);
    for (const FrameworkTarget* other : framework_targets()) {
      if (other == owner) {
        EXPECT_FALSE(other_frameworks_section(c, other->name)) << owner->name;
        continue;
      }
      EXPECT_EQ(other_frameworks_section(c, other->name), section) << owner->name << " under " << other->name;
    }
  }
}

}  // namespace
}  // namespace tally::run
