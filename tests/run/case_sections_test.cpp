// Case files through the real frameworks' sections (run::case_frameworks()): every checked-in seed
// reads and writes back to the same bytes, and each framework's section reads strictly, round trips
// and is written where earlier case files had it.
#include <gtest/gtest.h>

#include <filesystem>

#include "casefile/case_file.h"
#include "run/automodel/section.h"
#include "run/deepspeed/section.h"
#include "run/megatron_core/section.h"
#include "run/target.h"
#include "tests/support/files.h"
#include "run/torchtitan/section.h"
#include "tests/support/founding_case.h"
#include "vocab/faults.h"

namespace tally::run {
namespace {

namespace fs = std::filesystem;

TEST(CaseSections, SeedsAreCanonical) {
  // Every checked-in seed reads, and writing it back gives the same bytes (its digest stays).
  const fs::path seeds = fs::path(TALLY_SOURCE_DIR) / "seeds";
  int count = 0, with_a_section = 0;
  for (auto it = fs::recursive_directory_iterator(seeds); it != fs::recursive_directory_iterator(); ++it) {
    const fs::directory_entry& entry = *it;
    if (entry.path().extension() == ".manifests") {  // a real target's saved manifests
      it.disable_recursion_pending();
      continue;
    }
    // A finding file states a finding beside its saved runs (fuzz/findings.h): no case.
    if (entry.path().extension() != ".json" || entry.path().filename().string().ends_with(".finding.json")) continue;
    const std::string text = testing::text_of(entry.path());
    const casefile::Case c = casefile::case_from_text(text, entry.path().string(), case_frameworks());
    EXPECT_EQ(casefile::case_to_text(c), text) << entry.path();
    ++count;
    with_a_section += !c.sections.empty();
  }
  EXPECT_GE(count, 2 * (vocab::kFaultCount - 1) + 4);
  EXPECT_GT(with_a_section, 0) << "seeds/real holds DeepSpeed's, torchtitan's and Automodel's cases";
}

std::string error_of(const std::string& section) {
  try {
    casefile::case_from_text(
        R"({"tally_case": 1, "topology": {"world": 2}, "model": {"num_layers": 1}, )" + section + "}", "bad.json",
        case_frameworks());
  } catch (const casefile::CaseFileError& error) {
    return error.what();
  }
  return "";
}

TEST(CaseSections, EachSectionsFieldErrorsNameThePathAndTheRule) {
  EXPECT_EQ(error_of(R"("deepspeed": {"zero_stage": 4})"),
            "bad.json: case.deepspeed.zero_stage: expected an integer >= 0 at most 3, got 4");
  EXPECT_EQ(error_of(R"("deepspeed": {"loss_scale": 100})"),
            "bad.json: case.deepspeed.loss_scale: expected a power of two (a loss scale that keeps every gradient "
            "exact), got 100");
  EXPECT_EQ(error_of(R"("deepspeed": {"offload": true})"),
            "bad.json: case.deepspeed.offload: unknown key for the DeepSpeed configuration");
  EXPECT_EQ(error_of(R"("torchtitan": {"clip": "fsdp"})").rfind("bad.json: case.torchtitan.clip: ", 0), 0u);
  EXPECT_EQ(error_of(R"("automodel": {"dp_replicate": 0})").rfind("bad.json: case.automodel.dp_replicate: ", 0), 0u);
  EXPECT_EQ(error_of(R"("megatron_fsdp": {"outer_dp_sharding_strategy": "optim_grads"})")
                .rfind("bad.json: case.megatron_fsdp.outer_dp_sharding_strategy: ", 0),
            0u);
  EXPECT_EQ(error_of(R"("target": {"framework": "paddle", "version": "0.2.0"})"),
            "bad.json: case.target.framework: expected a framework tally has a worker for (" + framework_names() +
                "), got \"paddle\"");
}

TEST(CaseSections, ADeepSpeedCaseRoundTripsItsEngineConfiguration) {
  casefile::Case c = testing::founding_case();
  kDeepSpeedSection.set(c, {.zero_stage = 2, .grad_accum_fp32 = true, .loss_scale = 1024});
  c.target = casefile::RealTarget{"deepspeed", "0.19.8", ""};
  const std::string text = casefile::case_to_json(c).dump(2);
  EXPECT_NE(text.find(R"("deepspeed": {
    "zero_stage": 2,
    "grad_accum_fp32": true,
    "loss_scale": 1024
  },
  "target")"), std::string::npos) << "after the faults, before the target: " << text;
  const auto round_trips = [](const casefile::Case& c) {
    return casefile::case_from_json(casefile::case_to_json(c), case_frameworks(), "case") == c;
  };
  EXPECT_TRUE(round_trips(c));
  EXPECT_FALSE(casefile::case_to_json(c)["deepspeed"].contains("autotp")) << "absent means false";
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) {
    d.autotp = true;
    d.autoep = true;  // (the target refuses both at once; the file keeps what it says)
  });
  EXPECT_EQ(casefile::case_to_json(c)["deepspeed"]["autotp"], true);
  EXPECT_EQ(casefile::case_to_json(c)["deepspeed"]["autoep"], true);
  EXPECT_TRUE(round_trips(c));
  EXPECT_FALSE(casefile::case_to_json(c)["deepspeed"].contains("fused_adam")) << "absent means false";
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.fused_adam = true; });
  EXPECT_EQ(casefile::case_to_json(c)["deepspeed"]["fused_adam"], true);
  EXPECT_TRUE(round_trips(c));
  EXPECT_FALSE(casefile::case_to_json(c)["deepspeed"].contains("offload_optimizer")) << "absent means false";
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.offload_optimizer = true; });
  EXPECT_EQ(casefile::case_to_json(c)["deepspeed"]["offload_optimizer"], true);
  EXPECT_TRUE(round_trips(c));
  EXPECT_FALSE(casefile::case_to_json(c)["deepspeed"].contains("launcher")) << "absent means deepspeed";
  kDeepSpeedSection.change(c, [&](DeepSpeedConfig& d) { d.launcher = DeepSpeedLauncher::accelerate; });
  EXPECT_EQ(casefile::case_to_json(c)["deepspeed"]["launcher"], "accelerate");
  EXPECT_TRUE(round_trips(c));
  nlohmann::json wrong = casefile::case_to_json(c);
  wrong["deepspeed"]["launcher"] = "Trainer";  // read strictly: the names as written
  EXPECT_THROW(casefile::case_from_json(wrong, case_frameworks(), "case"), std::exception);
  EXPECT_EQ(kDeepSpeedSection.of(c)->loss_scale, 1024);
  casefile::keep_only_section(c, "");
  EXPECT_FALSE(casefile::case_to_json(c).contains("deepspeed")) << "a Megatron case has no section";
  EXPECT_EQ(kDeepSpeedSection.of(c), std::nullopt);
}

TEST(CaseSections, EachFrameworksConfigurationRoundTripsThroughItsSection) {
  casefile::Case c = testing::founding_case();
  const TorchTitanConfig titan{.clip = DTensorClip::torch, .spmd_backend = SpmdBackend::partial_dtensor,
                               .dp_replicate = 2, .before_reduction = true};
  kTorchTitanSection.set(c, titan);
  EXPECT_EQ(kTorchTitanSection.of(c), titan);
  casefile::keep_only_section(c, "");
  const AutomodelConfig automodel{.dp_replicate = 2, .sequence_parallel = true, .before_reduction = true};
  kAutomodelSection.set(c, automodel);
  EXPECT_EQ(kAutomodelSection.of(c), automodel);
  casefile::keep_only_section(c, "");
  const MegatronFsdpConfig fsdp{.sharding = FsdpSharding::optim, .outer_sharding = FsdpOuterSharding::optim};
  kMegatronFsdpSection.set(c, fsdp);
  EXPECT_EQ(kMegatronFsdpSection.of(c), fsdp);
  EXPECT_EQ(casefile::case_from_json(casefile::case_to_json(c), case_frameworks(), "case"), c);
}

}  // namespace
}  // namespace tally::run
