#include "run/deepspeed/target_row.h"

#include "run/deepspeed/engine.h"
#include "run/deepspeed/rules.h"

namespace tally::run {

namespace {

constexpr FrameworkTarget kDeepSpeed{
    "deepspeed",
    "torchrun --standalone --nproc-per-node {world} -m tally_adapters.deepspeed.worker",
    [](const casefile::Case& c, const WorkerHello& hello) {
      return deepspeed_unsupported(c, hello.version, hello.plants, hello.dtypes, hello.megatron_model_rules,
                                   hello.cannot_run);
    },
    [](const casefile::Case& c, std::string_view version) { return deepspeed_unsupported(c, version); },
    [](casefile::Case c, const WorkerHello& hello) {
      // The DeepSpeed configuration is drawn from the case's own gradient seed, so a campaign's
      // stream of cases, and a shrink's, stay reproducible from the campaign seed.
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return within_deepspeed(std::move(c), hello.version, hello.plants, draw, hello.dtypes,
                              hello.megatron_model_rules, hello.cannot_run);
    },
    // A case the flags describe has DeepSpeed's defaults: ZeRO 0, the precision of --grad-dtype.
    [](casefile::Case c) {
      if (!c.deepspeed) c.deepspeed = casefile::DeepSpeedConfig{};
      return c;
    },
    [](const casefile::Case& c) { return c.deepspeed.has_value(); },
    [](const casefile::Case& c) -> std::optional<nlohmann::ordered_json> {
      if (!c.deepspeed) return std::nullopt;
      return deepspeed_engine_config(c);
    },
    [](const casefile::Case& c) { return c.deepspeed ? deepspeed_model_description(c) : std::string(); },
    deepspeed_sweep_variants,
    deepspeed_norm_code,
    // tally models Megatron's path, not DeepSpeed's: no release model to hold it against.
    [](const casefile::Case&, std::string_view) -> std::optional<casefile::Case> { return std::nullopt; },
};

}  // namespace

const FrameworkTarget& deepspeed_target() { return kDeepSpeed; }

}  // namespace tally::run
