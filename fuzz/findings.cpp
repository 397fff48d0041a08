#include "fuzz/findings.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "fuzz/known.h"
#include "io/json_read.h"
#include "topologies/logical_model.h"

namespace tally::fuzz {

namespace {

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool is_size_name(std::string_view w) {
  return std::find(std::begin(kSizeNames), std::end(kSizeNames), w) != std::end(kSizeNames);
}

bool is_number(std::string_view w) {
  int value = 0;
  const auto [end, error] = std::from_chars(w.data(), w.data() + w.size(), value);
  return error == std::errc() && end == w.data() + w.size() && value >= 0;
}

// "ep * etp" -> {"ep", "etp"}; throws naming the term that is neither a size nor a whole number.
std::vector<std::string> product(const std::vector<std::string>& ws, std::size_t from, std::size_t to,
                                 const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t i = from; i < to; ++i) {
    if ((i - from) % 2 == 1) {
      if (ws[i] != "*") throw std::invalid_argument("'" + text + "': sizes are multiplied with *, not '" + ws[i] + "'");
      continue;
    }
    if (!is_size_name(ws[i]) && !is_number(ws[i]))
      throw std::invalid_argument("'" + text + "': '" + ws[i] +
                                  "' is neither a whole number nor a size (world, tp, cp, pp, ep, etp, gtp, egtp, "
                                  "vpp, dp, dp_cp, edp, instances)");
    out.push_back(ws[i]);
  }
  if (out.empty() || (to - from) % 2 == 0) throw std::invalid_argument("'" + text + "': a side of the comparison is empty or ends in *");
  return out;
}

std::int64_t size_of(const std::string& name, const topologies::ParallelConfig& t) {
  if (is_number(name)) return std::stoi(name);
  if (name == "world") return t.world;
  if (name == "tp") return t.tp;
  if (name == "cp") return t.cp;
  if (name == "pp") return t.pp;
  if (name == "ep") return t.ep;
  if (name == "etp") return t.etp;
  if (name == "gtp") return t.gtp;
  if (name == "egtp") return t.egtp;
  if (name == "vpp") return t.vpp;
  if (name == "dp") return topologies::dp(t);
  if (name == "dp_cp") return static_cast<std::int64_t>(topologies::dp(t)) * t.cp;
  if (name == "edp") return topologies::edp(t);
  return t.dist_opt_instances;  // "instances"
}

std::int64_t product_of(const std::vector<std::string>& names, const topologies::ParallelConfig& t) {
  std::int64_t out = 1;
  for (const std::string& n : names) out *= size_of(n, t);
  return out;
}

bool feature_holds(const std::string& feature, const casefile::Case& c) {
  const kernels::Dtype dtype = c.path.gradients.generator.dtype;
  if (feature == "fp32") return dtype == kernels::Dtype::fp32;
  if (feature == "bf16") return dtype == kernels::Dtype::bf16;
  if (feature == "fp16") return dtype == kernels::Dtype::fp16;
  if (feature == "clipping") return c.path.max_norm > 0.0;
  if (feature == "default order") return topologies::has_default_order(c.topology);
  if (feature == "shared expert") return c.model.kind == topologies::ModelKind::gpt && c.model.num_experts > 0 &&
                                          c.model.moe_shared_expert_intermediate_size > 0;
  std::optional<topologies::LogicalModel> model;
  try {
    model.emplace(c.model, c.topology);
  } catch (const std::exception&) {
    return false;  // a model that does not build on its configuration has no features
  }
  const auto any = [&](auto&& pred) { return std::any_of(model->params().begin(), model->params().end(), pred); };
  using topologies::ParamClass;
  if (feature == "experts") return any([](const auto& p) { return topologies::is_expert_class(p.param_class); });
  if (feature == "expert biases")
    return any([](const auto& p) {
      return p.param_class == ParamClass::expert_row_bias || p.param_class == ParamClass::expert_column_bias;
    });
  if (feature == "tied output") return model->tied_embedding() >= 0;
  if (feature == "mtp") return any([](const auto& p) { return p.grad_norm_group == topologies::GradNormGroup::mtp; }) ||
                               (c.model.kind == topologies::ModelKind::gpt && c.model.mtp_num_layers > 0);
  return any([](const auto& p) { return p.param_class == ParamClass::head_sharded; });  // "attention sinks"
}

template <typename T, std::size_t N>
int choice(const nlohmann::json& value, const std::string& path, const T (&names)[N]) {
  std::vector<std::string_view> list(std::begin(names), std::end(names));
  return io::read_choice(value, path, list);
}

}  // namespace

std::string_view counted_name(Counted counted) { return counted == Counted::fewer ? "fewer" : "more"; }

std::string_view ledger_family_name(LedgerFamily family) {
  switch (family) {
    case LedgerFamily::norm: return "norm";
    case LedgerFamily::zero_count: return "zero count";
    case LedgerFamily::any: break;
  }
  return "any";
}

std::string shape_json(const MiscountShape& shape) {
  return nlohmann::json{{"kind", shape.kind}, {"counted", counted_name(shape.counted)}, {"in", ledger_family_name(shape.in)}}
      .dump();
}

Condition parse_condition(const std::string& text) {
  Condition out;
  out.text = text;
  std::vector<std::string> ws = words(text);
  static constexpr std::string_view kOps[] = {"<", "<=", "==", "!=", ">=", ">"};
  const auto op = std::find_if(ws.begin(), ws.end(), [](const std::string& w) {
    return std::find(std::begin(kOps), std::end(kOps), w) != std::end(kOps);
  });
  if (op != ws.end()) {
    const auto at = static_cast<std::size_t>(op - ws.begin());
    out.op = *op;
    out.left = product(ws, 0, at, text);
    out.right = product(ws, at + 1, ws.size(), text);
    return out;
  }
  if (!ws.empty() && ws.front() == "not") {
    out.negated = true;
    ws.erase(ws.begin());
  }
  std::string feature;
  for (const std::string& w : ws) feature += (feature.empty() ? "" : " ") + w;
  if (std::find(std::begin(kFeatureNames), std::end(kFeatureNames), feature) == std::end(kFeatureNames)) {
    std::string names;
    for (std::string_view n : kFeatureNames) names += (names.empty() ? "" : ", ") + std::string(n);
    throw std::invalid_argument("'" + text + "' is neither a comparison of sizes (\"tp > 1\", \"ep * etp < tp\") nor a "
                                "feature, optionally after not: " + names);
  }
  out.feature = feature;
  return out;
}

bool holds(const Condition& condition, const casefile::Case& c) {
  if (condition.op.empty()) return feature_holds(condition.feature, c) != condition.negated;
  const std::int64_t a = product_of(condition.left, c.topology), b = product_of(condition.right, c.topology);
  if (condition.op == "<") return a < b;
  if (condition.op == "<=") return a <= b;
  if (condition.op == "==") return a == b;
  if (condition.op == "!=") return a != b;
  if (condition.op == ">=") return a >= b;
  return a > b;
}

std::string_view layout_corner_id(LayoutCorner corner) {
  switch (corner) {
    case LayoutCorner::experts_as_dense: return "experts-as-dense";
    case LayoutCorner::instances_split_their_shards: return "instances-split-their-shards";
    case LayoutCorner::none: break;
  }
  return "none";
}

bool norm_code_in(const std::string& code, const std::vector<std::string>& codes) {
  return std::any_of(codes.begin(), codes.end(),
                     [&](const std::string& k) { return code == k || code.starts_with(k + " "); });
}

bool in_stated_corner(const FindingFile& f, const casefile::Case& c) {
  if (!norm_code_in(known_path(c), f.norm_codes)) return false;
  if (f.layout_corner != LayoutCorner::none && megatron_layout_corner(c.topology) != f.layout_corner) return false;
  return std::all_of(f.needs.begin(), f.needs.end(), [&](const Condition& n) { return holds(n, c); });
}

FindingFile read_finding_file(const std::string& file) {
  constexpr std::size_t kMaxFindingBytes = 1 << 20;
  FindingFile f;
  f.file = file;
  f.name = std::filesystem::path(file).filename().string();
  if (f.name.ends_with(".finding.json")) f.name.resize(f.name.size() - std::string_view(".finding.json").size());
  try {
    const nlohmann::json doc = io::parse_json(io::read_bounded_file(file, kMaxFindingBytes, "finding file"), file);
    const auto strings = [](const nlohmann::json& v, const std::string& p, std::vector<std::string>& out) {
      for (std::size_t i = 0; const nlohmann::json& s : io::read_array(v, p, 256))
        out.push_back(io::read_string(s, p + "[" + std::to_string(i++) + "]", 4096));
    };
    io::read_object(
        doc, "finding",
        {{"tally_finding", [](const nlohmann::json& v, const std::string& p) { io::read_integer(v, p, 1, 1); }},
         {"framework", [&](const nlohmann::json& v, const std::string& p) { f.framework = io::read_string(v, p, 64); }},
         {"version", [&](const nlohmann::json& v, const std::string& p) { f.version = io::read_string(v, p, 64); }},
         {"source", [&](const nlohmann::json& v, const std::string& p) { f.source = io::read_string(v, p, 4096); }},
         {"cause",
          [&](const nlohmann::json& v, const std::string& p) {
            const std::string cause = io::read_string(v, p, 256);
            if (cause.starts_with("fault ")) {
              f.fault = vocab::fault_from_name(cause.substr(6));
              if (!f.fault) io::fail(p, "'" + cause.substr(6) + "' is no fault of the catalog (tally run --list-faults)");
            } else if (cause == "layout corner experts-as-dense") {
              f.layout_corner = LayoutCorner::experts_as_dense;
            } else if (cause == "layout corner instances-split-their-shards") {
              f.layout_corner = LayoutCorner::instances_split_their_shards;
            } else {
              io::fail(p, "'" + cause + "' is neither \"fault <name>\" nor \"layout corner experts-as-dense\" or "
                          "\"layout corner instances-split-their-shards\"");
            }
          }},
         {"corner",
          [&](const nlohmann::json& v, const std::string& p) {
            io::read_object(
                v, p,
                {{"norm_codes", [&](const nlohmann::json& x, const std::string& q) { strings(x, q, f.norm_codes); }},
                 {"needs",
                  [&](const nlohmann::json& x, const std::string& q) {
                    std::vector<std::string> texts;
                    strings(x, q, texts);
                    for (std::size_t i = 0; i < texts.size(); ++i) {
                      try {
                        f.needs.push_back(parse_condition(texts[i]));
                      } catch (const std::invalid_argument& e) {
                        io::fail(q + "[" + std::to_string(i) + "]", e.what());
                      }
                    }
                  }}},
                "corner", {"norm_codes"});
            if (f.norm_codes.empty()) io::fail(p + ".norm_codes", "names no norm code: a finding lies in one at least");
          }},
         {"miscounts",
          [&](const nlohmann::json& v, const std::string& p) {
            for (std::size_t i = 0; const nlohmann::json& m : io::read_array(v, p, 256)) {
              const std::string q = p + "[" + std::to_string(i++) + "]";
              MiscountShape shape;
              static constexpr std::string_view kCounted[] = {"fewer", "more"};
              static constexpr std::string_view kIn[] = {"norm", "zero count", "any"};
              io::read_object(
                  m, q,
                  {{"kind", [&](const nlohmann::json& x, const std::string& r) { shape.kind = io::read_string(x, r, 256); }},
                   {"counted", [&](const nlohmann::json& x, const std::string& r) {
                      shape.counted = static_cast<Counted>(choice(x, r, kCounted)); }},
                   {"in", [&](const nlohmann::json& x, const std::string& r) {
                      shape.in = static_cast<LedgerFamily>(choice(x, r, kIn)); }}},
                  "miscount", {"kind", "counted", "in"});
              f.miscounts.push_back(std::move(shape));
            }
          }},
         {"saved_runs", [&](const nlohmann::json& v, const std::string& p) { strings(v, p, f.saved_runs); }}},
        "finding", {"tally_finding", "framework", "version", "source", "corner", "miscounts", "saved_runs"});
  } catch (const io::JsonReadError& e) {
    throw std::runtime_error(file + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());  // parse_json and read_bounded_file name the file
  }
  return f;
}

}  // namespace tally::fuzz
