#include "manifest/manifest_json.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <system_error>

#include "casefile/atomic_file.h"
#include "casefile/json_read.h"
#include "topologies/parallel_config.h"

namespace tally::manifest {

namespace {

using casefile::Field;
using casefile::fail;
using casefile::read_array;
using casefile::read_bool;
using casefile::read_integer;
using casefile::read_number;
using casefile::read_object;
using casefile::read_string;
using casefile::shown;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr std::size_t kMaxDims = record::kMaxDims;
constexpr std::size_t kMaxParams = 1'000'000;
constexpr std::size_t kMaxOptimizers = 1024;
constexpr std::size_t kMaxGroups = 256;
constexpr std::size_t kMaxNameLength = 4096;
constexpr std::int64_t kMaxExtent = std::int64_t{1} << 40;
constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();

std::string index_path(const std::string& path, std::size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

std::int64_t element_count(const std::vector<std::int64_t>& extents) {
  std::int64_t n = 1;
  for (std::int64_t e : extents) n *= e;  // each <= 2^40 and the product is checked below
  return n;
}

// A name printed in reports: no control characters, so every report line stays one line.
std::string read_name(const json& value, const std::string& path) {
  std::string name = read_string(value, path, kMaxNameLength);
  for (unsigned char c : name)
    if (c < 0x20 || c == 0x7f)
      fail(path, "a name may not hold control characters (newlines, tabs, ...)");
  return name;
}

// A non-negative finite number.
double read_magnitude(const json& value, const std::string& path) {
  const double x = read_number(value, path);
  if (x < 0.0) fail(path, "expected a number >= 0, got " + shown(value));
  return x;
}

// A rank list: sorted, no repeats, every rank in [0, world), holding `rank`.
std::vector<int> read_rank_list(const json& value, const std::string& path, int world, int rank) {
  read_array(value, path, static_cast<std::size_t>(world));
  std::vector<int> ranks;
  ranks.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    const int r = static_cast<int>(read_integer(value[i], index_path(path, i), 0, world - 1));
    if (!ranks.empty() && r <= ranks.back())
      fail(index_path(path, i), "expected ranks in increasing order without repeats, got " +
                                    std::to_string(r) + " after " + std::to_string(ranks.back()));
    ranks.push_back(r);
  }
  if (!std::binary_search(ranks.begin(), ranks.end(), rank))
    fail(path, "the group does not hold this manifest's own rank " + std::to_string(rank));
  return ranks;
}

std::optional<std::vector<int>> read_optional_rank_list(const json& value, const std::string& path,
                                                        int world, int rank) {
  if (value.is_null()) return std::nullopt;
  return read_rank_list(value, path, world, rank);
}

std::vector<std::int64_t> read_sizes(const json& value, const std::string& path,
                                     std::int64_t min) {
  read_array(value, path, kMaxDims);
  std::vector<std::int64_t> sizes;
  for (std::size_t i = 0; i < value.size(); ++i)
    sizes.push_back(read_integer(value[i], index_path(path, i), min, kMaxExtent));
  return sizes;
}

Attributes read_attributes(const json& value, const std::string& path) {
  Attributes a;
  read_object(value, path,
              {{"tensor_model_parallel",
                [&](const json& v, const std::string& p) { a.tensor_model_parallel = read_bool(v, p); }},
               {"partition_dim",
                [&](const json& v, const std::string& p) {
                  a.partition_dim = static_cast<int>(read_integer(v, p, -1, kMaxDims - 1));
                }},
               {"allreduce", [&](const json& v, const std::string& p) { a.allreduce = read_bool(v, p); }},
               {"shared", [&](const json& v, const std::string& p) { a.shared = read_bool(v, p); }},
               {"grad_norm_group",
                [&](const json& v, const std::string& p) {
                  if (!v.is_null()) a.grad_norm_group = read_string(v, p, kMaxNameLength);
                }}},
              "the attributes",
              {"tensor_model_parallel", "partition_dim", "allreduce", "shared", "grad_norm_group"});
  return a;
}

GradStats read_stats(const json& value, const std::string& path, std::int64_t elements) {
  GradStats s;
  read_object(value, path,
              {{"sum_squares",
                [&](const json& v, const std::string& p) { s.sum_squares = read_magnitude(v, p); }},
               {"abs_max", [&](const json& v, const std::string& p) { s.abs_max = read_magnitude(v, p); }},
               {"zeros",
                [&](const json& v, const std::string& p) {
                  s.zeros = read_integer(v, p, 0, kMaxInt);
                  if (s.zeros > elements)
                    fail(p, "counts " + std::to_string(s.zeros) + " zeros in " +
                                std::to_string(elements) + " elements");
                }}},
              "the gradient statistics", {"sum_squares", "abs_max", "zeros"});
  return s;
}

ModelParam read_param(const json& value, const std::string& path) {
  ModelParam m;
  json stats;
  read_object(
      value, path,
      {{"name", [&](const json& v, const std::string& p) { m.name = read_name(v, p); }},
       {"logical_name",
        [&](const json& v, const std::string& p) {
          m.logical_name = read_name(v, p);
          if (m.logical_name.empty()) fail(p, "expected a non-empty name");
        }},
       {"logical_shape",
        [&](const json& v, const std::string& p) { m.logical_shape = read_sizes(v, p, 1); }},
       {"offsets", [&](const json& v, const std::string& p) { m.offsets = read_sizes(v, p, 0); }},
       {"extents", [&](const json& v, const std::string& p) { m.extents = read_sizes(v, p, 1); }},
       {"attributes",
        [&](const json& v, const std::string& p) { m.attributes = read_attributes(v, p); }},
       {"stats", [&](const json& v, const std::string&) { stats = v; }}},
      "a model param",
      {"name", "logical_name", "logical_shape", "offsets", "extents", "attributes", "stats"});
  if (m.offsets.size() != m.logical_shape.size() || m.extents.size() != m.logical_shape.size())
    fail(path, "offsets and extents need one entry per dim of logical_shape (" +
                   std::to_string(m.logical_shape.size()) + "), got " +
                   std::to_string(m.offsets.size()) + " and " + std::to_string(m.extents.size()));
  double logical_elements = 1.0;
  for (std::size_t d = 0; d < m.logical_shape.size(); ++d) {
    logical_elements *= static_cast<double>(m.logical_shape[d]);
    if (m.offsets[d] + m.extents[d] > m.logical_shape[d])
      fail(index_path(path + ".extents", d),
           "the box overflows the logical shape: offset " + std::to_string(m.offsets[d]) +
               " + extent " + std::to_string(m.extents[d]) + " > " +
               std::to_string(m.logical_shape[d]));
  }
  if (logical_elements > 9.0e15)
    fail(path + ".logical_shape", "more than 2^53 elements");
  m.stats = read_stats(stats, path + ".stats", element_count(m.extents));
  return m;
}

MainParam read_main_param(const json& value, const std::string& path,
                          const std::vector<ModelParam>& params) {
  MainParam m;
  json stats;
  read_object(
      value, path,
      {{"param",
        [&](const json& v, const std::string& p) {
          if (params.empty()) fail(p, "no model param to refer to: params is empty");
          m.param = static_cast<int>(read_integer(v, p, 0, static_cast<std::int64_t>(params.size()) - 1));
        }},
       {"begin", [&](const json& v, const std::string& p) { m.begin = read_integer(v, p, 0, kMaxInt); }},
       {"end", [&](const json& v, const std::string& p) { m.end = read_integer(v, p, 0, kMaxInt); }},
       {"attributes",
        [&](const json& v, const std::string& p) { m.attributes = read_attributes(v, p); }},
       {"kept", [&](const json& v, const std::string& p) { m.kept = read_bool(v, p); }},
       {"kept_zeros", [&](const json& v, const std::string& p) { m.kept_zeros = read_bool(v, p); }},
       {"stats", [&](const json& v, const std::string&) { stats = v; }}},
      "a main param", {"param", "begin", "end", "attributes", "kept", "kept_zeros", "stats"});
  const std::int64_t box = element_count(params[static_cast<std::size_t>(m.param)].extents);
  if (!(m.begin < m.end) || m.end > box)
    fail(path, "expected 0 <= begin < end <= " + std::to_string(box) +
                   " (the elements of param " + std::to_string(m.param) + "'s box), got begin " +
                   std::to_string(m.begin) + ", end " + std::to_string(m.end));
  m.stats = read_stats(stats, path + ".stats", m.end - m.begin);
  return m;
}

OptimizerRecord read_optimizer(const json& value, const std::string& path, int world, int rank,
                               const std::vector<ModelParam>& params) {
  OptimizerRecord o;
  read_object(
      value, path,
      {{"name", [&](const json& v, const std::string& p) { o.name = read_name(v, p); }},
       {"stats_group",
        [&](const json& v, const std::string& p) { o.stats_group = read_rank_list(v, p, world, rank); }},
       {"tp_group",
        [&](const json& v, const std::string& p) { o.tp_group = read_optional_rank_list(v, p, world, rank); }},
       {"expert_tp_group",
        [&](const json& v, const std::string& p) {
          o.expert_tp_group = read_optional_rank_list(v, p, world, rank);
        }},
       {"clip",
        [&](const json& v, const std::string& p) {
          if (v.is_null()) return;
          Clip c;
          read_object(v, p,
                      {{"max_norm", [&](const json& x, const std::string& q) { c.max_norm = read_magnitude(x, q); }},
                       {"coefficient",
                        [&](const json& x, const std::string& q) { c.coefficient = read_magnitude(x, q); }}},
                      "the clip", {"max_norm", "coefficient"});
          o.clip = c;
        }},
       {"main_params",
        [&](const json& v, const std::string& p) {
          read_array(v, p, kMaxParams);
          for (std::size_t i = 0; i < v.size(); ++i)
            o.main_params.push_back(read_main_param(v[i], index_path(p, i), params));
        }}},
      "an optimizer", {"name", "stats_group", "tp_group", "expert_tp_group", "clip", "main_params"});
  return o;
}

Reported read_reported(const json& value, const std::string& path) {
  Reported r;
  read_object(value, path,
              {{"norm",
                [&](const json& v, const std::string& p) {
                  if (!v.is_null()) r.norm = read_magnitude(v, p);
                }},
               {"inf_norm",
                [&](const json& v, const std::string& p) {
                  if (!v.is_null()) r.inf_norm = read_magnitude(v, p);
                }},
               {"zeros",
                [&](const json& v, const std::string& p) {
                  if (!v.is_null()) r.zeros = read_integer(v, p, 0, kMaxInt);
                }}},
              "the reported values", {"norm", "inf_norm", "zeros"});
  return r;
}

bool is_group_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
         });
}

RankManifest read_manifest(const json& value, const std::string& path) {
  if (!value.is_object()) fail(path, std::string("expected a manifest object, got ") + casefile::type_word(value));
  // The version first: a newer file should say so rather than fail on a field it added.
  if (!value.contains("tally_manifest"))
    fail(path, "not a tally manifest: the key \"tally_manifest\" (the format version) is missing");
  const std::int64_t version = read_integer(value["tally_manifest"], path + ".tally_manifest", 0, kMaxInt);
  if (version != kManifestVersion)
    fail(path + ".tally_manifest", "this tally reads manifest version " +
                                       std::to_string(kManifestVersion) + ", got " +
                                       std::to_string(version));
  // rank and world before the fields whose checks need them.
  for (const char* key : {"rank", "world"})
    if (!value.contains(key)) fail(path, std::string("missing the key \"") + key + "\"");
  RankManifest m;
  m.world = static_cast<int>(read_integer(value["world"], path + ".world", 1, topologies::kMaxWorld));
  m.rank = static_cast<int>(read_integer(value["rank"], path + ".rank", 0, m.world - 1));
  json optimizers;
  read_object(
      value, path,
      {{"tally_manifest", [](const json&, const std::string&) {}},
       {"producer",
        [&](const json& v, const std::string& p) { m.producer = read_name(v, p); }},
       {"rank", [](const json&, const std::string&) {}},
       {"world", [](const json&, const std::string&) {}},
       {"parallel",
        [&](const json& v, const std::string& p) {
          ParallelSizes& s = m.parallel;
          auto size = [&](int& target) {  // each at most the world: the products below fit
            return [&target, &m](const json& x, const std::string& q) {
              target = static_cast<int>(read_integer(x, q, 1, m.world));
            };
          };
          read_object(v, p,
                      {{"tp", size(s.tp)}, {"cp", size(s.cp)}, {"pp", size(s.pp)},
                       {"dp", size(s.dp)}, {"ep", size(s.ep)}, {"etp", size(s.etp)}},
                      "the parallel sizes", {"tp", "cp", "pp", "dp", "ep", "etp"});
          const std::int64_t dense = std::int64_t{s.tp} * s.cp * s.pp * s.dp;
          if (dense != m.world)
            fail(p, "tp*cp*pp*dp = " + std::to_string(dense) + " is not the world " +
                        std::to_string(m.world));
          const std::int64_t expert = std::int64_t{s.etp} * s.ep * s.pp;
          if (m.world % expert != 0)
            fail(p, "etp*ep*pp = " + std::to_string(expert) + " does not divide the world " +
                        std::to_string(m.world));
        }},
       {"groups",
        [&](const json& v, const std::string& p) {
          if (!v.is_object()) fail(p, std::string("expected an object of rank lists, got ") + casefile::type_word(v));
          if (v.size() > kMaxGroups) fail(p, "more than " + std::to_string(kMaxGroups) + " groups");
          for (const auto& [name, ranks] : v.items()) {
            const std::string at = casefile::key_path(p, name);
            if (!is_group_name(name))
              fail(at, "a group name is lowercase letters, digits and _ (at most 64)");
            m.groups[name] = read_rank_list(ranks, at, m.world, m.rank);
          }
          for (const char* required : {"tp", "expt_tp"})
            if (!m.groups.count(required))
              fail(p, std::string("missing the group \"") + required + "\" (the diagnosis names it)");
        }},
       {"params",
        [&](const json& v, const std::string& p) {
          read_array(v, p, kMaxParams);
          m.params.reserve(v.size());
          for (std::size_t i = 0; i < v.size(); ++i) m.params.push_back(read_param(v[i], index_path(p, i)));
        }},
       // After params: main params refer to them.
       {"optimizers", [&](const json& v, const std::string&) { optimizers = v; }},
       {"reported",
        [&](const json& v, const std::string& p) { m.reported = read_reported(v, p); }}},
      "a manifest",
      {"tally_manifest", "producer", "rank", "world", "parallel", "groups", "params", "optimizers",
       "reported"});
  const std::string at = path + ".optimizers";
  read_array(optimizers, at, kMaxOptimizers);
  for (std::size_t i = 0; i < optimizers.size(); ++i)
    m.optimizers.push_back(read_optimizer(optimizers[i], index_path(at, i), m.world, m.rank, m.params));
  return m;
}

ordered_json attributes_json(const Attributes& a) {
  ordered_json j;
  j["tensor_model_parallel"] = a.tensor_model_parallel;
  j["partition_dim"] = a.partition_dim;
  j["allreduce"] = a.allreduce;
  j["shared"] = a.shared;
  j["grad_norm_group"] = a.grad_norm_group ? ordered_json(*a.grad_norm_group) : ordered_json(nullptr);
  return j;
}

ordered_json stats_json(const GradStats& s) {
  return {{"sum_squares", s.sum_squares}, {"abs_max", s.abs_max}, {"zeros", s.zeros}};
}

ordered_json optional_ranks(const std::optional<std::vector<int>>& ranks) {
  return ranks ? ordered_json(*ranks) : ordered_json(nullptr);
}

template <class T>
ordered_json optional_value(const std::optional<T>& value) {
  return value ? ordered_json(*value) : ordered_json(nullptr);
}

}  // namespace

ordered_json manifest_to_json(const RankManifest& m) {
  ordered_json j;
  j["tally_manifest"] = kManifestVersion;
  j["producer"] = m.producer;
  j["rank"] = m.rank;
  j["world"] = m.world;
  j["parallel"] = {{"tp", m.parallel.tp}, {"cp", m.parallel.cp}, {"pp", m.parallel.pp},
                   {"dp", m.parallel.dp}, {"ep", m.parallel.ep}, {"etp", m.parallel.etp}};
  ordered_json groups = ordered_json::object();
  for (const auto& [name, ranks] : m.groups) groups[name] = ranks;
  j["groups"] = std::move(groups);
  ordered_json params = ordered_json::array();
  for (const ModelParam& p : m.params)
    params.push_back({{"name", p.name},
                      {"logical_name", p.logical_name},
                      {"logical_shape", p.logical_shape},
                      {"offsets", p.offsets},
                      {"extents", p.extents},
                      {"attributes", attributes_json(p.attributes)},
                      {"stats", stats_json(p.stats)}});
  j["params"] = std::move(params);
  ordered_json optimizers = ordered_json::array();
  for (const OptimizerRecord& o : m.optimizers) {
    ordered_json main_params = ordered_json::array();
    for (const MainParam& p : o.main_params)
      main_params.push_back({{"param", p.param},
                             {"begin", p.begin},
                             {"end", p.end},
                             {"attributes", attributes_json(p.attributes)},
                             {"kept", p.kept},
                             {"kept_zeros", p.kept_zeros},
                             {"stats", stats_json(p.stats)}});
    optimizers.push_back(
        {{"name", o.name},
         {"stats_group", o.stats_group},
         {"tp_group", optional_ranks(o.tp_group)},
         {"expert_tp_group", optional_ranks(o.expert_tp_group)},
         {"clip", o.clip ? ordered_json{{"max_norm", o.clip->max_norm},
                                        {"coefficient", o.clip->coefficient}}
                         : ordered_json(nullptr)},
         {"main_params", std::move(main_params)}});
  }
  j["optimizers"] = std::move(optimizers);
  j["reported"] = {{"norm", optional_value(m.reported.norm)},
                   {"inf_norm", optional_value(m.reported.inf_norm)},
                   {"zeros", optional_value(m.reported.zeros)}};
  return j;
}

std::string manifest_to_text(const RankManifest& m) {
  return manifest_to_json(m).dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

RankManifest manifest_from_json(const json& value, std::string_view source) {
  try {
    return read_manifest(value, "manifest");
  } catch (const casefile::JsonReadError& error) {
    throw ManifestError(casefile::escape_controls(std::string(source) + ": " + error.what()));
  }
}

RankManifest manifest_from_text(std::string_view text, std::string_view source) {
  json parsed;
  try {
    parsed = casefile::parse_json(text, source);
  } catch (const casefile::JsonReadError& error) {
    throw ManifestError(casefile::escape_controls(error.what()));
  }
  return manifest_from_json(parsed, source);
}

std::string manifest_file_name(int rank) { return "rank-" + std::to_string(rank) + ".json"; }

namespace {

// The R of "rank-R.json" (digits, no sign, no leading zero), or -1.
int rank_of_file_name(const std::string& name) {
  const std::string prefix = "rank-", suffix = ".json";
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 7 || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoi(digits);
}

}  // namespace

std::vector<RankManifest> read_run(const std::vector<std::string>& paths, const FileBytes& bytes_of,
                                   const std::string& folder) {
  std::vector<std::pair<int, std::string>> files;
  for (const std::string& path : paths) {
    const int rank = rank_of_file_name(std::filesystem::path(path).filename().string());
    if (rank >= 0) files.emplace_back(rank, path);
  }
  if (files.empty())
    throw ManifestError(folder + ": no manifest in the folder (expected rank-<R>.json files)");
  std::sort(files.begin(), files.end());
  std::vector<RankManifest> run;
  run.reserve(files.size());
  for (const auto& [rank, file] : files) {
    RankManifest m = manifest_from_text(bytes_of(file), file);
    if (m.rank != rank)
      throw ManifestError(casefile::escape_controls(file) + ": manifest.rank: the file is named for rank " +
                          std::to_string(rank) + " but holds rank " + std::to_string(m.rank));
    run.push_back(std::move(m));
  }
  return run;
}

std::vector<RankManifest> load_run(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(dir, error))
    throw ManifestError(dir + ": not a folder of manifests (expected rank-<R>.json files)");
  std::vector<std::string> paths;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error))
    paths.push_back(it->path().string());
  if (error) throw ManifestError(dir + ": cannot list the folder (" + error.message() + ")");
  return read_run(paths, [](const std::string& path) {
    try {
      return casefile::read_bounded_file(path, kMaxManifestBytes, "manifest");
    } catch (const casefile::JsonReadError& e) {
      throw ManifestError(e.what());
    }
  }, dir);
}

void write_run(const std::string& dir, const std::vector<RankManifest>& manifests) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw std::runtime_error(dir + ": cannot create the folder (" + error.message() + ")");
  for (const RankManifest& m : manifests)
    casefile::write_file_atomically((std::filesystem::path(dir) / manifest_file_name(m.rank)).string(),
                                        manifest_to_text(m), "manifest");
}

}  // namespace tally::manifest
