// A case: one parallel configuration, one model, one optimizer model with its gradients and
// statistics, the faults switched on, and what the run is expected to give. The unit the fuzzer
// generates and shrinks, case files store, and `tally run` and `tally replay` run.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "vocab/path_options.h"
#include "topologies/model_spec.h"
#include "topologies/parallel_config.h"

namespace tally::casefile {

struct Expectation {
  enum class Outcome { pass, fail, infra_error };
  Outcome outcome = Outcome::pass;
  // For fail: statistics that must fail ("l2", "zeros", "agreement", "clipped", "ledger", ...)
  // and logical params that must be miscounted. Empty: any failure will do.
  std::vector<std::string> statistics;
  std::vector<std::string> miscounted;
  friend bool operator==(const Expectation&, const Expectation&) = default;
};
std::string_view outcome_name(Expectation::Outcome outcome);  // "pass", "fail", "infra-error"

// The real framework a case runs on instead of tally's model of the path (tally fuzz --target):
// its name and the version its worker reported, and the manifests the run that found the case
// wrote, saved next to the case file, so replay can judge them where the framework is absent.
struct RealTarget {
  std::string framework;  // as --target names it: the name of one of the reader's FrameworkSchemas
  std::string version;    // "0.19.2"
  std::string manifests;  // folder, relative to the case file's folder; "" when none was saved
  friend bool operator==(const RealTarget&, const RealTarget&) = default;
};

// A framework's own settings of a case, its case section (DeepSpeed's engine configuration, say),
// kept as the framework's reader wrote them, canonical JSON. Only that framework
// reads them (run/<framework>/section.h); the case reader knows a section by its FrameworkSchema.
struct FrameworkSection {
  nlohmann::ordered_json settings;
  // The framework's worker builds models of its own, not Megatron-LM's, so Megatron-LM's build-time
  // model rules (topologies::check_megatron_expert_bias) do not bind a case holding this section.
  bool own_models = false;
  friend bool operator==(const FrameworkSection&, const FrameworkSection&) = default;
};

// What the case reader knows of one real framework, from its row in run/'s table of targets
// (run::case_frameworks()): the name a case's target section gives it, and its case section.
struct FrameworkSchema {
  std::string_view name;     // as a case's target.framework names it
  std::string_view section;  // its section's key, a case's top-level key; "" when it has none
  // Reads a section strictly (io::JsonReadError naming `path`'s field and the rule) into its canonical JSON.
  nlohmann::ordered_json (*read_section)(const nlohmann::json& value, const std::string& path) = nullptr;
  bool own_models = false;  // FrameworkSection::own_models of the sections it reads
};
using FrameworkSchemas = std::span<const FrameworkSchema>;

struct Case {
  std::string description;
  topologies::ParallelConfig topology;
  topologies::ModelSpec model;
  vocab::PathOptions path;
  // By key: the settings only one framework reads (each target keeps its own section alone).
  std::map<std::string, FrameworkSection, std::less<>> sections;
  std::optional<RealTarget> target;  // absent: tally's model of the path (the model target)
  std::optional<Expectation> expect;
  friend bool operator==(const Case&, const Case&) = default;
};

// The settings of `c`'s section `key`; nullptr when it holds none.
const nlohmann::ordered_json* section_settings(const Case& c, std::string_view key);

// Drops every section of `c` but `key`'s ("" drops them all): a target's projection of a case into
// its space keeps its own section alone.
void keep_only_section(Case& c, std::string_view key);

// A case that breaks a rule of the configuration, the model or the options. exit code 2.
class InvalidCase : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The first problem with the case as one line, or nullopt: check_config, check_model for the
// configuration, and the option rules (finite p > 0, finite max_norm >= 0, ...).
std::optional<std::string> check_case(const Case& c);

// Drops the stated gradients (gradients.stated) for a param or class the model no longer has, as
// after a real target removed a feature (an MTP layer, an attention sink, ...). `naming`: the
// topology the params are named in (a tied copy is a param of its own only with PP > 1).
void drop_stated_gradients_without_a_param(Case& c, const topologies::ParallelConfig& naming);

}  // namespace tally::casefile
