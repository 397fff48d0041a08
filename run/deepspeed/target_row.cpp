#include "run/deepspeed/target_row.h"

#include "run/deepspeed/engine.h"
#include "run/deepspeed/rules.h"
#include "run/deepspeed/section.h"

namespace tally::run {

namespace {

constexpr std::string_view kCannotRun[] = {"deepspeed.fused_adam", "deepspeed.launcher"};

constexpr FrameworkTarget kDeepSpeed{
    .name = "deepspeed",
    .default_worker = "torchrun --standalone --nproc-per-node {world} -m tally_adapters.deepspeed.worker",
    .section = kDeepSpeedSection.key,
    .read_section = canonical_section<kDeepSpeedSection>,
    .own_models = kDeepSpeedSection.own_models,
    .cannot_run = kCannotRun,
    .refusal = [](const casefile::Case& c, const WorkerHello& hello) {
      return deepspeed_refusal(c, hello.version, hello.plants, hello.dtypes, hello.megatron_model_rules,
                                   hello.cannot_run);
    },
    .refusal_at_release = [](const casefile::Case& c, std::string_view version) { return deepspeed_refusal(c, version); },
    .within = [](casefile::Case c, const WorkerHello& hello) {
      // The DeepSpeed configuration is drawn from the case's own gradient seed, so a campaign's
      // stream of cases, and a shrink's, stay reproducible from the campaign seed.
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return within_deepspeed(std::move(c), hello.version, hello.plants, draw, hello.dtypes,
                              hello.megatron_model_rules, hello.cannot_run);
    },
    // A case the flags describe has DeepSpeed's defaults: ZeRO 0, the precision of --grad-dtype.
    .from_flags = [](casefile::Case c) {
      if (!kDeepSpeedSection.of(c)) kDeepSpeedSection.set(c, DeepSpeedConfig{});
      return c;
    },
    .own_section = [](const casefile::Case& c) -> std::optional<std::string> {
      if (!kDeepSpeedSection.held_by(c)) return std::nullopt;
      return "deepspeed: a DeepSpeed case (its deepspeed section is DeepSpeed's engine configuration); run it with "
             "--target deepspeed";
    },
    .engine_config = [](const casefile::Case& c) -> std::optional<nlohmann::ordered_json> {
      if (!kDeepSpeedSection.held_by(c)) return std::nullopt;
      return deepspeed_engine_config(c);
    },
    .model_description = [](const casefile::Case& c) { return kDeepSpeedSection.held_by(c) ? deepspeed_model_description(c) : std::string(); },
    .sweep_variants = deepspeed_sweep_variants,
    .norm_code = deepspeed_norm_code,
    // No release_model_case: tally models Megatron's path, not DeepSpeed's.
    .release_model_case = nullptr,
    .reduction_groups = [](const casefile::Case& c) -> std::optional<ReductionGroups> {
      if (!kDeepSpeedSection.held_by(c)) return std::nullopt;
      return deepspeed_reduction_groups(c);
    },
};

}  // namespace

const FrameworkTarget& deepspeed_target() { return kDeepSpeed; }

}  // namespace tally::run
