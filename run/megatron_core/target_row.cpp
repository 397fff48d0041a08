#include "run/megatron_core/target_row.h"

#include "run/megatron_core/rules.h"
#include "gradnorm/releases.h"
#include "vocab/optimizer_models.h"

namespace tally::run {

namespace {

// torchrun starts one rank per process; the worker picks gloo or NCCL for the world
// (adapters/README.md).
constexpr FrameworkTarget kMegatronCore{
    "megatron-core",
    "torchrun --standalone --nproc-per-node {world} -m tally_adapters.megatron.worker",
    [](const casefile::Case& c, const WorkerHello& hello) {
      return megatron_core_unsupported(c, hello.version, hello.plants);
    },
    [](const casefile::Case& c, std::string_view version) { return megatron_core_unsupported(c, version); },
    [](casefile::Case c, const WorkerHello& hello) {
      return within_megatron_core(std::move(c), hello.version, hello.plants);
    },
    [](casefile::Case c) { return c; },
    [](const casefile::Case&) { return false; },
    [](const casefile::Case&) -> std::optional<nlohmann::ordered_json> { return std::nullopt; },
    [](const casefile::Case&) { return std::string(); },
    optimizer_variants,
    [](const casefile::Case& c) { return std::string(vocab::optimizer_model_name(c.path.optimizer)); },
    [](const casefile::Case& c, std::string_view version) -> std::optional<casefile::Case> {
      const std::optional<gradnorm::MegatronRelease> release = gradnorm::release_from_name(version);
      if (!release || gradnorm::check_release_config(*release, c.topology)) return std::nullopt;
      casefile::Case model = c;
      model.target.reset();
      model.expect.reset();
      model.path.faults = model.path.faults.with(gradnorm::release_faults(*release, c.path.optimizer));
      return model;
    },
};

}  // namespace

const FrameworkTarget& megatron_core_target() { return kMegatronCore; }

}  // namespace tally::run
