#include "fuzz/sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <stdexcept>
#include <system_error>

#include "casefile/case.h"
#include "casefile/case_file.h"
#include "run/target.h"
#include "io/atomic_file.h"
#include "io/json_read.h"
#include "run/drive_case.h"
#include "run/case_job.h"
#include "topologies/enumerate.h"
#include "topologies/parallel_config.h"
#include "topologies/model_spec.h"
#include "topologies/rank_layout.h"
#include "vocab/optimizer_models.h"

namespace tally::fuzz {

std::string_view sweep_feature_name(SweepFeature feature) {
  switch (feature) {
    case SweepFeature::dense: return "dense";
    case SweepFeature::moe: return "moe";
    case SweepFeature::moe_expert_biases: return "moe-expert-biases";
    case SweepFeature::moe_shared_untied: return "moe-shared-untied";
  }
  return "?";
}

std::string_view sweep_outcome_name(SweepResult::Outcome outcome) {
  switch (outcome) {
    case SweepResult::Outcome::pass: return "pass";
    case SweepResult::Outcome::fail: return "fail";
    case SweepResult::Outcome::refused: return "refused";
    case SweepResult::Outcome::infra_error: return "infra-error";
  }
  return "?";
}

std::optional<SweepResult::Outcome> sweep_outcome_from_name(std::string_view name) {
  for (SweepResult::Outcome o : {SweepResult::Outcome::pass, SweepResult::Outcome::fail, SweepResult::Outcome::refused,
                                 SweepResult::Outcome::infra_error})
    if (sweep_outcome_name(o) == name) return o;
  return std::nullopt;
}

SweepModel sweep_model(const topologies::ParallelConfig& config, SweepFeature feature) {
  topologies::ModelSpec m;
  m.kind = topologies::ModelKind::gpt;
  // Every size a multiple of what divides it: heads and vocab by TP, the FFNs by TP and ETP, the
  // experts by EP; one decoder layer per pipeline stage.
  m.num_layers = config.pp * config.vpp;
  m.num_attention_heads = 2 * config.tp;
  m.hidden_size = 2 * m.num_attention_heads;
  m.ffn_hidden_size = 2 * config.tp;
  m.vocab_size = 4 * config.tp;
  m.max_position_embeddings = 4;
  m.add_bias_linear = feature == SweepFeature::dense || feature == SweepFeature::moe_expert_biases;
  if (feature != SweepFeature::dense) {
    m.num_experts = 2 * config.ep;
    m.moe_ffn_hidden_size = 2 * config.etp;
  }
  if (feature == SweepFeature::moe_shared_untied) {
    m.moe_shared_expert_intermediate_size = 2 * config.tp;
    m.untie_embeddings_and_output_weights = true;
  }
  if (std::optional<std::string> why = topologies::check_model(m, config)) return {std::nullopt, *why};
  if (std::optional<std::string> why = topologies::check_megatron_expert_bias(m, config)) return {std::nullopt, *why};
  return {m, ""};
}

namespace {

// Every group of every family, as one string: equal for two configurations exactly when their
// process groups are.
std::string groups_key(const topologies::RankLayout& layout) {
  std::string key;
  for (topologies::Family family : topologies::kAllFamilies) {
    key += std::to_string(static_cast<int>(family)) + ':';
    for (int g = 0; g < layout.group_count(family); ++g) {
      for (int rank : layout.ranks({family, g})) key += std::to_string(rank) + ',';
      key += ';';
    }
    key += '|';
  }
  return key;
}

// The target's cases of `base` (one distributed-optimizer instance), then, for each number of
// instances k > 1 its layout allows (Megatron-LM's --num-distributed-optimizer-instances: k divides
// DP x CP and the expert DP), the cases of its optimizer models that have instances (the distributed
// optimizer, Megatron-FSDP's hybrid sharding over it), named "<axis>-instances<k>". The instances
// change each stats group, so what each counts.
std::vector<std::pair<std::string, casefile::Case>> with_instances(const casefile::Case& base, const run::Target& target) {
  std::vector<std::pair<std::string, casefile::Case>> out = target.sweep_variants(base);
  const int dp_cp = topologies::dp(base.topology) * base.topology.cp;
  for (int k = 2; k <= dp_cp; ++k) {
    casefile::Case instanced = base;
    instanced.topology.dist_opt_instances = k;
    if (dp_cp % k != 0 || topologies::check_config(instanced.topology)) continue;
    for (auto& [axis, c] : target.sweep_variants(instanced)) {
      if (c.path.optimizer != vocab::OptimizerModel::distributed || c.topology.dist_opt_instances != k) continue;
      if (casefile::check_case(c) || target.refusal_before_open(c)) continue;
      out.emplace_back(axis + "-instances" + std::to_string(k), std::move(c));
    }
  }
  return out;
}

std::string case_id(int layout, std::string_view model, const std::string& axis) {
  char head[16];
  std::snprintf(head, sizeof head, "L%03d", layout);
  return std::string(head) + "-" + std::string(model) + "-" + axis;
}

// A model the sweep lays out on every layout: a feature's small GPT or a preset's.
struct SweptModel {
  std::string name;
  std::function<SweepModel(const topologies::ParallelConfig&)> on;
};

std::vector<SweptModel> swept_models(const SweepOptions& options) {
  const bool every = options.features.empty() && options.presets.empty();
  std::vector<SweptModel> out;
  for (SweepFeature f : every ? std::vector<SweepFeature>(std::begin(kAllSweepFeatures), std::end(kAllSweepFeatures))
                              : options.features)
    out.push_back({std::string(sweep_feature_name(f)), [f](const topologies::ParallelConfig& c) { return sweep_model(c, f); }});
  for (topologies::Preset p : every ? std::vector<topologies::Preset>(std::begin(topologies::kAllPresets),
                                                                      std::end(topologies::kAllPresets))
                                    : options.presets)
    out.push_back({std::string(topologies::preset_name(p)), [p](const topologies::ParallelConfig& c) {
                     topologies::PresetModel m = topologies::preset_model(p, c);
                     return SweepModel{std::move(m.model), std::move(m.why_none)};
                   }});
  return out;
}

}  // namespace

SweepLayouts sweep_layouts(int world) {
  SweepLayouts out;
  std::map<std::string, std::size_t> index;  // groups key -> its layout
  out.configurations = topologies::for_each_config(world, {}, [&](const topologies::ParallelConfig& config) {
    const std::string key = groups_key(topologies::RankLayout(config));
    auto [it, added] = index.emplace(key, out.layouts.size());
    if (added) out.layouts.push_back({config, 0});
    SweepLayout& layout = out.layouts[it->second];
    // Stands for the layout in tally's default order where one of its configurations has it: a
    // framework that builds its groups in that order only (DeepSpeed) then runs the layout.
    if (layout.config.order != topologies::kDefaultOrder && config.order == topologies::kDefaultOrder)
      layout.config = config;
    ++layout.configurations;
  });
  return out;
}

SweepPlan plan_sweep(const SweepOptions& options, const run::Target& target) {
  SweepPlan plan;
  plan.layouts = sweep_layouts(options.world);
  const std::vector<SweptModel> models = swept_models(options);
  for (const SweptModel& m : models) plan.models.push_back(m.name);
  std::int64_t index = 0;
  for (std::size_t l = 0; l < plan.layouts.layouts.size(); ++l) {
    const topologies::ParallelConfig& config = plan.layouts.layouts[l].config;
    std::vector<SweepCase> layout_cases;
    for (const SweptModel& swept : models) {
      const SweepModel model = swept.on(config);
      if (!model.model) {
        ++plan.features_not_applicable;
        continue;
      }
      casefile::Case base;
      base.topology = config;
      base.model = *model.model;
      base.path.gradients.generator.mode = kernels::GradientMode::dyadic;
      base.path.gradients.generator.dtype = kernels::Dtype::fp32;
      base.path.max_norm = 1.0;
      for (auto& [axis, c] : with_instances(base, target)) {
        SweepCase sc;
        sc.id = case_id(static_cast<int>(l), swept.name, axis);
        sc.layout = static_cast<int>(l);
        sc.c = std::move(c);
        layout_cases.push_back(std::move(sc));
      }
    }
    // A layout's cases by number of distributed-optimizer instances, each feature in turn: the
    // instances are part of a framework's parallel state (Megatron's initialize_model_parallel), so
    // a worker makes it anew once per number, not once per feature and number.
    std::stable_sort(layout_cases.begin(), layout_cases.end(), [](const SweepCase& a, const SweepCase& b) {
      return a.c.topology.dist_opt_instances < b.c.topology.dist_opt_instances;
    });
    for (SweepCase& sc : layout_cases) {
      sc.index = index++;
      // A gradient seed of its own, from its number: reproducible, and different per case.
      sc.c.path.gradients.generator.seed = 1000 + static_cast<std::uint64_t>(sc.index);
      sc.c.description = "tally sweep --world " + std::to_string(options.world) + ": " + sc.id;
      if (sc.layout % options.shards == options.shard) plan.cases.push_back(std::move(sc));
    }
  }
  plan.total_cases = index;
  return plan;
}

std::optional<std::string> model_disagreement(const oracle::Verdict& predicted, const oracle::Verdict& observed) {
  using Kind = oracle::Verdict::Kind;
  const auto said = [](const oracle::Verdict& v) {
    std::string out = describe(failure_signature(v));
    if (v.kind == Kind::fail && v.miscounted_total > 0) {
      out += " (" + std::to_string(v.miscounted_total) + " params miscounted";
      for (std::size_t i = 0; i < v.miscounted.size() && i < 3; ++i)
        out += std::string(i == 0 ? ": " : ", ") + v.miscounted[i].name + " counted " +
               std::to_string(v.miscounted[i].counted) + " of " + std::to_string(v.miscounted[i].numel);
      out += ")";
    }
    return out;
  };
  const auto line = [&] { return "tally's model: " + said(predicted) + "; the release: " + said(observed); };
  if (predicted.kind != observed.kind) return line();
  if (predicted.kind != Kind::fail) return std::nullopt;
  if (predicted.miscounted_total != observed.miscounted_total) return line();
  // The miscounts, which the one judge lists in tensor order for both runs.
  const std::size_t n = std::min(predicted.miscounted.size(), observed.miscounted.size());
  for (std::size_t i = 0; i < n; ++i) {
    const oracle::Miscount& a = predicted.miscounted[i];
    const oracle::Miscount& b = observed.miscounted[i];
    if (a.name != b.name || a.counted != b.counted)
      // The first three may agree: name where they part.
      return line() + "; first apart: tally's model " + a.name + " counted " + std::to_string(a.counted) + " of " +
             std::to_string(a.numel) + ", the release " + b.name + " counted " + std::to_string(b.counted) + " of " +
             std::to_string(b.numel);
  }
  return std::nullopt;
}

std::optional<std::string> machinery_failing(const std::vector<bool>& ran) {
  std::size_t in_a_row = 0;
  for (auto it = ran.rbegin(); it != ran.rend() && *it; ++it) ++in_a_row;
  if (in_a_row >= 3) return "three infrastructure errors in a row";
  const std::size_t window = std::min(ran.size(), kMachineryWindow);
  const auto errors = std::count(ran.end() - static_cast<std::ptrdiff_t>(window), ran.end(), true);
  if (window == kMachineryWindow && 2 * static_cast<std::size_t>(errors) >= kMachineryWindow)
    return std::to_string(errors) + " infrastructure errors in the last " + std::to_string(kMachineryWindow) + " cases";
  return std::nullopt;
}

SweepResult run_sweep_case(const SweepCase& sc, run::Target& target, const SweepRunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SweepResult r;
  r.index = sc.index;
  r.id = sc.id;
  auto finish = [&]() -> SweepResult {
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
  };
  // The order of run/drive_case.h: tally's rules, the release's, then the run, in which the
  // framework's own check may decline the case as it sets it up.
  if (std::optional<run::CaseRefusal> refusal = run::refusal_of(target, sc.c)) {
    r.outcome = SweepResult::Outcome::refused;
    r.detail = refusal->why;
    return finish();
  }
  run::DrivenRun driven = run::run_on_target(target, sc.c, /*keep_record=*/false);
  casefile::Case& c = driven.c;
  const oracle::Verdict& verdict = driven.run.verdict;
  if (driven.refused) {
    r.outcome = SweepResult::Outcome::refused;
    r.by_framework = true;
    r.detail = driven.refused->who + " refused it as it set it up: " + driven.refused->why;
    return finish();
  }
  if (options.release_model && verdict.kind != oracle::Verdict::Kind::infra_error) {
    if (const std::optional<oracle::Verdict> predicted = options.release_model(c)) {
      r.model_checked = true;
      r.model_disagrees = model_disagreement(*predicted, verdict).value_or("");
    }
  }
  if (verdict.kind == oracle::Verdict::Kind::pass) return finish();
  r.outcome = verdict.kind == oracle::Verdict::Kind::fail ? SweepResult::Outcome::fail : SweepResult::Outcome::infra_error;
  r.detail = verdict.kind == oracle::Verdict::Kind::fail ? describe(failure_signature(verdict))
                                                          : verdict.infra_call + ": " + verdict.infra_message;
  if (options.known && verdict.kind == oracle::Verdict::Kind::fail) r.known = options.known(c, verdict);
  if (!options.corpus_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options.corpus_dir, error);
    if (error) throw std::runtime_error("cannot create the corpus folder " + options.corpus_dir + ": " + error.message());
    r.case_file = (std::filesystem::path(options.corpus_dir) / (sc.id + ".json")).string();
    c.expect = run::observed_expectation(verdict);
    if (std::optional<casefile::RealTarget> section = run::saved_section(target, c, r.case_file)) c.target = *section;
    casefile::write_case_file(r.case_file, c, run::case_frameworks());
    if (verdict.kind == oracle::Verdict::Kind::infra_error)
      io::write_file_atomically((std::filesystem::path(options.corpus_dir) / (sc.id + ".infra-error.txt")).string(),
                                r.detail + "\n", "infrastructure error's message");
  }
  if (options.on_failure) options.on_failure(sc, c, verdict, r.case_file);
  return finish();
}

nlohmann::ordered_json sweep_report_json(const SweepReport& report) {
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const SweepResult& r : report.results) {
    nlohmann::ordered_json j = {{"index", r.index}, {"id", r.id}, {"outcome", sweep_outcome_name(r.outcome)}};
    if (!r.detail.empty()) j["detail"] = r.detail;
    if (!r.case_file.empty()) j["case_file"] = r.case_file;
    if (!r.known.empty()) j["known"] = r.known;
    if (r.model_checked) j["model_checked"] = true;
    if (!r.model_disagrees.empty()) j["model_disagrees"] = r.model_disagrees;
    if (r.by_framework) j["by_framework"] = true;
    j["seconds"] = r.seconds;
    results.push_back(std::move(j));
  }
  return {{"tally_sweep", 1},
          {"world", report.world},
          {"target", report.target},
          {"version", report.version},
          {"features", report.features},
          {"shard", report.shard},
          {"shards", report.shards},
          {"configurations", report.configurations},
          {"layouts", report.layouts},
          {"total_cases", report.total_cases},
          {"features_not_applicable", report.features_not_applicable},
          {"results", std::move(results)}};
}

SweepReport read_sweep_report(std::string_view text, std::string_view source) {
  using nlohmann::json;
  SweepReport r;
  json j;
  try {
    j = io::parse_json(text, source);  // its messages name `source` already
  } catch (const io::JsonReadError& error) {
    throw std::runtime_error(error.what());
  }
  try {
    const auto count = [](std::int64_t& target) {
      return [&target](const json& v, const std::string& p) { target = io::read_integer(v, p, 0, std::int64_t{1} << 50); };
    };
    io::read_object(
        j, "sweep",
        {{"tally_sweep", [](const json& v, const std::string& p) { io::read_integer(v, p, 1, 1); }},
         {"world", [&](const json& v, const std::string& p) { r.world = static_cast<int>(io::read_integer(v, p, 1, topologies::kMaxWorld)); }},
         {"target", [&](const json& v, const std::string& p) { r.target = io::read_string(v, p, 256); }},
         {"version", [&](const json& v, const std::string& p) { r.version = io::read_string(v, p, 256); }},
         {"features",
          [&](const json& v, const std::string& p) {
            const json& list = io::read_array(v, p, 64);
            for (std::size_t i = 0; i < list.size(); ++i) r.features.push_back(io::read_string(list[i], p + "[" + std::to_string(i) + "]", 64));
          }},
         {"shard", [&](const json& v, const std::string& p) { r.shard = static_cast<int>(io::read_integer(v, p, 0, 1 << 20)); }},
         {"shards", [&](const json& v, const std::string& p) { r.shards = static_cast<int>(io::read_integer(v, p, 1, 1 << 20)); }},
         {"configurations", count(r.configurations)},
         {"layouts", count(r.layouts)},
         {"total_cases", count(r.total_cases)},
         {"features_not_applicable", count(r.features_not_applicable)},
         {"results",
          [&](const json& v, const std::string& p) {
            const json& list = io::read_array(v, p, std::size_t{1} << 24);
            for (std::size_t i = 0; i < list.size(); ++i) {
              const std::string at = p + "[" + std::to_string(i) + "]";
              SweepResult result;
              io::read_object(
                  list[i], at,
                  {{"index", [&](const json& x, const std::string& q) { result.index = io::read_integer(x, q, 0, std::int64_t{1} << 50); }},
                   {"id", [&](const json& x, const std::string& q) { result.id = io::read_string(x, q, 256); }},
                   {"outcome",
                    [&](const json& x, const std::string& q) {
                      const std::string name = io::read_string(x, q, 64);
                      const std::optional<SweepResult::Outcome> o = sweep_outcome_from_name(name);
                      if (!o) io::fail(q, "expected pass, fail, refused or infra-error, got " + io::shown(x));
                      result.outcome = *o;
                    }},
                   {"detail", [&](const json& x, const std::string& q) { result.detail = io::read_string(x, q); }},
                   {"case_file", [&](const json& x, const std::string& q) { result.case_file = io::read_string(x, q, 4096); }},
                   {"known", [&](const json& x, const std::string& q) { result.known = io::read_string(x, q, 4096); }},
                   {"model_checked", [&](const json& x, const std::string& q) { result.model_checked = io::read_bool(x, q); }},
                   {"model_disagrees",
                    [&](const json& x, const std::string& q) { result.model_disagrees = io::read_string(x, q, 4096); }},
                   {"by_framework", [&](const json& x, const std::string& q) { result.by_framework = io::read_bool(x, q); }},
                   {"seconds", [&](const json& x, const std::string& q) { result.seconds = io::read_number(x, q); }}},
                  "a sweep result", {"index", "id", "outcome"});
              r.results.push_back(std::move(result));
            }
          }}},
        "a sweep report", {"tally_sweep", "world", "target", "version", "shard", "shards", "results"});
  } catch (const io::JsonReadError& error) {
    throw std::runtime_error(std::string(source) + ": " + error.what());
  }
  if (r.shard >= r.shards)
    throw std::runtime_error(std::string(source) + ": sweep.shard " + std::to_string(r.shard) + " is not below sweep.shards " +
                             std::to_string(r.shards));
  return r;
}

SweepReport merge_sweep_reports(const std::vector<SweepReport>& shards) {
  if (shards.empty()) throw std::invalid_argument("no sweep reports to merge");
  const SweepReport& first = shards.front();
  std::vector<bool> seen(static_cast<std::size_t>(first.shards), false);
  SweepReport merged = first;
  merged.shard = 0;
  merged.shards = 1;
  merged.results.clear();
  std::map<std::int64_t, SweepResult> by_index;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const SweepReport& s = shards[i];
    const std::string which = "report " + std::to_string(i + 1) + " (shard " + std::to_string(s.shard) + "/" +
                              std::to_string(s.shards) + ")";
    if (s.world != first.world || s.target != first.target || s.version != first.version ||
        s.features != first.features || s.shards != first.shards)
      throw std::invalid_argument(which + " is of another sweep than report 1 (world, target, release, features and "
                                  "shard count must agree)");
    if (seen[static_cast<std::size_t>(s.shard)]) throw std::invalid_argument(which + ": that shard is given twice");
    seen[static_cast<std::size_t>(s.shard)] = true;
    for (const SweepResult& r : s.results) by_index.emplace(r.index, r);
  }
  for (std::size_t k = 0; k < seen.size(); ++k)
    if (!seen[k])
      throw std::invalid_argument("shard " + std::to_string(k) + "/" + std::to_string(first.shards) +
                                  " is missing: merge every shard's report");
  for (auto& [index, r] : by_index) merged.results.push_back(std::move(r));
  return merged;
}

}  // namespace tally::fuzz
