#include "run/target.h"

#include <array>

#include "run/deepspeed/engine.h"
#include "run/deepspeed/rules.h"
#include "run/megatron_core/rules.h"

namespace tally::run {

namespace {

// torchrun starts one rank per process; the worker picks gloo or NCCL for the world
// (adapters/megatron/README.md, adapters/deepspeed/README.md).
constexpr FrameworkTarget kMegatronCore{
    "megatron-core",
    "torchrun --standalone --nproc-per-node {world} -m tally_megatron_worker",
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
};

constexpr FrameworkTarget kDeepSpeed{
    "deepspeed",
    "torchrun --standalone --nproc-per-node {world} -m tally_deepspeed_worker",
    [](const casefile::Case& c, const WorkerHello& hello) {
      return deepspeed_unsupported(c, hello.version, hello.plants, hello.dtypes, hello.megatron_model_rules);
    },
    [](const casefile::Case& c, std::string_view version) { return deepspeed_unsupported(c, version); },
    [](casefile::Case c, const WorkerHello& hello) {
      // The DeepSpeed configuration is drawn from the case's own gradient seed, so a campaign's
      // stream of cases, and a shrink's, stay reproducible from the campaign seed.
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return within_deepspeed(std::move(c), hello.version, hello.plants, draw, hello.dtypes,
                              hello.megatron_model_rules);
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
};

constexpr std::array<FrameworkTarget, 2> kTargets{kMegatronCore, kDeepSpeed};

}  // namespace

std::span<const FrameworkTarget> framework_targets() { return kTargets; }

const FrameworkTarget* framework_target(std::string_view name) {
  for (const FrameworkTarget& t : kTargets)
    if (t.name == name) return &t;
  return nullptr;
}

const FrameworkTarget* framework_of(const casefile::Case& c) {
  if (c.target) return framework_target(c.target->framework);
  for (const FrameworkTarget& t : kTargets)
    if (t.owns(c)) return &t;
  return nullptr;
}

std::string framework_names(std::string_view separator) {
  std::string out;
  for (const FrameworkTarget& t : kTargets) out += (out.empty() ? "" : std::string(separator)) + std::string(t.name);
  return out;
}

}  // namespace tally::run
