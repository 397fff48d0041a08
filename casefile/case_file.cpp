#include "casefile/case_file.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <set>

#include "io/atomic_file.h"
#include "io/json_read.h"
#include "casefile/model_json.h"
#include "topologies/logical_model.h"

#ifndef TALLY_VERSION
#error "casefile/case_file.cpp needs TALLY_VERSION (set by casefile/CMakeLists.txt)"
#endif

namespace tally::casefile {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using io::JsonReadError;
using io::escape_controls;
using io::fail;
using io::parse_json;
using io::read_array;
using io::read_bool;
using io::read_bounded_file;
using io::read_choice;
using io::read_integer;
using io::read_number;
using io::read_object;
using io::read_string;
using io::read_uint64;
using io::shown;
using io::type_word;
using io::write_file_atomically;

constexpr std::size_t kMaxOrderLength = 64;
constexpr std::size_t kMaxPNorms = 8;
constexpr std::size_t kMaxExpectStatistics = 64;
constexpr std::size_t kMaxToolFieldBytes = 256;

constexpr std::uint32_t kAllClassBits = (std::uint32_t{1} << topologies::kParamClassCount) - 1;

// A rule of the case as a whole (check_case's message), not of one field.
struct SemanticError {
  std::string message;
};

// A string from the input as a message shows it: JSON-quoted (so a control character cannot
// break the line) and shortened.
std::string message_quote(const std::string& text) { return shown(json(text)); }

std::string index_path(const std::string& path, std::size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

template <typename Enum, std::size_t N, typename NameOf>
std::vector<std::string_view> names_of(const std::array<Enum, N>& all, NameOf name_of) {
  std::vector<std::string_view> names;
  for (Enum value : all) names.push_back(name_of(value));
  return names;
}

// A list of distinct strings, each checked by `check` (which may fail with the element path).
template <typename Check>
std::vector<std::string> read_string_list(const json& value, const std::string& path,
                                          std::size_t max_size, std::size_t max_length,
                                          Check check) {
  read_array(value, path, max_size);
  std::vector<std::string> items;
  std::set<std::string> seen;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::string at = index_path(path, i);
    std::string item = read_string(value[i], at, max_length);
    if (!seen.insert(item).second) fail(at, message_quote(item) + " is listed twice");
    check(item, at);
    items.push_back(std::move(item));
  }
  return items;
}

topologies::ParallelConfig read_topology(const json& value, const std::string& path) {
  topologies::ParallelConfig t;
  std::optional<int> etp;
  auto size = [](int& target, int max) {
    return [&target, max](const json& v, const std::string& p) {
      target = static_cast<int>(read_integer(v, p, 1, max));
    };
  };
  const int world_max = topologies::kMaxWorld;
  read_object(value, path,
              {{"world", size(t.world, world_max)},
               {"tp", size(t.tp, world_max)},
               {"cp", size(t.cp, world_max)},
               {"pp", size(t.pp, world_max)},
               {"ep", size(t.ep, world_max)},
               {"etp",
                [&etp](const json& v, const std::string& p) {
                  etp = static_cast<int>(read_integer(v, p, 1, topologies::kMaxWorld));
                }},
               {"gtp", size(t.gtp, world_max)},
               {"egtp", size(t.egtp, world_max)},
               {"vpp", size(t.vpp, topologies::kMaxSize)},
               {"order",
                [&t](const json& v, const std::string& p) {
                  t.order = read_string(v, p, kMaxOrderLength);
                }},
               {"dist_opt_instances", size(t.dist_opt_instances, world_max)}},
              "a topology", {"world"});
  t.etp = etp.value_or(t.tp);  // Megatron-LM's default
  return t;
}

void read_optimizer(const json& value, const std::string& path, vocab::PathOptions& o) {
  const std::vector<std::string_view> models = [] {
    std::vector<std::string_view> names;
    for (const vocab::OptimizerModelInfo& info : vocab::optimizer_models())
      names.push_back(info.name);
    return names;
  }();
  read_object(value, path,
              {{"model",
                [&](const json& v, const std::string& p) {
                  o.optimizer = vocab::optimizer_models()[read_choice(v, p, models)].model;
                }},
               {"bucket_elements",
                [&](const json& v, const std::string& p) {
                  o.bucket_elements =
                      read_integer(v, p, 0, std::numeric_limits<std::int64_t>::max());
                }},
               {"layer_wise_param_layout",
                [&](const json& v, const std::string& p) { o.layer_wise_param_layout = read_bool(v, p); }}},
              "the optimizer");
}

// {"param": NAME, "gradient": G} or {"class": CLASS, "gradient": G} (model_json.h reads G).
vocab::StatedFor read_stated_for(const json& value, const std::string& path) {
  vocab::StatedFor s;
  read_object(value, path,
              {{"param",
                [&](const json& v, const std::string& p) { s.param = read_string(v, p, topologies::kMaxNameLength); }},
               {"class",
                [&](const json& v, const std::string& p) {
                  s.param_class = topologies::kAllParamClasses[static_cast<std::size_t>(read_choice(
                      v, p, names_of(topologies::kAllParamClasses, topologies::class_name)))];
                }},
               {"gradient",
                [&](const json& v, const std::string& p) {
                  s.gradient = stated_gradient_from_json(v, p);
                }}},
              "a stated gradient", {"gradient"});
  if (s.param.empty() == !s.param_class.has_value())
    fail(path, std::string("name either \"param\" (a logical param) or \"class\", not ") +
                   (s.param.empty() ? "neither" : "both"));
  return s;
}

}  // namespace

bool read_before_reduction(const json& value, const std::string& path) {
  return read_choice(value, path, {"after_reduction", kBeforeReduction}) == 1;
}

namespace {

void read_gradients(const json& value, const std::string& path, vocab::GradientSpec& g) {
  read_object(
      value, path,
      {{"mode",
        [&](const json& v, const std::string& p) {
          g.generator.mode = kernels::kAllGradientModes[read_choice(
              v, p, names_of(kernels::kAllGradientModes, kernels::mode_name))];
        }},
       {"dtype",
        [&](const json& v, const std::string& p) {
          g.generator.dtype = kernels::kAllDtypes[read_choice(
              v, p, names_of(kernels::kAllDtypes, kernels::dtype_name))];
        }},
       {"seed", [&](const json& v, const std::string& p) { g.generator.seed = read_uint64(v, p); }},
       {"enter",
        [&](const json& v, const std::string& p) {
          g.before_reduction = read_before_reduction(v, p);
        }},
       {"classes",
        [&](const json& v, const std::string& p) {
          g.class_mask = 0;
          read_string_list(v, p, topologies::kParamClassCount, 64,
                           [&](const std::string& name, const std::string& at) {
                             const std::optional<topologies::ParamClass> c =
                                 topologies::class_from_name(name);
                             if (!c) {
                               std::string list;
                               for (topologies::ParamClass known : topologies::kAllParamClasses)
                                 list += (list.empty() ? "" : ", ") +
                                         std::string(topologies::class_name(known));
                               fail(at, "expected a param class (" + list + "), got " + message_quote(name));
                             }
                             g.class_mask |= vocab::class_bit(*c);
                           });
        }},
       {"stated",
        [&](const json& v, const std::string& p) {
          const json& list = read_array(v, p, std::size_t{1} << 16);
          for (std::size_t i = 0; i < list.size(); ++i) g.stated.push_back(read_stated_for(list[i], p + "[" + std::to_string(i) + "]"));
        }}},
      "the gradients");
}

void read_statistics(const json& value, const std::string& path, vocab::PathOptions& o) {
  read_object(value, path,
              {{"accumulation",
                [&](const json& v, const std::string& p) {
                  o.accumulation = read_choice(v, p, {"fp32", "fp64"}) == 0
                                       ? kernels::Accumulation::fp32
                                       : kernels::Accumulation::fp64;
                }},
               {"p_norms",
                [&](const json& v, const std::string& p) {
                  read_array(v, p, kMaxPNorms);
                  o.p_values.clear();
                  for (std::size_t i = 0; i < v.size(); ++i) {
                    const double value_p = read_number(v[i], index_path(p, i));
                    if (!(value_p > 0.0))
                      fail(index_path(p, i), "expected a number > 0, got " + shown(v[i]));
                    o.p_values.push_back(value_p);
                  }
                }},
               {"max_norm",
                [&](const json& v, const std::string& p) {
                  o.max_norm = read_number(v, p);
                  if (o.max_norm < 0.0)
                    fail(p, "expected a number >= 0 (0: no clipping), got " + shown(v));
                }}},
              "the statistics");
}

vocab::FaultSet read_faults(const json& value, const std::string& path) {
  vocab::FaultSet faults;
  read_string_list(value, path, vocab::kFaultCount, 64,
                   [&](const std::string& name, const std::string& at) {
                     const std::optional<vocab::Fault> fault = vocab::fault_from_name(name);
                     if (!fault)
                       fail(at, message_quote(name) + " is not a fault of the catalog (tally run --list-faults)");
                     faults = faults.with(*fault);
                   });
  return faults;
}

// The statistic names a verdict can fail on (run::failed_statistics), besides "p<value>".
bool known_statistic(std::string_view name) {
  // l2-ledger and zeros-ledger: a rank's value against its own ledger, which a run with
  // statistics of every piece has (a real target's manifests).
  for (std::string_view known : {"l2", "l2-ledger", "inf", "zeros", "zeros-ledger", "mtp-l2", "clip", "ledger",
                                 "agreement", "clipped", "held-gradients"})
    if (name == known) return true;
  return name.size() > 1 && name[0] == 'p';  // checked against the case's p-norms later
}

Expectation read_expect(const json& value, const std::string& path) {
  Expectation e;
  read_object(
      value, path,
      {{"outcome",
        [&](const json& v, const std::string& p) {
          e.outcome = static_cast<Expectation::Outcome>(read_choice(v, p, {"pass", "fail", "infra-error"}));
        }},
       {"statistics",
        [&](const json& v, const std::string& p) {
          e.statistics = read_string_list(
              v, p, kMaxExpectStatistics, 32, [](const std::string& name, const std::string& at) {
                if (!known_statistic(name))
                  fail(at, "expected a statistic (l2, l2-ledger, inf, zeros, zeros-ledger, mtp-l2, p<p>, "
                           "clip, ledger, agreement, clipped), got " + message_quote(name));
              });
        }},
       {"miscounted",
        [&](const json& v, const std::string& p) {
          e.miscounted = read_string_list(v, p, static_cast<std::size_t>(topologies::kMaxParams),
                                          topologies::kMaxNameLength,
                                          [](const std::string&, const std::string&) {});
        }}},
      "the expectation", {"outcome"});
  if (e.outcome != Expectation::Outcome::fail && (!e.statistics.empty() || !e.miscounted.empty()))
    fail(path, "statistics and miscounted are only for \"outcome\": \"fail\"");
  return e;
}

RealTarget read_target(const json& value, const std::string& path, FrameworkSchemas frameworks) {
  RealTarget t;
  read_object(
      value, path,
      {{"framework",
        [&](const json& v, const std::string& p) {
          t.framework = read_string(v, p, 64);
          if (std::none_of(frameworks.begin(), frameworks.end(),
                           [&](const FrameworkSchema& f) { return f.name == t.framework; })) {
            std::string known;
            for (const FrameworkSchema& f : frameworks) known += (known.empty() ? "" : ", ") + std::string(f.name);
            fail(p, "expected a framework tally has a worker for (" + known + "), got " + message_quote(t.framework));
          }
        }},
       {"version",
        [&](const json& v, const std::string& p) {
          t.version = read_string(v, p, 64);
          if (t.version.empty()) fail(p, "expected the framework's version, got an empty string");
        }},
       {"manifests", [&](const json& v, const std::string& p) { t.manifests = read_string(v, p, 4096); }}},
      "the target", {"framework", "version"});
  return t;
}

void read_tool(const json& value, const std::string& path) {
  // Written for the record; read only as far as its types go.
  if (!value.is_object()) fail(path, std::string("expected an object, got ") + type_word(value));
  if (value.size() > 16) fail(path, "has " + std::to_string(value.size()) + " keys; at most 16");
  for (const auto& [key, item] : value.items()) read_string(item, path + "." + key, kMaxToolFieldBytes);
}

// The `p<value>` name the verdict gives p-norm p ("p3", "p0.5").
std::string p_statistic_name(double p) {
  char name[32];
  std::snprintf(name, sizeof name, "p%g", p);
  return name;
}

// Rules between fields, checked once the case as a whole is valid.
void check_expect_names(const Case& c, const std::string& path) {
  const Expectation& e = *c.expect;
  for (std::size_t i = 0; i < e.statistics.size(); ++i) {
    const std::string& name = e.statistics[i];
    if (name[0] != 'p') continue;
    const bool known = std::any_of(c.path.p_values.begin(), c.path.p_values.end(),
                                   [&](double p) { return p_statistic_name(p) == name; });
    if (!known)
      fail(index_path(path + ".statistics", i),
           message_quote(name) + " is not a p-norm of this case (statistics.p_norms)");
  }
  if (e.miscounted.empty()) return;
  const topologies::LogicalModel model(c.model, c.topology);
  std::set<std::string_view> names;
  for (const topologies::LogicalParam& p : model.params()) names.insert(p.name);
  for (std::size_t i = 0; i < e.miscounted.size(); ++i)
    if (!names.contains(e.miscounted[i]))
      fail(index_path(path + ".miscounted", i),
           message_quote(e.miscounted[i]) + " is not a param of the model (tally layout lists them)");
}

Case read_case(const json& value, const std::string& path, FrameworkSchemas frameworks) {
  if (!value.is_object())
    fail(path, std::string("expected an object (a tally case), got ") + type_word(value));
  // The version first: a newer file may hold keys this version does not know.
  if (!value.contains("tally_case"))
    fail(path, "missing key 'tally_case' (the case file format version; this tally reads version " +
                   std::to_string(kCaseFileVersion) + ")");
  const std::string version_path = path + ".tally_case";
  const std::int64_t version = read_integer(value.at("tally_case"), version_path, 1,
                                            std::numeric_limits<std::int64_t>::max());
  if (version != kCaseFileVersion)
    fail(version_path, "version " + std::to_string(version) + " is not supported: tally " +
                           TALLY_VERSION + " reads version " + std::to_string(kCaseFileVersion));

  Case c;
  vocab::PathOptions& o = c.path;
  // Defaults: tally run's flag defaults (docs/case-files.md).
  o.gradients.generator.mode = kernels::GradientMode::dyadic;
  o.gradients.generator.dtype = kernels::Dtype::fp32;
  o.gradients.generator.seed = 1;
  o.accumulation = kernels::Accumulation::fp64;
  o.max_norm = 1.0;
  std::vector<io::Field> fields{
      {"tally_case", [](const json&, const std::string&) {}},
       {"description",
        [&](const json& v, const std::string& p) {
          c.description = read_string(v, p, kMaxDescriptionBytes);
          if (std::optional<std::string> error = description_error(c.description)) fail(p, *error);
        }},
       {"topology", [&](const json& v, const std::string& p) { c.topology = read_topology(v, p); }},
       {"model",
        [&](const json& v, const std::string& p) {
          try {
            c.model = model_spec_from_json(v, p);
          } catch (const ModelJsonError& error) {
            throw JsonReadError(error.what());
          }
        }},
       {"optimizer", [&](const json& v, const std::string& p) { read_optimizer(v, p, o); }},
       {"gradients", [&](const json& v, const std::string& p) { read_gradients(v, p, o.gradients); }},
       {"statistics", [&](const json& v, const std::string& p) { read_statistics(v, p, o); }},
       {"faults", [&](const json& v, const std::string& p) { o.faults = read_faults(v, p); }},
       {"target", [&](const json& v, const std::string& p) { c.target = read_target(v, p, frameworks); }},
       {"expect", [&](const json& v, const std::string& p) { c.expect = read_expect(v, p); }},
       {"tool", [&](const json& v, const std::string& p) { read_tool(v, p); }}};
  // Each framework's section, read by the framework's own reader.
  for (const FrameworkSchema& f : frameworks) {
    if (f.section.empty()) continue;
    fields.push_back({f.section, [&c, &f](const json& v, const std::string& p) {
                        c.sections[std::string(f.section)] = FrameworkSection{f.read_section(v, p), f.own_models};
                      }});
  }
  read_object(value, path, fields, "a case", {"tally_case", "topology", "model"});
  if (std::optional<std::string> error = check_case(c)) throw SemanticError{*error};
  if (c.expect) check_expect_names(c, path + ".expect");
  return c;
}

ordered_json string_array(const std::vector<std::string>& items) {
  ordered_json array = ordered_json::array();
  for (const std::string& item : items) array.push_back(item);
  return array;
}

}  // namespace

ordered_json case_to_json(const Case& c) {
  const vocab::PathOptions& o = c.path;
  ordered_json j;
  j["tally_case"] = kCaseFileVersion;
  j["description"] = c.description;
  const topologies::ParallelConfig& t = c.topology;
  j["topology"] = {{"world", t.world}, {"tp", t.tp},   {"cp", t.cp},
                   {"pp", t.pp},       {"ep", t.ep},   {"etp", t.etp},
                   {"vpp", t.vpp},     {"order", t.order}, {"dist_opt_instances", t.dist_opt_instances}};
  if (topologies::uses_gtp(t)) {  // megatron-core 0.19's axes: written only where they are used
    j["topology"]["gtp"] = t.gtp;
    j["topology"]["egtp"] = t.egtp;
  }
  j["model"] = model_spec_to_json(c.model);
  j["optimizer"] = {{"model", vocab::optimizer_model_name(o.optimizer)},
                    {"bucket_elements", o.bucket_elements}};
  if (o.layer_wise_param_layout) j["optimizer"]["layer_wise_param_layout"] = true;  // megatron-core 0.19's
  ordered_json gradients = {{"mode", kernels::mode_name(o.gradients.generator.mode)},
                            {"dtype", kernels::dtype_name(o.gradients.generator.dtype)},
                            {"seed", o.gradients.generator.seed}};
  // Written only when before, so every earlier case keeps its digest and its saved runs.
  if (o.gradients.before_reduction) gradients["enter"] = kBeforeReduction;
  if (o.gradients.class_mask != ~std::uint32_t{0}) {
    if (o.gradients.class_mask & ~kAllClassBits)
      throw std::invalid_argument("case_to_json: class_mask " +
                                  std::to_string(o.gradients.class_mask) +
                                  " has bits beyond the param classes (use ~0 for all)");
    ordered_json classes = ordered_json::array();
    for (topologies::ParamClass pc : topologies::kAllParamClasses)
      if (o.gradients.class_mask & vocab::class_bit(pc)) classes.push_back(topologies::class_name(pc));
    gradients["classes"] = std::move(classes);
  }
  if (!o.gradients.stated.empty()) {
    ordered_json stated = ordered_json::array();
    for (const vocab::StatedFor& s : o.gradients.stated) {
      ordered_json entry;
      if (s.param_class) entry["class"] = topologies::class_name(*s.param_class);
      else entry["param"] = s.param;
      entry["gradient"] = stated_gradient_to_json(s.gradient);
      stated.push_back(std::move(entry));
    }
    gradients["stated"] = std::move(stated);
  }
  j["gradients"] = std::move(gradients);
  j["statistics"] = {{"accumulation", kernels::accumulation_name(o.accumulation)},
                     {"p_norms", o.p_values},
                     {"max_norm", o.max_norm}};
  ordered_json faults = ordered_json::array();
  for (const vocab::FaultInfo& info : vocab::fault_catalog())
    if (o.faults.has(info.fault)) faults.push_back(info.name);
  j["faults"] = std::move(faults);
  for (const auto& [key, section] : c.sections) j[key] = section.settings;
  if (c.target) {
    j["target"] = {{"framework", c.target->framework}, {"version", c.target->version}};
    if (!c.target->manifests.empty()) j["target"]["manifests"] = c.target->manifests;
  }
  if (c.expect) {
    ordered_json expect = {{"outcome", outcome_name(c.expect->outcome)}};
    if (c.expect->outcome == Expectation::Outcome::fail) {
      expect["statistics"] = string_array(c.expect->statistics);
      expect["miscounted"] = string_array(c.expect->miscounted);
    }
    j["expect"] = std::move(expect);
  }
  j["tool"] = {{"name", "tally"}, {"version", TALLY_VERSION}};
  return j;
}

// Messages quote user input (names, orders): control characters are escaped so that every
// message is one line, whichever rule produced it.
Case case_from_json(const json& value, FrameworkSchemas frameworks, std::string_view path) {
  try {
    return read_case(value, std::string(path), frameworks);
  } catch (const JsonReadError& error) {
    throw CaseFileError(escape_controls(error.what()));
  } catch (const SemanticError& error) {
    throw CaseFileError(escape_controls(error.message));
  }
}

std::string case_to_text(const Case& c) {
  // Strings read from JSON are valid UTF-8; others (a description built in code) have invalid
  // bytes replaced rather than failing the write.
  return case_to_json(c).dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

Case case_from_text(std::string_view text, std::string_view source, FrameworkSchemas frameworks) {
  const std::string prefix = std::string(source) + ": ";
  json parsed;
  try {
    parsed = parse_json(text, source);
  } catch (const JsonReadError& error) {
    throw CaseFileError(escape_controls(error.what()));
  }
  try {
    return read_case(parsed, "case", frameworks);
  } catch (const JsonReadError& error) {
    throw CaseFileError(escape_controls(prefix + error.what()));
  } catch (const SemanticError& error) {
    throw CaseFileError(escape_controls(prefix + error.message));
  }
}

Case load_case_file(const std::string& file, FrameworkSchemas frameworks) {
  std::string text;
  try {
    text = read_bounded_file(file, kMaxCaseFileBytes, "case file");
  } catch (const JsonReadError& error) {
    throw CaseFileError(error.what());
  }
  return case_from_text(text, file, frameworks);
}

std::optional<std::string> description_error(std::string_view description) {
  if (description.size() > kMaxDescriptionBytes)
    return "a description is at most " + std::to_string(kMaxDescriptionBytes) + " bytes, got " +
           std::to_string(description.size());
  for (char ch : description)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
      return "expected one line of text without control characters";
  return std::nullopt;
}

std::string fit_description(std::string_view text) {
  std::string out;
  for (char ch : text) out += static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f ? '?' : ch;
  if (out.size() <= kMaxDescriptionBytes) return out;
  constexpr std::string_view kCut = "...";
  std::size_t keep = kMaxDescriptionBytes - kCut.size();
  // Cut between UTF-8 characters: a continuation byte is 10xxxxxx.
  while (keep > 0 && (static_cast<unsigned char>(out[keep]) & 0xC0) == 0x80) --keep;
  return out.substr(0, keep) + std::string(kCut);
}

void write_case_file(const std::string& file, const Case& c, FrameworkSchemas frameworks) {
  const std::string text = case_to_text(c);
  // Whatever tally writes it must read back: a case the reader rejects is a lost finding.
  try {
    case_from_text(text, file, frameworks);
  } catch (const CaseFileError& error) {
    throw std::invalid_argument("refusing to write a case file the reader would reject: " +
                                std::string(error.what()));
  }
  write_file_atomically(file, text, "case file");
}

}  // namespace tally::casefile
