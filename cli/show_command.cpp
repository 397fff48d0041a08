// tally show: a case file in readable form, and the equivalent Megatron-LM flags (or, for a
// framework whose worker is sent its configuration, that configuration: run/target.h).
#include <algorithm>
#include <memory>
#include <ostream>

#include "cli/commands.h"
#include "run/megatron_core/megatron_args.h"
#include "cli/usage_error.h"
#include "cli/verdict_report.h"
#include "casefile/case_file.h"
#include "run/target.h"
#include "topologies/logical_model.h"

namespace tally::cli {

namespace {

// The args as lines a shell accepts: "  --flag value \\" per flag, the last without the "\\".
std::string megatron_command_text(const run::MegatronArgs& m) {
  std::string out;
  for (std::size_t i = 0; i < m.args.size(); ++i) {
    const bool value_follows = i + 1 < m.args.size() && m.args[i + 1].rfind("--", 0) != 0;
    out += "  " + shell_quote(m.args[i]);
    if (value_follows) out += " " + shell_quote(m.args[++i]);
    out += i + 1 < m.args.size() ? " \\\n" : "\n";
  }
  return out;
}

struct ShowOptions {
  std::string case_file;
  bool json = false;
};

std::string expectation_line(const std::optional<casefile::Expectation>& expect) {
  if (!expect) return "expect: nothing recorded (replay expects pass)";
  std::string line = "expect: " + std::string(casefile::outcome_name(expect->outcome));
  if (expect->outcome != casefile::Expectation::Outcome::fail) return line;
  auto join = [](const std::vector<std::string>& items) {
    std::string text;
    for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
    return text;
  };
  line += expect->statistics.empty() ? ", any statistic" : ", statistics " + join(expect->statistics);
  if (!expect->miscounted.empty()) line += "; miscounted " + join(expect->miscounted);
  return line;
}

}  // namespace

// The framework's reduction groups of `c` where its worker runs that reduction with each rank's
// share (run/contributions.h); nullopt where the worker sets the reduced gradients itself.
std::optional<run::ReductionGroups> reduction_of(const run::FrameworkTarget& framework, const casefile::Case& c) {
  return framework.reduction_groups ? framework.reduction_groups(c) : std::nullopt;
}

// Where the case's gradients enter the framework: before its own reduction (each rank's share over
// the groups tally dealt them for) or after it.
constexpr std::string_view kModelReductionLine =
    "gradients: before Megatron's reduction: each rank gives its own share, which tally's model scales by "
    "1/|DP x CP| and sums over megatron-core 0.19.2's groups (gradnorm/reduction.h); --target megatron-core runs "
    "megatron-core's own";

std::string gradients_line(const run::FrameworkTarget& framework, const casefile::Case& c) {
  const std::optional<run::ReductionGroups> reduction = reduction_of(framework, c);
  if (!reduction)
    return "gradients: after " + std::string(framework.name) +
           "'s reduction (its worker sets each rank's reduced gradient)";
  std::string sizes;
  for (int size : reduction->sizes) sizes += (sizes.empty() ? "" : " and ") + std::to_string(size);
  return "gradients: before " + std::string(framework.name) + "'s own reduction: each rank gives its share, dealt " +
         "over groups of " + sizes + " ranks, " +
         (reduction->divisor == 1 ? std::string("summed (never divided)")
                                  : "their sum divided by " + std::to_string(reduction->divisor));
}

void add_show_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<ShowOptions>();
  CLI::App* command = app.add_subcommand(
      "show", "Print a case file: the case in readable form and the Megatron-LM command-line "
              "flags that build the same topology, model and optimizer (for a DeepSpeed case, the "
              "configuration tally sends its DeepSpeed worker for deepspeed.initialize, the same "
              "file the worker reads).");
  command->add_option("case", options->case_file, "The case file (JSON, docs/case-files.md)")
      ->required();
  command->add_flag("--json", options->json,
                    "Machine-readable: the canonical case, its summary and the Megatron-LM args");
  command->callback([options, &context] {
    casefile::Case c;
    try {
      c = casefile::load_case_file(options->case_file, run::case_frameworks());
    } catch (const casefile::CaseFileError& error) {
      throw UsageError(error.what());
    }
    const run::MegatronArgs megatron = run::megatron_args(c);
    // A framework that is sent its configuration shows it; otherwise Megatron-LM's flags build the case.
    const run::FrameworkTarget* framework = run::framework_of(c);
    const std::optional<nlohmann::ordered_json> engine =
        framework ? framework->engine_config(c) : std::optional<nlohmann::ordered_json>();
    // A real target's case, or one holding a framework's section, re-executes on its framework.
    const std::string rerun_flags = framework ? " --target " + std::string(framework->name) : std::string();
    if (options->json) {
      nlohmann::ordered_json j;
      j["file"] = options->case_file;
      j["case"] = casefile::case_to_json(c);
      j["summary"] = case_summary(c);
      if (engine) {
        j[std::string(framework->name) + "_config"] = *engine;
        j[std::string(framework->name) + "_model"] = framework->model_description(c);
      }
      if (framework) {
        const std::optional<run::ReductionGroups> reduction = reduction_of(*framework, c);
        j["gradients_enter"] = reduction ? "before the reduction" : "after the reduction";
        if (reduction) j["reduction_groups"] = {{"sizes", reduction->sizes}, {"divisor", reduction->divisor}};
      } else {
        j["gradients_enter"] = c.path.gradients.before_reduction ? "before the reduction" : "after the reduction";
      }
      if (!engine) {
        j["megatron_args"] = megatron.args;
        j["megatron_notes"] = megatron.notes;
      }
      j["replay"] = "tally run " + shell_quote(options->case_file) + rerun_flags;
      context.out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
                  << '\n';
    } else {
      std::ostream& out = context.out;
      out << "case file " << options->case_file << '\n';
      if (!c.description.empty()) out << c.description << '\n';
      out << case_summary(c) << '\n' << expectation_line(c.expect) << '\n';
      if (c.target)
        out << "target: " << c.target->framework << " " << c.target->version
            << (c.target->manifests.empty() ? std::string() : ", the run's manifests in " + c.target->manifests) << '\n';
      out << '\n';
      if (engine) {
        out << framework->name << " configuration (what its worker is sent):\n" << engine->dump(2) << '\n'
            << framework->model_description(c) << '\n';
      }
      if (framework) out << gradients_line(*framework, c) << '\n';
      else if (c.path.gradients.before_reduction) out << kModelReductionLine << '\n';
      if (!engine) {
        out << "Megatron-LM flags:\n" << megatron_command_text(megatron);
        out << "\nnotes:\n";
        for (const std::string& note : megatron.notes) out << "  " << note << '\n';
      }
      out << "\nreplay: tally run " << shell_quote(options->case_file) << rerun_flags << '\n';
    }
    context.exit_code = kExitPass;
  });
}

}  // namespace tally::cli
