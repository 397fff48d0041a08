// The table of real targets (run/target.h): every framework the case reader knows has a row, and
// each row's rules are the framework's.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "casefile/case_file.h"
#include "run/deepspeed/section.h"
#include "run/megatron_core/section.h"
#include "run/target.h"
#include "tests/support/founding_case.h"

namespace tally::run {
namespace {

using testing::founding_case;

TEST(FrameworkTargets, TheCaseReaderKnowsEachRowsNameAndSectionAndNoOther) {
  std::vector<std::string_view> rows, read;
  for (const FrameworkTarget* t : framework_targets()) rows.push_back(t->name);
  for (const casefile::FrameworkSchema& f : case_frameworks()) read.push_back(f.name);
  EXPECT_EQ(rows, read);
  EXPECT_EQ(framework_target("paddle"), nullptr);
  std::set<std::string_view> keys;
  for (const FrameworkTarget* t : framework_targets()) {
    if (t->section.empty()) continue;
    EXPECT_TRUE(keys.insert(t->section).second) << t->section << " is two rows' section";
    ASSERT_NE(t->read_section, nullptr) << t->name;
    // An empty section reads as the framework's defaults, and the case then belongs to it.
    const casefile::Case c = casefile::case_from_text(
        R"({"tally_case": 1, "topology": {"world": 2}, "model": {"num_layers": 1}, ")" + std::string(t->section) + R"(": {}})",
        "section.json", case_frameworks());
    ASSERT_TRUE(casefile::section_settings(c, t->section)) << t->name;
    EXPECT_EQ(c.sections.at(std::string(t->section)).own_models, t->own_models) << t->name;
    ASSERT_NE(framework_of(c), nullptr) << t->name;
    EXPECT_EQ(framework_of(c)->name, t->name);
  }
}

TEST(FrameworkTargets, ACaseBelongsToItsTargetSectionOrToTheSectionItHolds) {
  casefile::Case c = founding_case();
  EXPECT_EQ(framework_of(c), nullptr) << "a case of tally's model";
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  ASSERT_NE(framework_of(c), nullptr);
  EXPECT_EQ(framework_of(c)->name, "deepspeed");
  casefile::keep_only_section(c, "");
  c.target = casefile::RealTarget{"megatron-core", "0.19.2", ""};
  ASSERT_NE(framework_of(c), nullptr);
  EXPECT_EQ(framework_of(c)->name, "megatron-core");
}

TEST(FrameworkTargets, DeepSpeedIsSentEveryKeyOfItsConfigurationMegatronNone) {
  casefile::Case c = founding_case();
  c.topology.ep = 1;
  kDeepSpeedSection.set(c, DeepSpeedConfig{});
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.zero_stage = 3; });
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
  EXPECT_TRUE(kDeepSpeedSection.of(framework_target("deepspeed")->from_flags(c)));
  EXPECT_FALSE(kDeepSpeedSection.of(framework_target("megatron-core")->from_flags(c)));
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
    if (!owner->own_section(c)) kMegatronFsdpSection.set(c, MegatronFsdpConfig{});
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
