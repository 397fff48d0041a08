#include "run/automodel/target_row.h"

#include "run/automodel/rules.h"
#include "run/automodel/section.h"

namespace tally::run {

namespace {

// The worker builds Automodel's MoE on a GPU only (its hello names model.num_experts elsewhere).
constexpr std::string_view kCannotRun[] = {"model.num_experts"};

constexpr FrameworkTarget kAutomodel{
    .name = "automodel",
    .default_worker = "torchrun --standalone --nproc-per-node {world} -m tally_adapters.automodel.worker",
    .section = kAutomodelSection.key,
    .read_section = canonical_section<kAutomodelSection>,
    .own_models = kAutomodelSection.own_models,
    .cannot_run = kCannotRun,
    .refusal = [](const casefile::Case& c, const WorkerHello& hello) {
      return automodel_refusal(c, hello.version, hello.plants, hello.cannot_run);
    },
    .refusal_at_release = [](const casefile::Case& c, std::string_view version) { return automodel_refusal(c, version); },
    .within = [](casefile::Case c, const WorkerHello& hello) {
      // Drawn from the case's own gradient seed, so a campaign's stream of cases, and a shrink's,
      // stay reproducible from the campaign seed.
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return within_automodel(std::move(c), hello.plants, draw, hello.cannot_run);
    },
    // A case the flags describe: FSDP2, no HSDP, no sequence parallelism.
    .from_flags = [](casefile::Case c) {
      if (!kAutomodelSection.of(c)) kAutomodelSection.set(c, AutomodelConfig{});
      return c;
    },
    .own_section = [](const casefile::Case& c) -> std::optional<std::string> {
      if (!kAutomodelSection.held_by(c)) return std::nullopt;
      return "automodel: a NeMo-Automodel case (its automodel section is how Automodel lays it out); run it with "
             "--target automodel";
    },
    .engine_config = [](const casefile::Case& c) -> std::optional<nlohmann::ordered_json> {
      if (!kAutomodelSection.held_by(c)) return std::nullopt;
      return automodel_recipe(c);
    },
    .model_description = [](const casefile::Case& c) { return kAutomodelSection.held_by(c) ? automodel_model_description(c) : std::string(); },
    .sweep_variants = automodel_sweep_variants,
    .norm_code = automodel_norm_code,
    .reduction_groups = automodel_reduction_groups,
    // No release_model_case: tally models Megatron's path, not Automodel's.
};

}  // namespace

const FrameworkTarget& automodel_target() { return kAutomodel; }

}  // namespace tally::run
