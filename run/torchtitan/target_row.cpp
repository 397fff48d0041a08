#include "run/torchtitan/target_row.h"

#include "run/torchtitan/rules.h"

namespace tally::run {

namespace {

constexpr FrameworkTarget kTorchTitan{
    "torchtitan",
    "torchrun --standalone --nproc-per-node {world} -m tally_adapters.torchtitan.worker",
    [](const casefile::Case& c, const WorkerHello& hello) {
      return torchtitan_unsupported(c, hello.version, hello.plants);
    },
    [](const casefile::Case& c, std::string_view version) { return torchtitan_unsupported(c, version); },
    [](casefile::Case c, const WorkerHello& hello) {
      // Drawn from the case's own gradient seed, so a campaign's stream of cases, and a shrink's,
      // stay reproducible from the campaign seed.
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return within_torchtitan(std::move(c), hello.plants, draw);
    },
    // A case the flags describe: torchtitan's clip on full_dtensor, no HSDP replication.
    [](casefile::Case c) {
      if (!c.torchtitan) c.torchtitan = casefile::TorchTitanConfig{};
      return c;
    },
    [](const casefile::Case& c) { return c.torchtitan.has_value(); },
    [](const casefile::Case& c) -> std::optional<nlohmann::ordered_json> {
      if (!c.torchtitan) return std::nullopt;
      return torchtitan_job_config(c);
    },
    [](const casefile::Case& c) { return c.torchtitan ? torchtitan_model_description(c) : std::string(); },
    torchtitan_sweep_variants,
    torchtitan_norm_code,
    // tally models Megatron's path, not torchtitan's: no release model to hold it against.
    [](const casefile::Case&, std::string_view) -> std::optional<casefile::Case> { return std::nullopt; },
};

}  // namespace

const FrameworkTarget& torchtitan_target() { return kTorchTitan; }

}  // namespace tally::run
