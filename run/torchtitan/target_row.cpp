#include "run/torchtitan/target_row.h"

#include "run/torchtitan/rules.h"
#include "run/torchtitan/section.h"

namespace tally::run {

namespace {

constexpr FrameworkTarget kTorchTitan{
    .name = "torchtitan",
    .default_worker = "torchrun --standalone --nproc-per-node {world} -m tally_adapters.torchtitan.worker",
    .section = kTorchTitanSection.key,
    .read_section = canonical_section<kTorchTitanSection>,
    .own_models = kTorchTitanSection.own_models,
    .refusal = [](const casefile::Case& c, const WorkerHello& hello) {
      return torchtitan_refusal(c, hello.version, hello.plants);
    },
    .refusal_at_release = [](const casefile::Case& c, std::string_view version) { return torchtitan_refusal(c, version); },
    .within = [](casefile::Case c, const WorkerHello& hello) {
      // Drawn from the case's own gradient seed, so a campaign's stream of cases, and a shrink's,
      // stay reproducible from the campaign seed.
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return within_torchtitan(std::move(c), hello.plants, draw);
    },
    // A case the flags describe: torchtitan's clip on full_dtensor, no HSDP replication.
    .from_flags = [](casefile::Case c) {
      if (!kTorchTitanSection.of(c)) kTorchTitanSection.set(c, TorchTitanConfig{});
      return c;
    },
    .own_section = [](const casefile::Case& c) -> std::optional<std::string> {
      if (!kTorchTitanSection.held_by(c)) return std::nullopt;
      return "torchtitan: a torchtitan case (its torchtitan section is how torchtitan lays out and clips); run it "
             "with --target torchtitan";
    },
    .engine_config = [](const casefile::Case& c) -> std::optional<nlohmann::ordered_json> {
      if (!kTorchTitanSection.held_by(c)) return std::nullopt;
      return torchtitan_job_config(c);
    },
    .model_description = [](const casefile::Case& c) { return kTorchTitanSection.held_by(c) ? torchtitan_model_description(c) : std::string(); },
    .sweep_variants = torchtitan_sweep_variants,
    .norm_code = torchtitan_norm_code,
    .reduction_groups = torchtitan_reduction_groups,
    // No release_model_case: tally models Megatron's path, not torchtitan's.
};

}  // namespace

const FrameworkTarget& torchtitan_target() { return kTorchTitan; }

}  // namespace tally::run
