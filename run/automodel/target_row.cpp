#include "run/automodel/target_row.h"

#include "run/automodel/rules.h"

namespace tally::run {

namespace {

constexpr FrameworkTarget kAutomodel{
    "automodel",
    "torchrun --standalone --nproc-per-node {world} -m tally_adapters.automodel.worker",
    [](const casefile::Case& c, const WorkerHello& hello) { return automodel_unsupported(c, hello.version, hello.plants); },
    [](const casefile::Case& c, std::string_view version) { return automodel_unsupported(c, version); },
    [](casefile::Case c, const WorkerHello& hello) {
      // Drawn from the case's own gradient seed, so a campaign's stream of cases, and a shrink's,
      // stay reproducible from the campaign seed.
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return within_automodel(std::move(c), hello.plants, draw);
    },
    // A case the flags describe: FSDP2, no HSDP, no sequence parallelism.
    [](casefile::Case c) {
      if (!c.automodel) c.automodel = casefile::AutomodelConfig{};
      return c;
    },
    [](const casefile::Case& c) { return c.automodel.has_value(); },
    [](const casefile::Case& c) -> std::optional<nlohmann::ordered_json> {
      if (!c.automodel) return std::nullopt;
      return automodel_recipe(c);
    },
    [](const casefile::Case& c) { return c.automodel ? automodel_model_description(c) : std::string(); },
    automodel_sweep_variants,
    automodel_norm_code,
    // tally models Megatron's path, not Automodel's: no release model to hold it against.
    [](const casefile::Case&, std::string_view) -> std::optional<casefile::Case> { return std::nullopt; },
};

}  // namespace

const FrameworkTarget& automodel_target() { return kAutomodel; }

}  // namespace tally::run
