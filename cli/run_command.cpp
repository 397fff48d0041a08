// tally run: one case, from flags or a case file; the verdict and the diagnosis.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/backend_flags.h"
#include "cli/commands.h"
#include "cli/fault_flags.h"
#include "gradnorm/releases.h"
#include "cli/html_report.h"
#include "cli/model_flags.h"
#include "cli/number_flags.h"
#include "cli/path_flags.h"
#include "cli/topology_flags.h"
#include "cli/usage_error.h"
#include "cli/verdict_report.h"
#include "casefile/case.h"
#include "run/run_case.h"
#include "casefile/case_file.h"
#include "vocab/faults.h"
#include "run/case_job.h"
#include "manifest/manifest_json.h"
#include "cli/target_flags.h"
#include "run/target.h"

namespace tally::cli {

namespace {

struct RunOptions {
  std::string case_file;          // positional: run this case file
  std::string save;               // --save: write the case to this file, then run it
  std::string expect;             // --expect with --save: pass, fail or observed
  std::string description;        // --description with --save
  std::string manifests;          // --manifests: write the run's manifests to this folder
  int manifest_version = manifest::kManifestVersion;
  std::vector<CLI::Option*> case_flags;  // the flags that describe a case
  TopologyFlags topology;
  ModelFlags model;
  std::string optimizer = "plain";
  std::string grads = "dyadic";
  std::string grad_dtype = "fp32";
  std::uint64_t seed = 1;
  std::vector<std::string> grad_classes;
  std::vector<std::string> grad_values;
  std::string accumulation = "fp64";
  std::vector<double> p_norms;
  double max_norm = 1.0;
  std::int64_t bucket_elements = 0;
  std::string gradients_enter = "after_reduction";
  std::vector<std::string> faults;
  std::string megatron_release;  // "": the rules tally checks
  bool list_faults = false;
  bool json = false;
  std::string html;  // --html: write the verdict as an HTML page
  std::string command_line;  // for the replay line
  TargetOptions target;
};

template <typename Enum>
Enum parse_choice(const std::string& flag, const std::string& value,
                  std::optional<Enum> (*from_name)(std::string_view), const std::string& choices) {
  const std::optional<Enum> parsed = from_name(value);
  if (!parsed) throw UsageError(flag + " '" + value + "' is not one of " + choices);
  return *parsed;
}

constexpr const char* kClassNames =
    "column, column-bias, row, replicated, vocab, head-sharded, expert-column, "
    "expert-column-bias, expert-row, expert-row-bias";

std::uint32_t parse_classes(const std::vector<std::string>& names) {
  if (names.empty()) return ~std::uint32_t{0};
  std::uint32_t mask = 0;
  for (const std::string& list : names) {
    std::stringstream items(list);
    std::string name;
    while (std::getline(items, name, ',')) {
      const std::optional<topologies::ParamClass> c = topologies::class_from_name(name);
      if (!c)
        throw UsageError("--grad-classes '" + name + "' is not a param class (" + kClassNames + ")");
      mask |= vocab::class_bit(*c);
    }
  }
  return mask;
}

// "NAME=0.1", "expert-row-bias=x3", "w=[1,2,3,4]": the gradients a bug report states for a param
// (by its logical name) or a class.
vocab::StatedFor parse_grad_value(const std::string& text) {
  const std::string flag = "--grad-value '" + text + "'";
  const std::size_t eq = text.rfind('=', text.find('['));
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw UsageError(flag + ": expected PARAM=VALUE or CLASS=VALUE (param:NAME or class:NAME where "
                            "a name is both), VALUE a number, xFACTOR or [v1,v2,...] (one per element)");
  auto trimmed = [](std::string item) {
    const std::size_t first = item.find_first_not_of(" \t");
    if (first == std::string::npos) return std::string();
    return item.substr(first, item.find_last_not_of(" \t") - first + 1);
  };
  vocab::StatedFor s;
  std::string selector = trimmed(text.substr(0, eq));
  const bool as_param = selector.starts_with("param:"), as_class = selector.starts_with("class:");
  if (as_param || as_class) selector = trimmed(selector.substr(6));
  if (selector.empty()) throw UsageError(flag + ": the param or class name is empty");
  const std::optional<topologies::ParamClass> c = topologies::class_from_name(selector);
  if (as_class && !c)
    throw UsageError(flag + ": '" + selector + "' is not a param class (" + kClassNames + ")");
  if (c && !as_param) s.param_class = c;
  else s.param = selector;
  const std::string value = trimmed(text.substr(eq + 1));
  auto number = [&](const std::string& raw) {
    const std::string item = trimmed(raw);
    if (item.empty()) throw UsageError(flag + ": an empty value (a stray comma?)");
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end != item.c_str() + item.size() || !std::isfinite(v))
      throw UsageError(flag + ": '" + item + "' is not a finite number");
    if (errno == ERANGE)
      throw UsageError(flag + ": '" + item + "' is outside the range of a double");
    return v;
  };
  if (value.empty()) throw UsageError(flag + ": the value is empty");
  if (value.front() == 'x' || value.front() == '*') {
    s.gradient.kind = topologies::StatedGradient::Kind::scale;
    s.gradient.number = number(value.substr(1));
  } else if (value.front() == '[') {
    if (value.back() != ']') throw UsageError(flag + ": a list is written [v1,v2,...]");
    s.gradient.kind = topologies::StatedGradient::Kind::values;
    const std::string items = value.substr(1, value.size() - 2);
    if (trimmed(items).empty()) throw UsageError(flag + ": the list is empty");
    for (std::size_t at = 0;;) {  // every item, empty ones too, so "[1,2,]" is an error
      const std::size_t comma = items.find(',', at);
      s.gradient.values.push_back(number(items.substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  } else {
    s.gradient.kind = topologies::StatedGradient::Kind::constant;
    s.gradient.number = number(value);
  }
  return s;
}

// --megatron-release: the release's own rules, where they differ from the ones tally checks, added
// as faults for the case's optimizer.
void with_release_rules(const RunOptions& o, casefile::Case& c) {
  if (o.megatron_release.empty()) return;
  std::string names;
  for (const gradnorm::ReleaseInfo& info : gradnorm::megatron_releases())
    names += (names.empty() ? "" : ", ") + std::string(info.name);
  const gradnorm::MegatronRelease release = parse_choice<gradnorm::MegatronRelease>(
      "--megatron-release", o.megatron_release, gradnorm::release_from_name, names);
  if (std::optional<std::string> error = gradnorm::check_release_config(release, c.topology))
    throw UsageError("--megatron-release " + o.megatron_release + ": " + *error);
  c.path.faults = c.path.faults.with(gradnorm::release_faults(release, c.path.optimizer));
}

casefile::Case case_from_flags(const RunOptions& o) {
  if (o.topology.world == 0) throw UsageError("--world is required (or give a case file)");
  casefile::Case c;
  c.topology = to_valid_config(o.topology);
  c.model = to_model_spec(o.model, c.topology);
  vocab::PathOptions& path = c.path;
  path.optimizer = parse_choice<vocab::OptimizerModel>(
      "--optimizer", o.optimizer, vocab::optimizer_model_from_name,
      "plain, distributed, layerwise, muon");
  path.gradients.generator.mode = parse_choice<kernels::GradientMode>(
      "--grads", o.grads, kernels::mode_from_name,
      "ones, zeros, dyadic, uniform, normal, sparse, rank-encoded");
  path.gradients.generator.dtype = parse_choice<kernels::Dtype>(
      "--grad-dtype", o.grad_dtype, kernels::dtype_from_name, "fp32, bf16, fp16");
  path.gradients.generator.seed = o.seed;
  path.gradients.class_mask = parse_classes(o.grad_classes);
  for (const std::string& text : o.grad_values) path.gradients.stated.push_back(parse_grad_value(text));
  path.accumulation = parse_choice<kernels::Accumulation>(
      "--accumulation", o.accumulation, kernels::accumulation_from_name, "fp32, fp64");
  path.p_values = o.p_norms;
  path.max_norm = o.max_norm;
  path.bucket_elements = o.bucket_elements;
  path.gradients.before_reduction = parse_choice<bool>(
      "--gradients-enter", o.gradients_enter,
      [](std::string_view name) -> std::optional<bool> {
        if (name == "after_reduction" || name == casefile::kBeforeReduction) return name == casefile::kBeforeReduction;
        return std::nullopt;
      },
      "after_reduction, before_reduction");
  for (vocab::Fault fault : parse_fault_list(o.faults, "--fault")) path.faults = path.faults.with(fault);
  with_release_rules(o, c);
  return c;
}

// The catalog as JSON: what the workers' plant tables are tested against, by name.
void print_fault_catalog_json(std::ostream& out) {
  nlohmann::ordered_json faults = nlohmann::ordered_json::array();
  for (const vocab::FaultInfo& info : vocab::fault_catalog())
    faults.push_back({{"name", info.name},
                      {"provenance", info.provenance},
                      {"wrong_rule", info.wrong_rule},
                      {"trigger", info.trigger}});
  out << nlohmann::ordered_json{{"faults", std::move(faults)}}.dump(2) << '\n';
}

void print_fault_catalog(std::ostream& out) {
  out << "Faults (each replaces one rule with the wrong rule a real framework shipped):\n\n";
  for (const vocab::FaultInfo& info : vocab::fault_catalog()) {
    out << info.name << "\n  from:    " << info.provenance << "\n  wrong:   " << info.wrong_rule
        << "\n  trigger: " << info.trigger << "\n\n";
  }
}

// The case to run: the file's, or the flags'. Throws UsageError.
casefile::Case input_case(const RunOptions& o) {
  if (o.case_file.empty()) return case_from_flags(o);
  for (const CLI::Option* option : o.case_flags)
    if (option->count() > 0 && option->get_name() != "--megatron-release")
      throw UsageError("the case file " + o.case_file + " cannot be combined with the case flag " +
                       option->get_name() + " (edit the file, or give the case by flags only)");
  casefile::Case c;
  try {
    c = casefile::load_case_file(o.case_file, run::case_frameworks());
  } catch (const casefile::CaseFileError& error) {
    throw UsageError(error.what());
  }
  with_release_rules(o, c);
  return c;
}

// "expect fail (l2, ledger; decoder.layers.0.mlp...)" for the expectation line.
std::string expectation_text(const casefile::Expectation& e) {
  std::string text = "expect " + std::string(casefile::outcome_name(e.outcome));
  std::string details;
  for (const std::string& name : e.statistics) details += (details.empty() ? "" : ", ") + name;
  if (!e.miscounted.empty()) {
    details += details.empty() ? "" : "; ";
    details += std::to_string(e.miscounted.size()) + " miscounted param" +
               (e.miscounted.size() == 1 ? "" : "s");
  }
  return details.empty() ? text : text + " (" + details + ")";
}

}  // namespace

void add_run_command(CLI::App& app, CommandContext& context, std::string command_line) {
  auto options = std::make_shared<RunOptions>();
  options->command_line = std::move(command_line);
  CLI::App* command = app.add_subcommand(
      "run",
      "Run one case on every rank of a topology and compare with the Eigen ground truth: the "
      "norm, inf norm, zero count, clip coefficient, clipped gradients and the exact ledger of "
      "every logical parameter. Exit 0 pass, 1 fail, 2 bad input, 3 infrastructure failure.");
  // Every option registered from here to the snapshot below describes the case, and so cannot
  // be combined with a case file.
  const std::size_t options_before = command->get_options().size();
  add_topology_flags(*command, options->topology, /*world_required=*/false);
  add_model_flags(*command, options->model);
  command->add_option("--optimizer", options->optimizer,
                      "Optimizer model: plain, distributed, layerwise, muon")
      ->capture_default_str();
  command->add_option("--grads", options->grads,
                      "Gradient values: ones, zeros, dyadic, uniform, normal, sparse, "
                      "rank-encoded (exact modes: ones, zeros, dyadic, rank-encoded)")
      ->capture_default_str();
  command->add_option("--grad-dtype", options->grad_dtype, "Stored gradient dtype: fp32, bf16, fp16")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "Gradient seed")->check(seed_number())->capture_default_str();
  command->add_option("--grad-classes", options->grad_classes,
                      "Only these param classes get gradients, the rest are zero "
                      "(e.g. expert-row-bias)")
      ->delimiter(',');
  command->add_option("--grad-value", options->grad_values,
                      "State a param's gradients as a bug report gives them (repeatable; a later "
                      "one wins): NAME=0.1 (every element), NAME=x3 (the generated values times "
                      "3) or NAME=[1,2,3,4] (one per element, row-major); NAME is a logical param "
                      "(tally layout lists them) or a class (expert-row-bias=0.1); param:NAME or "
                      "class:NAME where a param is named like a class");
  command->add_option("--accumulation", options->accumulation, "Local sums in fp64 or fp32")
      ->capture_default_str();
  command->add_option("--p-norms", options->p_norms, "Extra p-norms to check (e.g. 1,3)")
      ->delimiter(',')
      ->check(any_real());
  command->add_option("--max-norm,--clip-grad", options->max_norm,
                      "Clip threshold (Megatron-LM's --clip-grad; 0: no clipping)")
      ->check(any_real())
      ->capture_default_str();
  command->add_option("--bucket-elements", options->bucket_elements,
                      "Distributed optimizer bucket size in elements (0: one bucket)")
      ->check(whole_number(0, kNoUpperBound))
      ->capture_default_str();
  command->add_option("--gradients-enter", options->gradients_enter,
                      "Where the gradients enter Megatron-LM's path: after_reduction (each rank holds the "
                      "reduced gradient) or before_reduction (each rank its own share, summed by tally's model "
                      "of megatron-core 0.19.2's finalize_model_grads, or with --target megatron-core by "
                      "megatron-core's own; DP x CP a power of two)")
      ->capture_default_str();
  command->add_option("--fault", options->faults,
                      "Switch on faults of the catalog: names (repeat, or comma-separate), all, or "
                      "none");
  command->add_option("--megatron-release", options->megatron_release,
                      "Run a released megatron-core's rules where they differ from the ones tally "
                      "checks (0.16.1, 0.19.2): adds those faults for this optimizer, so the "
                      "verdict says whether that release miscounts the case; with a case file too");
  {
    const std::vector<CLI::Option*> all = command->get_options();
    options->case_flags.assign(all.begin() + static_cast<std::ptrdiff_t>(options_before), all.end());
  }
  command->add_option("case", options->case_file,
                      "A case file (JSON, docs/case-files.md) to run instead of the case flags");
  command->add_option("--save", options->save,
                      "Write the case to this file (atomically) before running it")
      ->check(output_file());
  command->add_option("--expect", options->expect,
                      "With --save: the expectation to record: pass, fail, or observed (what "
                      "this run shows: outcome, failed statistics, miscounted params)")
      ->check(CLI::IsMember({"pass", "fail", "observed"}));
  command->add_option("--description", options->description,
                      "With --save: the case's description (one line)");
  CLI::Option* manifests_flag = command->add_option("--manifests", options->manifests,
                      "After the run, write the manifests tally's own model of the path would "
                      "write (rank-<R>.json per rank and groups.json, docs/manifest.md, faults included) to "
                      "this folder, for `tally check DIR`. sim backend only; a run that hangs "
                      "writes none")
      ->check(output_folder());
  command->add_option("--manifest-version", options->manifest_version,
                      "With --manifests: the format to write, 2 (rank files refer to groups.json, "
                      "which holds each group once) or 1 (every rank file lists its groups' ranks; "
                      "grows with the world squared)")
      ->check(CLI::IsMember({1, 2}))
      ->needs(manifests_flag)
      ->capture_default_str();
  command->add_flag("--list-faults", options->list_faults,
                    "Print the fault catalog and exit (with --json: {\"faults\": [{name, provenance, "
                    "wrong_rule, trigger}]}, what the workers' plant tables are tested against)");
  command->add_flag("--json", options->json, "Machine-readable verdict");
  command->add_option("--html", options->html,
                      "Also write the verdict as a self-contained HTML page to this file: the "
                      "ledger as a matrix of params against ranks, the rank grid with the ranks "
                      "that dropped or double-counted, the replay command")
      ->check(output_file());
  add_backend_flags(*command);
  add_target_flags(*command, options->target);
  command->callback([options, &context] {
    if (options->list_faults) {
      if (options->json) print_fault_catalog_json(context.out);
      else print_fault_catalog(context.out);
      context.exit_code = kExitPass;
      return;
    }
    const RunOptions& o = *options;
    if (o.save.empty() && !o.expect.empty()) throw UsageError("--expect needs --save FILE");
    if (o.save.empty() && !o.description.empty())
      throw UsageError("--description needs --save FILE");
    std::unique_ptr<run::Target> target = chosen_target(o.target, context.backend, context.err,
                                                        /*keep_manifests=*/true);
    if (target->framework() && !o.megatron_release.empty())
      throw UsageError("--megatron-release runs tally's model of a release's rules; with --target " +
                       o.target.target + " the installed release itself runs (leave one out)");
    if (!o.manifests.empty())
      if (std::optional<std::string> why = target->manifests_refusal()) throw UsageError("--manifests " + *why);
    run::CaseJob job;
    job.c = input_case(o);
    job.source = o.case_file;
    // A case the flags describe, as the target runs it (DeepSpeed: its section's defaults).
    if (o.case_file.empty()) job.c = target->from_flags(std::move(job.c));
    if (!o.description.empty()) {
      if (std::optional<std::string> error = casefile::description_error(o.description))
        throw UsageError("--description: " + *error);
      job.c.description = o.description;
    }
    job.save = o.save;
    job.expect = o.expect == "pass"       ? run::CaseJob::Expect::pass
                 : o.expect == "fail"     ? run::CaseJob::Expect::fail
                 : o.expect == "observed" ? run::CaseJob::Expect::observed
                                          : run::CaseJob::Expect::as_given;
    job.manifests = o.manifests;
    job.manifest_version = o.manifest_version;
    run::CaseJobResult result;
    try {
      result = run::run_case_job(*target, std::move(job));
    } catch (const casefile::InvalidCase& error) {
      throw UsageError(error.what());
    } catch (const run::JobOutputError& error) {
      throw UsageError(error.what());
    } catch (const run::TargetUnavailable& error) {
      context.err << "tally: error: " << error.what() << '\n';
      context.exit_code = kExitInfra;
      return;
    }
    if (result.refused) throw UsageError(*result.refused);
    const casefile::Case& c = result.c;
    const oracle::Verdict& verdict = result.verdict;
    const bool manifests_written = result.manifests_written;
    const std::optional<std::string>& unmet = result.unmet;
    const std::string case_source = !o.case_file.empty() ? o.case_file : o.save;
    const std::string replay =
        case_source.empty() ? o.command_line : "tally run " + shell_quote(case_source);
    if (!o.html.empty()) {
      // Checked writable before the run; should writing still fail, the verdict stands.
      try {
        write_case_html(o.html, "tally run", c, verdict, {replay});
      } catch (const UsageError& error) {
        context.err << "tally: error: " << error.what() << " (the verdict stands)\n";
      }
    }
    if (o.json) {
      nlohmann::ordered_json j = verdict_json(verdict);
      if (c.expect)
        j["expectation"] = {{"expect", casefile::case_to_json(c)["expect"]},
                            {"met", !unmet.has_value()},
                            {"reason", unmet.value_or("")}};
      if (!case_source.empty()) j["case_file"] = case_source;
      if (!o.manifests.empty())
        j["manifests"] = manifests_written ? nlohmann::ordered_json(o.manifests) : nullptr;
      context.out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
                  << '\n';
    } else {
      print_verdict(context.out, c, verdict, replay);
      if (!o.save.empty()) context.out << "saved: " << o.save << '\n';
      if (!o.manifests.empty())
        context.out << (manifests_written ? "manifests: " + o.manifests + " (tally check " +
                                                shell_quote(o.manifests) + ")"
                                          : std::string("manifests: none (the run hung)"))
                    << '\n';
      if (c.expect)
        context.out << "expectation (" << expectation_text(*c.expect) << "): "
                    << (unmet ? "NOT met: " + *unmet : std::string("met")) << '\n';
    }
    context.exit_code = verdict.kind == oracle::Verdict::Kind::pass       ? kExitPass
                        : verdict.kind == oracle::Verdict::Kind::infra_error ? kExitInfra
                                                                             : kExitFail;
  });
}

}  // namespace tally::cli
