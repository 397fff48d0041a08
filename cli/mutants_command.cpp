// tally mutants: the mutation score, one campaign per fault of the catalog.
#include <unistd.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/backend_flags.h"
#include "cli/campaign_output.h"
#include "cli/commands.h"
#include "cli/fault_flags.h"
#include "cli/model_flags.h"
#include "cli/number_flags.h"
#include "cli/path_flags.h"
#include "cli/target_flags.h"
#include "cli/usage_error.h"
#include "cli/verdict_report.h"
#include "fuzz/campaign.h"
#include "fuzz/junit.h"
#include "fuzz/known.h"
#include "vocab/faults.h"
#include "run/target.h"

namespace tally::cli {

namespace {

struct MutantsOptions {
  std::int64_t budget = 1000;
  std::uint64_t seed = 1;
  int max_world = 64;
  std::string faults = "all";
  std::string corpus;
  int shrink_runs = 1000;
  std::string shrink_time = "60s";
  bool json = false;
  std::string norm_code;  // only cases of this norm code (prefix); "": all
  std::vector<std::string> presets;  // --preset: every case's model one of these; empty: generated models
  TargetOptions target;
  int world = 2;  // --target: every case's world
};

void run_mutants_command(const MutantsOptions& o, CommandContext& context) {
  if (o.budget < 1) throw UsageError("--budget must be at least 1 (got " + std::to_string(o.budget) + ")");
  if (o.max_world < 1 || o.max_world > topologies::kMaxWorld)
    throw UsageError("--max-world must be in 1.." + std::to_string(topologies::kMaxWorld) +
                     " (got " + std::to_string(o.max_world) + ")");
  fuzz::MutantOptions m;
  m.budget = o.budget;
  m.seed = o.seed;
  m.generator.topology.max_world = o.max_world;
  m.generator.topology.exact_world = context.backend.world();
  if (!o.norm_code.empty()) m.generator.keep_only = fuzz::norm_code_filter(o.norm_code);
  m.generator.presets = parse_presets(o.presets, "--preset");
  m.shrink.max_runs = o.shrink_runs;
  m.corpus_dir = o.corpus;
  m.shrink.max_seconds = parse_duration(o.shrink_time, "--shrink-time");
  m.faults = parse_fault_list({o.faults}, "--faults");
  if (m.faults.empty()) throw UsageError("--faults none: tally mutants needs faults (all, or names)");

  // A real target's faults are planted in the framework by its worker, where it can.
  std::unique_ptr<run::Target> target = chosen_target(o.target, context.backend, context.err);
  const run::TargetAbilities* opened = open_or_report(*target, o.world, context.err);
  if (!opened) {
    context.exit_code = kExitInfra;
    return;
  }
  m.world = o.world;
  const std::string target_text =
      opened->framework ? "target " + o.target.target + " " + opened->version + " (world " + std::to_string(opened->world) + ")"
                        : "max world " + std::to_string(o.max_world) + ", backend " + std::string(context.backend.name());

  std::ostream& out = context.out;
  char row[512];
  const char* format = "%-36s %-6s %6s  %-44s %s\n";
  if (!o.json) {
    out << "tally mutants: seed " << o.seed << ", budget " << o.budget << " cases per fault, "
        << (o.presets.empty() ? "" : "presets " + presets_text(m.generator.presets) + ", ") << target_text << "\n";
    std::snprintf(row, sizeof row, format, "fault", "found", "cases", "shrunk world", "shrunk model");
    out << row << std::flush;
  }
  auto on_result = [&](const fuzz::MutantResult& r) {
    if (o.json) return;
    const std::string name(vocab::fault_info(r.fault).name);
    if (!r.not_applicable.empty()) {
      std::snprintf(row, sizeof row, format, name.c_str(), "n/a", "-",
                    ("not applicable: " + r.not_applicable).c_str(), "");
    } else if (r.infra_error) {
      std::snprintf(row, sizeof row, format, name.c_str(), "ERROR", std::to_string(r.cases).c_str(),
                    "infrastructure error (below)", "");
    } else if (!r.found) {
      std::snprintf(row, sizeof row, format, name.c_str(), "NO", std::to_string(r.cases).c_str(),
                    "-", "-");
    } else {
      std::snprintf(row, sizeof row, format, name.c_str(), "yes", std::to_string(r.cases).c_str(),
                    world_text(r.failure->shrunk.topology).c_str(), model_text(r.failure->shrunk).c_str());
    }
    out << row << std::flush;
  };
  InterruptScope interrupt;
  std::vector<fuzz::MutantResult> results;
  try {
    results = fuzz::run_mutants(m, *target, on_result, interrupt.flag());
  } catch (const rc::GenerationFailure& failure) {
    context.exit_code = report_generation_failure(failure, o.norm_code, context.err);
    return;
  } catch (const std::exception& error) {
    context.err << "tally: error: " << error.what() << '\n';
    context.exit_code = kExitInfra;
    return;
  }
  int applicable = 0, found = 0;
  std::string missed;
  const fuzz::InfraStop* infra = nullptr;  // the first; run_mutants stops there
  for (const fuzz::MutantResult& r : results) {
    if (r.infra_error) infra = &*r.infra_error;
    if (!r.not_applicable.empty()) continue;
    ++applicable;
    if (r.infra_error) continue;  // neither found nor missed
    if (r.found) ++found;
    else missed += (missed.empty() ? "" : ", ") + std::string(vocab::fault_info(r.fault).name);
  }
  const bool interrupted = interrupt.interrupted();
  if (o.json) {
    nlohmann::ordered_json j;
    j["seed"] = o.seed;
    j["budget"] = o.budget;
    j["max_world"] = o.max_world;
    j["target"] = o.target.target;
    j["faults"] = nlohmann::ordered_json::array();
    for (const fuzz::MutantResult& r : results) {
      nlohmann::ordered_json f;
      f["fault"] = std::string(vocab::fault_info(r.fault).name);
      if (!r.not_applicable.empty()) {
        f["applicable"] = false;
        f["reason"] = r.not_applicable;
      } else {
        f["applicable"] = true;
        f["found"] = r.found;
        f["cases"] = r.cases;
        f["seconds"] = r.seconds;
        if (r.infra_error) f["infra_error"] = infra_stop_json(*r.infra_error);
        if (r.failure) {
          f["failure"] = fuzz::describe(r.failure->signature);
          f["shrunk_world"] = r.failure->shrunk.topology.world;
          f["shrunk_config"] = world_text(r.failure->shrunk.topology);
          const fuzz::CaseSize size = fuzz::case_size(r.failure->shrunk);
          f["shrunk_model"] = {{"kind", std::string(topologies::model_kind_name(r.failure->shrunk.model.kind))},
                               {"layers", size.layers},
                               {"experts", size.experts},
                               {"params", size.params},
                               {"elements", size.elements}};
          if (!r.failure->shrunk_path.empty()) f["shrunk_case"] = r.failure->shrunk_path;
        }
      }
      j["faults"].push_back(f);
    }
    j["applicable"] = applicable;
    j["found"] = found;
    j["interrupted"] = interrupted;
    out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
  } else {
    out << found << " of " << applicable << " applicable faults found within " << o.budget
        << (o.budget == 1 ? " case each" : " cases each");
    if (!missed.empty()) out << "; not found: " << missed;
    if (interrupted) out << " (interrupted)";
    if (infra) out << "; stopped by an infrastructure error (exit 3)";
    out << '\n';
    if (infra) out << infra_stop_text(*infra);
  }
  // No score is true while the target is broken.
  context.exit_code = infra ? kExitInfra : found == applicable && !interrupted ? kExitPass : kExitFail;
}

}  // namespace

void add_mutants_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<MutantsOptions>();
  CLI::App* command = app.add_subcommand(
      "mutants",
      "The mutation score: for each fault of the catalog, fuzz with only that fault switched on "
      "until a case fails or the budget is spent; a table of faults found, cases needed and the "
      "shrunk case. Exit 0 when every applicable fault is found, 1 otherwise, 3 when a case gave "
      "no verdict (an infrastructure error stops the score).");
  command->add_option("--budget", options->budget, "Cases per fault")
      ->check(whole_number(1, kNoUpperBound))
      ->capture_default_str();
  command->add_option("--seed", options->seed, "Campaign seed (the same for every fault)")
      ->check(seed_number())
      ->capture_default_str();
  command->add_option("--max-world", options->max_world, "Largest world generated")
      ->check(whole_number(1, topologies::kMaxWorld))
      ->capture_default_str();
  command->add_option("--faults", options->faults, "all, or fault names (comma-separated)")
      ->capture_default_str();
  add_norm_code_flag(*command, options->norm_code);
  command->add_option("--preset", options->presets,
                      "Architecture presets (comma-separated: " + topologies::preset_names() +
                          "): every case's model is one of them, laid out on its drawn configuration (a fault's "
                          "cases too). Default: tally's generated models")
      ->delimiter(',');
  command->add_option("--corpus", options->corpus, "Write each finding's case files here")
      ->check(output_folder());
  command->add_option("--shrink-runs", options->shrink_runs, "Cases run while shrinking one finding")
      ->check(whole_number(0, kIntMax))
      ->capture_default_str();
  command->add_option("--shrink-time", options->shrink_time, "Time spent shrinking one finding")
      ->check(duration())
      ->capture_default_str();
  command->add_flag("--json", options->json, "Machine-readable table");
  add_backend_flags(*command);
  add_target_flags(*command, options->target);
  command->add_option("--world", options->world,
                      "--target: the world of every case (the worker's ranks); --max-world is for "
                      "the model target")
      ->check(whole_number(1, 1 << 16))
      ->capture_default_str();
  command->callback([options, &context] { run_mutants_command(*options, context); });
}

}  // namespace tally::cli
