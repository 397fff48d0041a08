#include "run/megatron_core/target_row.h"

#include "run/megatron_core/rules.h"
#include "run/megatron_core/section.h"
#include "gradnorm/reduction.h"
#include "gradnorm/releases.h"
#include "topologies/parallel_config.h"
#include "vocab/optimizer_models.h"

namespace tally::run {

namespace {

// Settings only megatron-core runs, which tally's model does not model: Megatron-FSDP's buffers and
// the layer-wise parameter layout.
bool megatron_core_alone(const casefile::Case& c) {
  return kMegatronFsdpSection.held_by(c) || c.path.layer_wise_param_layout;
}

// tally's optimizer models, DDP's and the distributed optimizer's with the gradients before their
// reduction, and the layer-wise one over Megatron-LM 0.19's parameter layout, then,
// on a layout Megatron-FSDP runs (one stage, the default order), each of its strategies (and the
// hybrid one, over several instances), after and before its reduction. The worker refuses what its
// release lacks.
std::vector<std::pair<std::string, casefile::Case>> megatron_core_sweep_variants(const casefile::Case& base) {
  std::vector<std::pair<std::string, casefile::Case>> out = optimizer_variants(base);
  // DDP's all-reduce and the distributed optimizer's reduce-scatter, each run on gradients that
  // enter before it (the worker refuses what its release does not reduce).
  for (auto& variant : unreduced_variants(base)) out.push_back(std::move(variant));
  {
    casefile::Case c = base;
    c.path.optimizer = vocab::OptimizerModel::layerwise;
    c.path.layer_wise_param_layout = true;
    out.emplace_back("layerwise-layout", std::move(c));
  }
  if (base.topology.pp > 1 || !topologies::has_default_order(base.topology)) return out;
  for (FsdpSharding sharding : kFsdpShardings) {
    casefile::Case c = base;
    c.path.optimizer = vocab::OptimizerModel::distributed;
    c.path.bucket_elements = 0;
    kMegatronFsdpSection.set(c, {.sharding = sharding});
    const std::string name = "fsdp-" + std::string(fsdp_sharding_name(sharding));
    std::vector<std::pair<std::string, casefile::Case>> strategies{{name, c}};
    if (sharding == FsdpSharding::optim_grads_params && base.topology.dist_opt_instances > 1) {
      kMegatronFsdpSection.set(c, {.sharding = sharding, .outer_sharding = FsdpOuterSharding::optim});
      strategies.emplace_back(name + "-outer-optim", c);
    }
    // Each strategy also with the gradients before Megatron-FSDP's own reduction.
    for (auto& [strategy, strategy_case] : strategies) {
      casefile::Case unreduced = strategy_case;
      unreduced.path.gradients.before_reduction = true;
      out.emplace_back(strategy, std::move(strategy_case));
      out.emplace_back(strategy + "-unreduced", std::move(unreduced));
    }
  }
  return out;
}

// What computes the norm: the optimizer model's children, the layer-wise optimizer chained with a
// DistributedOptimizer over the parameter layout, or Megatron-FSDP's one distributed optimizer over
// its strategy's shards.
std::string megatron_core_norm_code(const casefile::Case& c) {
  if (c.path.layer_wise_param_layout) return "layerwise layout";
  const std::optional<MegatronFsdpConfig> fsdp = kMegatronFsdpSection.of(c);
  if (!fsdp) return std::string(vocab::optimizer_model_name(c.path.optimizer));
  std::string code = "megatron-fsdp " + std::string(fsdp_sharding_name(fsdp->sharding));
  if (fsdp->outer_sharding == FsdpOuterSharding::optim) code += " outer optim";
  return code;
}

constexpr std::string_view kCannotRun[] = {"megatron_fsdp", "optimizer.layer_wise_param_layout", "gradients.enter"};

// torchrun starts one rank per process; the worker picks gloo or NCCL for the world
// (adapters/README.md).
constexpr FrameworkTarget kMegatronCore{
    .name = "megatron-core",
    .default_worker = "torchrun --standalone --nproc-per-node {world} -m tally_adapters.megatron.worker",
    .section = kMegatronFsdpSection.key,
    .read_section = canonical_section<kMegatronFsdpSection>,
    .own_models = kMegatronFsdpSection.own_models,
    .cannot_run = kCannotRun,
    .refusal = [](const casefile::Case& c, const WorkerHello& hello) {
      return megatron_core_refusal(c, hello.version, hello.plants, hello.cannot_run);
    },
    .refusal_at_release = [](const casefile::Case& c, std::string_view version) { return megatron_core_refusal(c, version); },
    .within = [](casefile::Case c, const WorkerHello& hello) {
      // Drawn from the case's own gradient seed, so a campaign's stream of cases, and a shrink's,
      // stay reproducible from the campaign seed.
      const std::uint64_t draw = c.path.gradients.generator.seed;
      return within_megatron_core(std::move(c), hello.version, hello.plants, draw, hello.cannot_run);
    },
    .from_flags = [](casefile::Case c) { return c; },
    .own_section = [](const casefile::Case& c) -> std::optional<std::string> {
      if (kMegatronFsdpSection.held_by(c))
        return "megatron_fsdp: a Megatron-FSDP case (its megatron_fsdp section is megatron-core's FSDP configuration); "
               "run it with --target megatron-core";
      if (c.path.layer_wise_param_layout)
        return "optimizer.layer_wise_param_layout: megatron-core 0.19's layer-wise parameter layout; run it with "
               "--target megatron-core";
      return std::nullopt;
    },
    .engine_config = [](const casefile::Case&) -> std::optional<nlohmann::ordered_json> { return std::nullopt; },
    .model_description = [](const casefile::Case&) { return std::string(); },
    .sweep_variants = megatron_core_sweep_variants,
    .norm_code = megatron_core_norm_code,
    .release_model_case = [](const casefile::Case& c, std::string_view version) -> std::optional<casefile::Case> {
      if (megatron_core_alone(c)) return std::nullopt;
      const std::optional<gradnorm::MegatronRelease> release = gradnorm::release_from_name(version);
      if (!release || gradnorm::check_release_config(*release, c.topology)) return std::nullopt;
      casefile::Case model = c;
      model.target.reset();
      model.expect.reset();
      // Before the reduction, the release's reduction too, over the groups its layout gives each param
      // (experts treated as dense reduced over the dense group), where tally's model reduces; else the
      // release's norm of the reduced gradients, which the judge checks the held ones against.
      if (gradnorm::reduction_refusal(model.topology)) model.path.gradients.before_reduction = false;
      model.path.faults = model.path.faults.with(gradnorm::release_faults(*release, c.path.optimizer));
      return model;
    },
    .reduction_groups = megatron_core_reduction_groups,
};

}  // namespace

const FrameworkTarget& megatron_core_target() { return kMegatronCore; }

}  // namespace tally::run
