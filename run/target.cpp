#include "run/target.h"

#include <array>
#include <filesystem>
#include <map>
#include <system_error>

#include "run/automodel/target_row.h"
#include "run/deepspeed/target_row.h"
#include "run/evidence.h"
#include "run/hf/target_row.h"
#include "run/target_run.h"
#include "run/torchtitan/target_row.h"
#include "vocab/optimizer_models.h"
#include "run/megatron_core/target_row.h"

namespace tally::run {

namespace {

namespace fs = std::filesystem;

// A real framework through its workers, one per world (run/framework_worker.h).
class WorkerTarget final : public Target {
 public:
  WorkerTarget(const FrameworkTarget& row, WorkerOptions options) : row_(row), pool_(with_engine(row, std::move(options))) {}

  std::string_view name() const override { return row_.name; }
  bool framework() const override { return true; }

  const TargetAbilities& open(int world) override {
    if (auto it = opened_.find(world); it != opened_.end()) return it->second;
    const WorkerHello& hello = hello_of(world);
    TargetAbilities abilities;
    abilities.name = hello.framework;
    abilities.version = hello.version;
    abilities.world = world;
    abilities.plants = hello.plants;
    abilities.framework = true;
    return opened_.emplace(world, std::move(abilities)).first->second;
  }

  std::optional<std::string> refusal_before_open(const casefile::Case& c) const override {
    casefile::Case without_faults = c;  // which faults the worker plants, it says once it is up
    without_faults.path.faults = {};
    return row_.refusal_at_release(without_faults, "");
  }

  std::optional<std::string> refusal(const casefile::Case& c) override {
    return row_.refusal(c, hello_of(c.topology.world));
  }

  casefile::Case within(casefile::Case c) override {
    const WorkerHello& hello = hello_of(c.topology.world);
    return row_.within(std::move(c), hello);
  }

  casefile::Case from_flags(casefile::Case c) const override { return row_.from_flags(std::move(c)); }
  std::vector<std::pair<std::string, casefile::Case>> sweep_variants(const casefile::Case& base) const override {
    return row_.sweep_variants(base);
  }

  std::optional<std::string> manifests_refusal() const override { return std::nullopt; }

  TargetRun execute(const casefile::Case& c, bool /*keep_record*/) override {
    const WorkerHello& hello = hello_of(c.topology.world);
    const std::string how = "re-executed by " + hello.framework + " " + hello.version;
    WorkerRun r;
    try {
      r = pool_.execute(c);
    } catch (const casefile::InvalidCase&) {
      throw;
    } catch (const std::exception& error) {
      // A worker that died is restarted for the next case; one that cannot be is the machinery's
      // failure, as is a request that cannot be written.
      throw TargetUnavailable(error.what());
    }
    TargetRun out;
    out.verdict = std::move(r.verdict);
    out.manifests = std::move(r.manifests);
    out.how = how;
    return out;
  }

  std::optional<casefile::RealTarget> release_of(const casefile::Case& c) override {
    const WorkerHello& hello = hello_of(c.topology.world);
    return casefile::RealTarget{hello.framework, hello.version, ""};
  }

  std::optional<std::string> evidence_of(const casefile::Case& c) const override { return pool_.manifests_of(c); }

 private:
  // The row's engine configuration sent with each case, and each answer judged as a run of its case.
  static WorkerOptions with_engine(const FrameworkTarget& row, WorkerOptions options) {
    options.judge = judge_as_a_run_of_the_case(oracle::kFrameworkRtol);
    options.cannot_run_settings.assign(row.cannot_run.begin(), row.cannot_run.end());
    if (row.reduction_groups) options.reduction_groups = row.reduction_groups;
    options.engine_config = [&row](const casefile::Case& c) -> std::optional<std::string> {
      std::optional<nlohmann::ordered_json> config = row.engine_config(c);
      if (!config) return std::nullopt;
      return config->dump(2) + "\n";
    };
    return options;
  }

  // The hello of `world`'s worker, starting it; a worker that cannot start, or that says it is
  // another framework, leaves the target unavailable.
  const WorkerHello& hello_of(int world) {
    const WorkerHello* hello = nullptr;
    try {
      hello = &pool_.hello(world);
    } catch (const std::exception& error) {
      throw TargetUnavailable(error.what());
    }
    if (hello->framework != row_.name)
      throw TargetUnavailable("the worker of --target " + std::string(row_.name) + " (world " + std::to_string(world) +
                              ") says in its hello that it is '" + hello->framework + "': the --worker command " +
                              "starts another framework's worker (tally's targets: " + framework_names() + ")");
    return *hello;
  }

  const FrameworkTarget& row_;
  WorkerPool pool_;
  std::map<int, TargetAbilities> opened_;
};

}  // namespace

std::span<const FrameworkTarget* const> framework_targets() {
  // Every framework's row, from its folder, in the order --help lists them.
  static const std::array<const FrameworkTarget*, 5> rows{&megatron_core_target(), &deepspeed_target(),
                                                          &torchtitan_target(), &automodel_target(), &hf_target()};
  return rows;
}

casefile::FrameworkSchemas case_frameworks() {
  static const std::vector<casefile::FrameworkSchema> schemas = [] {
    std::vector<casefile::FrameworkSchema> out;
    for (const FrameworkTarget* t : framework_targets())
      out.push_back({.name = t->name, .section = t->section, .read_section = t->read_section, .own_models = t->own_models});
    return out;
  }();
  return schemas;
}

bool gradients_enter_before_reduction(std::string_view framework, const casefile::Case& c) {
  if (framework == "model") return c.path.gradients.before_reduction;
  const FrameworkTarget* row = framework_target(framework);
  return row && row->reduction_groups && row->reduction_groups(c);
}

const FrameworkTarget* framework_target(std::string_view name) {
  for (const FrameworkTarget* t : framework_targets())
    if (t->name == name) return t;
  return nullptr;
}

const FrameworkTarget* framework_of(const casefile::Case& c) {
  if (c.target) return framework_target(c.target->framework);
  for (const FrameworkTarget* t : framework_targets())
    if (t->own_section(c)) return t;
  return nullptr;
}

std::optional<std::string> other_frameworks_section(const casefile::Case& c, std::string_view framework) {
  for (const FrameworkTarget* t : framework_targets())
    if (t->name != framework)
      if (std::optional<std::string> section = t->own_section(c)) return section;
  return std::nullopt;
}

std::string framework_names(std::string_view separator) {
  std::string out;
  for (const FrameworkTarget* t : framework_targets()) out += (out.empty() ? "" : std::string(separator)) + std::string(t->name);
  return out;
}

std::optional<casefile::RealTarget> saved_section(Target& target, const casefile::Case& c, const std::string& case_path) {
  std::optional<casefile::RealTarget> section = target.release_of(c);
  if (!section || case_path.empty()) return section;
  const std::optional<std::string> manifests = target.evidence_of(c);
  if (!manifests) return section;
  fs::path saved(case_path);
  saved.replace_extension(".manifests");
  try {
    copy_evidence(*manifests, saved);  // what it cannot copy of a worker's folder, it lists there
  } catch (const std::exception& error) {
    throw std::runtime_error("cannot save the manifests of " + case_path + ": " + error.what());
  }
  section->manifests = saved.filename().string();
  return section;
}

std::unique_ptr<Target> framework_target(const FrameworkTarget& row, WorkerOptions options) {
  return std::make_unique<WorkerTarget>(row, std::move(options));
}

std::vector<std::pair<std::string, casefile::Case>> optimizer_variants(const casefile::Case& base) {
  std::vector<std::pair<std::string, casefile::Case>> out;
  for (const vocab::OptimizerModelInfo& info : vocab::optimizer_models()) {
    casefile::Case c = base;
    c.path.optimizer = info.model;
    out.emplace_back(std::string(info.name), std::move(c));
  }
  return out;
}

std::vector<std::pair<std::string, casefile::Case>> unreduced_variants(const casefile::Case& base) {
  std::vector<std::pair<std::string, casefile::Case>> out;
  for (vocab::OptimizerModel optimizer : {vocab::OptimizerModel::plain, vocab::OptimizerModel::distributed}) {
    casefile::Case c = base;
    c.path.optimizer = optimizer;
    c.path.gradients.before_reduction = true;
    out.emplace_back(std::string(vocab::optimizer_model_name(optimizer)) + "-unreduced", std::move(c));
  }
  return out;
}

std::optional<std::string> why_not_planted(const std::string& name, const FaultPlants& plants) {
  if (plants.planted.contains(name)) return std::nullopt;
  auto why = plants.not_planted.find(name);
  return why != plants.not_planted.end() ? why->second : std::string("the worker names no counterpart");
}

std::string unplantable(const vocab::FaultSet& faults, const FaultPlants& plants) {
  std::string out;
  for (const vocab::FaultInfo& info : vocab::fault_catalog()) {
    if (!faults.has(info.fault)) continue;
    const std::string name(info.name);
    if (std::optional<std::string> why = why_not_planted(name, plants))
      out += (out.empty() ? "" : "; ") + name + " (" + *why + ")";
  }
  return out;
}

}  // namespace tally::run
