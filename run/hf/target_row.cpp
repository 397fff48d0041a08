#include "run/hf/target_row.h"

#include "run/hf/rules.h"
#include "run/hf/section.h"

namespace tally::run {

namespace {

constexpr FrameworkTarget kHf{
    .name = "hf",
    .default_worker = "torchrun --standalone --nproc-per-node {world} -m tally_adapters.hf.worker",
    .section = kHfSection.key,
    .read_section = canonical_section<kHfSection>,
    .own_models = kHfSection.own_models,
    .refusal = [](const casefile::Case& c, const WorkerHello& hello) { return hf_refusal(c, hello.version, hello.plants); },
    .refusal_at_release = [](const casefile::Case& c, std::string_view version) { return hf_refusal(c, version); },
    .within = [](casefile::Case c, const WorkerHello& hello) {
      // Drawn from the case's own gradient seed, so a campaign's stream of cases, and a shrink's,
      // stay reproducible from the campaign seed.
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return within_hf(std::move(c), hello.plants, draw);
    },
    // A case the flags describe: accelerate's clip, no HSDP, gradients after the reduction.
    .from_flags = [](casefile::Case c) {
      if (!kHfSection.of(c)) kHfSection.set(c, HfConfig{});
      return c;
    },
    .own_section = [](const casefile::Case& c) -> std::optional<std::string> {
      if (!kHfSection.held_by(c)) return std::nullopt;
      return "hf: a Hugging Face case (its hf section is how transformers and accelerate lay it out); run it with "
             "--target hf";
    },
    .engine_config = [](const casefile::Case& c) -> std::optional<nlohmann::ordered_json> {
      if (!kHfSection.held_by(c)) return std::nullopt;
      return hf_recipe(c);
    },
    .model_description = [](const casefile::Case& c) { return kHfSection.held_by(c) ? hf_model_description(c) : std::string(); },
    .sweep_variants = hf_sweep_variants,
    .norm_code = hf_norm_code,
    .reduction_groups = hf_reduction_groups,
    // No release_model_case: tally models Megatron's path, not accelerate's.
};

}  // namespace

const FrameworkTarget& hf_target() { return kHf; }

}  // namespace tally::run
