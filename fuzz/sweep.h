// A sweep: every valid configuration of one world, collapsed to its distinct layouts, each crossed
// with the model features that change what is counted and with the target's own axes (the
// optimizer models, or a framework's engine paths), one case each, run on a target. Where a
// campaign samples, a sweep covers: it says how many configurations, layouts and cases it ran,
// which the target refused and why, and what failed.
//
// Two configurations are one layout when they give the same process groups in every family
// (topologies/rank_layout.h): the path, and a framework built from the same groups, cannot tell
// them apart. Cases are numbered in a fixed order (layout, feature, the target's axis), so a sweep
// is split across machines by `shard` (the cases of layout l belong to shard l mod N: a layout's
// cases stay together, one after another, so a framework's worker keeps its parallel state across
// them) and resumed by skipping the cases a state already holds.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "fuzz/known.h"
#include "fuzz/shrink.h"
#include "oracle/verdict.h"
#include "run/target.h"
#include "topologies/parallel_config.h"
#include "topologies/presets.h"

namespace tally::fuzz {

// A model feature that changes what is counted (the sweep's models are small GPTs).
enum class SweepFeature : std::uint8_t {
  dense,               // no experts; linear biases; the output layer tied to the embedding
  moe,                 // experts (2 per EP rank); no biases; tied output
  moe_expert_biases,   // experts with biases (Megatron-LM allows them only with ETP 1)
  moe_shared_untied,   // experts, a shared expert, an untied output layer; no biases
};
inline constexpr SweepFeature kAllSweepFeatures[] = {SweepFeature::dense, SweepFeature::moe,
                                                     SweepFeature::moe_expert_biases,
                                                     SweepFeature::moe_shared_untied};
std::string_view sweep_feature_name(SweepFeature feature);  // "dense", "moe", "moe-expert-biases", ...

// The small GPT of `feature` on `config`, or why it has none there (one line).
struct SweepModel {
  std::optional<topologies::ModelSpec> model;
  std::string why_none;
};
SweepModel sweep_model(const topologies::ParallelConfig& config, SweepFeature feature);

struct SweepLayout {
  // The first configuration of the layout in enumeration order, or its first in tally's default
  // order where it has one.
  topologies::ParallelConfig config;
  std::int64_t configurations = 0;    // how many configurations share its groups
};

// The distinct layouts of every valid configuration of `world` (vpp 1, one optimizer instance,
// every full axis order), in enumeration order of their first configuration.
struct SweepLayouts {
  std::int64_t configurations = 0;
  std::vector<SweepLayout> layouts;
};
SweepLayouts sweep_layouts(int world);

struct SweepCase {
  std::int64_t index = 0;  // its number in the whole sweep (shards number alike)
  std::string id;          // "L007-moe-expert-biases-layerwise": layout, feature, the target's axis
  int layout = 0;          // index into SweepLayouts::layouts
  casefile::Case c;        // its expectation unset
};

struct SweepOptions {
  int world = 0;
  // The models swept: the features, then the architecture presets (topologies/presets.h). Both
  // empty: every feature and every preset; one of them named: only what it names.
  std::vector<SweepFeature> features;
  std::vector<topologies::Preset> presets;
  int shard = 0, shards = 1;           // this shard's cases: those of layouts l with l mod shards == shard
};

// Every case of the sweep of `options` on `target` (its axes: Target::sweep_variants), in order,
// this shard's only. Cases of a feature with no model on a layout are left out (counted by the
// plan's `features_not_applicable`).
struct SweepPlan {
  SweepLayouts layouts;
  std::vector<SweepCase> cases;
  std::int64_t total_cases = 0;               // of every shard
  std::int64_t features_not_applicable = 0;   // (layout, feature or preset) pairs without a model
  std::vector<std::string> models;            // the features' and presets' names, in order
};
SweepPlan plan_sweep(const SweepOptions& options, const run::Target& target);

// What one case of a sweep gave.
struct SweepResult {
  std::int64_t index = 0;  // the case's number in the sweep
  std::string id;
  enum class Outcome { pass, fail, refused, infra_error };
  Outcome outcome = Outcome::pass;
  std::string detail;     // fail: the signature ("fail: ledger (expert-row-bias), l2"); refused or
                          // infra-error: why
  std::string case_file;  // fail or infra-error: where the case was saved ("" without a corpus)
  std::string known;      // fail: the known finding it repeats ("" when new)
  double seconds = 0.0;
  // A real target whose release tally models (SweepRunOptions::release_model): whether the case
  // was held against that model, and where the model's verdict is another, what it gave ("pass",
  // or a failure's signature with its miscount); "" when they agree or it was not held.
  bool model_checked = false;
  std::string model_disagrees;
  // refused: by the framework's own check as the worker set the case up, not by a rule of tally's
  // (the target's rules, which cite the framework's checks).
  bool by_framework = false;
};
std::string_view sweep_outcome_name(SweepResult::Outcome outcome);  // "pass", "fail", "refused", "infra-error"
std::optional<SweepResult::Outcome> sweep_outcome_from_name(std::string_view name);

// A sweep's report, which is also its state: rewritten as the sweep goes, so a sweep killed on the
// way resumes from it, and the reports of a sweep's shards merge into the whole sweep's.
struct SweepReport {
  int world = 0;
  std::string target;   // "model", "megatron-core", ...
  std::string version;  // the release (tally's own for its model)
  std::vector<std::string> features;  // the features swept, by name
  int shard = 0, shards = 1;          // merged: shards 1
  std::int64_t configurations = 0;
  std::int64_t layouts = 0;
  std::int64_t total_cases = 0;  // of every shard
  std::int64_t features_not_applicable = 0;
  std::vector<SweepResult> results;  // the cases run so far, in case order
};
nlohmann::ordered_json sweep_report_json(const SweepReport& report);
// Throws std::runtime_error, one line naming `source`, the field and the rule.
SweepReport read_sweep_report(std::string_view text, std::string_view source);
// The shards' reports as the report of the whole sweep. Throws std::invalid_argument naming the
// report that is of another sweep, a shard given twice, or a shard missing.
SweepReport merge_sweep_reports(const std::vector<SweepReport>& shards);

struct SweepRunOptions {
  std::string corpus_dir;  // each failure and infrastructure error saved here as <id>.json; "": nowhere
  // The known finding a failure repeats ("" when it is new): known_finding_of below.
  std::function<std::string(const casefile::Case&, const oracle::Verdict&)> known;
  // tally's model of the target's release, where there is one: its verdict of a case, or nullopt
  // for a case it does not model. Each case the release runs to a verdict is run on it too, and a
  // different verdict is reported (model_disagreement below).
  std::function<std::optional<oracle::Verdict>(const casefile::Case&)> release_model;
  // Hears of each failure and infrastructure error: the case as saved, its verdict, its file.
  std::function<void(const SweepCase&, const casefile::Case&, const oracle::Verdict&, const std::string& case_file)>
      on_failure;
};

// Where tally's model of a release (`predicted`) and the release (`observed`) disagree on a case:
// a different kind of verdict, or failures that miscount other params or another number of
// elements of them, or one failing on its ledger and the other not. One line ("the model: pass;
// the release: fail: ledger (expert-row-bias) ...") or nullopt when they agree. Statistics that
// fail beside the ledger are left out: a real run's are judged from its manifests and may fail
// more of them than tally's model does for one miscount.
std::optional<std::string> model_disagreement(const oracle::Verdict& predicted, const oracle::Verdict& observed);

// Whether a sweep stops because its target's machinery fails: `ran` holds, oldest first, whether each
// case that ran (refused ones left out) was an infrastructure error. Three in a row, or half of the
// last ten: a worker that breaks every other case gives no true count either. One line saying
// which, or nullopt to go on.
inline constexpr std::size_t kMachineryWindow = 10;
std::optional<std::string> machinery_failing(const std::vector<bool>& ran);

// Runs one case of a sweep on `target`: what no release runs, then, opened for its world, what its
// release does not run (refused, with the reason), then the run. A failure is saved with the
// expectation it showed and, for a real target, the run's manifests next to it (a case file
// `tally replay` judges where the framework is absent); an infrastructure error is saved too.
// Throws run::TargetUnavailable (the sweep stops; its state lets it resume) and std::runtime_error
// when the corpus cannot be written.
SweepResult run_sweep_case(const SweepCase& sc, run::Target& target, const SweepRunOptions& options);

}  // namespace tally::fuzz
