#include "manifest/manifest_json.h"

#include "manifest/statistics.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <exception>
#include <filesystem>
#include <memory>
#include <thread>
#include <unordered_map>
#include <limits>
#include <system_error>

#include "io/atomic_file.h"
#include "io/json_read.h"
#include "topologies/parallel_config.h"

namespace tally::manifest {

namespace {

using io::Field;
using io::fail;
using io::read_array;
using io::read_bool;
using io::read_integer;
using io::read_number;
using io::read_object;
using io::key_path;
using io::read_string;
using io::shown;
using io::type_word;
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

// A case digest: 16 lowercase hex digits (run/framework_worker.h writes them).
std::string read_case_digest(const json& value, const std::string& path) {
  std::string digest = read_string(value, path, 64);
  const bool hex = digest.size() == 16 && std::all_of(digest.begin(), digest.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
  if (!hex) fail(path, "a case digest is 16 lowercase hex digits, got " + shown(value));
  return digest;
}

// A non-negative finite number.
double read_magnitude(const json& value, const std::string& path) {
  const double x = read_number(value, path);
  if (x < 0.0) fail(path, "expected a number >= 0, got " + shown(value));
  return x;
}

// A rank list: sorted, no repeats, every rank in [0, world), not empty.
std::vector<int> read_rank_list(const json& value, const std::string& path, int world) {
  read_array(value, path, static_cast<std::size_t>(world));
  if (value.empty()) fail(path, "expected at least one rank");
  std::vector<int> ranks;
  ranks.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    const int r = static_cast<int>(read_integer(value[i], index_path(path, i), 0, world - 1));
    if (!ranks.empty() && r <= ranks.back())
      fail(index_path(path, i), "expected ranks in increasing order without repeats, got " +
                                    std::to_string(r) + " after " + std::to_string(ranks.back()));
    ranks.push_back(r);
  }
  return ranks;
}

// A group a rank file names: its rank list (version 1) or an index into groups.json (version
// 2). Either way the group holds the file's own rank.
GroupId read_group(const json& value, const std::string& path, int world, int rank, RunGroups& groups) {
  if (groups.version() == 1) {
    const std::vector<int> ranks = read_rank_list(value, path, world);
    if (!std::binary_search(ranks.begin(), ranks.end(), rank))
      fail(path, "the group does not hold this manifest's own rank " + std::to_string(rank));
    return groups.intern(ranks);
  }
  const std::vector<std::vector<int>>& table = groups.table();
  if (!value.is_number_integer())
    fail(path, std::string("expected the index of a group in groups.json (version 2), got ") + shown(value));
  const std::int64_t index = read_integer(value, path, 0, kMaxInt);
  if (index >= static_cast<std::int64_t>(table.size()))
    fail(path, "groups.json holds " + std::to_string(table.size()) + " groups (indices 0 to " +
                   std::to_string(static_cast<std::int64_t>(table.size()) - 1) + "), got " + std::to_string(index));
  const auto id = static_cast<GroupId>(index);
  const std::vector<int>& ranks = table[static_cast<std::size_t>(id)];
  if (!std::binary_search(ranks.begin(), ranks.end(), rank))
    fail(path, "groups.json's groups[" + std::to_string(id) + "] does not hold this manifest's own rank " +
                   std::to_string(rank));
  return id;
}

std::optional<GroupId> read_optional_group(const json& value, const std::string& path, int world, int rank,
                                           RunGroups& groups) {
  if (value.is_null()) return std::nullopt;
  return read_group(value, path, world, rank, groups);
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
                }},
               {"is_gtp_weight_remat",
                [&](const json& v, const std::string& p) { a.is_gtp_weight_remat = read_bool(v, p); }}},
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
                          const record::SharedList<ModelParam>& params) {
  MainParam m;
  json stats, clipped;
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
       {"stats", [&](const json& v, const std::string&) { stats = v; }},
       {"clipped_stats", [&](const json& v, const std::string&) { clipped = v; }}},
      "a main param", {"param", "begin", "end", "attributes", "kept", "kept_zeros", "stats"});
  const std::int64_t box = element_count(params[static_cast<std::size_t>(m.param)].extents);
  if (!(m.begin < m.end) || m.end > box)
    fail(path, "expected 0 <= begin < end <= " + std::to_string(box) +
                   " (the elements of param " + std::to_string(m.param) + "'s box), got begin " +
                   std::to_string(m.begin) + ", end " + std::to_string(m.end));
  m.stats = read_stats(stats, path + ".stats", m.end - m.begin);
  if (!clipped.is_null()) {
    m.clipped_stats = read_stats(clipped, path + ".clipped_stats", m.end - m.begin);
    // Judged against the case's gradients only (run/target_run.h), but never a value no gradient has.
    if (const std::string rule = impossible_statistics(*m.clipped_stats, m.end - m.begin); !rule.empty())
      fail(path + ".clipped_stats", "impossible statistics: " + rule);
  }
  return m;
}

OptimizerRecord read_optimizer(const json& value, const std::string& path, int world, int rank,
                               const record::SharedList<ModelParam>& params, RunGroups& groups) {
  OptimizerRecord o;
  read_object(
      value, path,
      {{"name", [&](const json& v, const std::string& p) { o.name = read_name(v, p); }},
       {"stats_group",
        [&](const json& v, const std::string& p) { o.stats_group = read_group(v, p, world, rank, groups); }},
       {"tp_group",
        [&](const json& v, const std::string& p) { o.tp_group = read_optional_group(v, p, world, rank, groups); }},
       {"expert_tp_group",
        [&](const json& v, const std::string& p) {
          o.expert_tp_group = read_optional_group(v, p, world, rank, groups);
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
                }},
               {"group_norms",
                [&](const json& v, const std::string& p) {
                  if (!v.is_object()) fail(p, std::string("expected an object of grad-norm group names and norms, got ") + type_word(v));
                  if (v.size() > 16) fail(p, "has " + std::to_string(v.size()) + " groups; at most 16");
                  for (const auto& [name, norm] : v.items()) {
                    const std::string at = key_path(p, name);
                    if (name.empty() || name.size() > kMaxNameLength) fail(at, "a group name is 1 to " + std::to_string(kMaxNameLength) + " bytes");
                    r.group_norms[name] = read_magnitude(norm, at);
                  }
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

RankManifest read_manifest(const json& value, const std::string& path, RunGroups& groups) {
  if (!value.is_object()) fail(path, std::string("expected a manifest object, got ") + io::type_word(value));
  // The version first: a newer file should say so rather than fail on a field it added.
  if (!value.contains("tally_manifest"))
    fail(path, "not a tally manifest: the key \"tally_manifest\" (the format version) is missing");
  const std::int64_t version = read_integer(value["tally_manifest"], path + ".tally_manifest", 0, kMaxInt);
  if (version != 1 && version != 2)
    fail(path + ".tally_manifest", "this tally reads manifest versions 1 and 2, got " + std::to_string(version));
  if (version != groups.version())
    fail(path + ".tally_manifest",
         groups.version() == 2
             ? "version " + std::to_string(version) + " in a version 2 run (the folder has groups.json; every file of a run has one version)"
             : "version 2 refers to the run's groups in groups.json, which the folder lacks (rank 0 writes it)");
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
       {"case_digest", [&](const json& v, const std::string& p) { m.case_digest = read_case_digest(v, p); }},
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
          if (!v.is_object()) fail(p, std::string("expected an object of rank lists, got ") + io::type_word(v));
          if (v.size() > kMaxGroups) fail(p, "more than " + std::to_string(kMaxGroups) + " groups");
          for (const auto& [name, ranks] : v.items()) {
            const std::string at = io::key_path(p, name);
            if (!is_group_name(name))
              fail(at, "a group name is lowercase letters, digits and _ (at most 64)");
            m.groups[name] = read_group(ranks, at, m.world, m.rank, groups);
          }
          for (const char* required : {"tp", "expt_tp"})
            if (!m.groups.count(required))
              fail(p, std::string("missing the group \"") + required + "\" (the diagnosis names it)");
        }},
       {"params",
        [&](const json& v, const std::string& p) {
          read_array(v, p, kMaxParams);
          std::vector<ModelParam> params;
          params.reserve(v.size());
          for (std::size_t i = 0; i < v.size(); ++i) params.push_back(read_param(v[i], index_path(p, i)));
          m.params = std::move(params);
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
    m.optimizers.push_back(read_optimizer(optimizers[i], index_path(at, i), m.world, m.rank, m.params, groups));
  return m;
}

ordered_json attributes_json(const Attributes& a) {
  ordered_json j;
  j["tensor_model_parallel"] = a.tensor_model_parallel;
  j["partition_dim"] = a.partition_dim;
  j["allreduce"] = a.allreduce;
  j["shared"] = a.shared;
  j["grad_norm_group"] = a.grad_norm_group ? ordered_json(*a.grad_norm_group) : ordered_json(nullptr);
  if (a.is_gtp_weight_remat) j["is_gtp_weight_remat"] = true;
  return j;
}

ordered_json stats_json(const GradStats& s) {
  return {{"sum_squares", s.sum_squares}, {"abs_max", s.abs_max}, {"zeros", s.zeros}};
}

// A group as a version-`version` file names it: its rank list (1) or its id (2).
struct GroupWriter {
  const std::vector<std::vector<int>>& table;
  int version;
  ordered_json operator()(GroupId id) const {
    return version == 1 ? ordered_json(table[static_cast<std::size_t>(id)]) : ordered_json(id);
  }
  ordered_json operator()(const std::optional<GroupId>& id) const {
    return id ? (*this)(*id) : ordered_json(nullptr);
  }
};

template <class T>
ordered_json optional_value(const std::optional<T>& value) {
  return value ? ordered_json(*value) : ordered_json(nullptr);
}

}  // namespace

ordered_json manifest_to_json(const RankManifest& m, const std::vector<std::vector<int>>& table, int version) {
  if (version != 1 && version != 2) throw std::invalid_argument("manifest version " + std::to_string(version));
  const GroupWriter group{table, version};
  ordered_json j;
  j["tally_manifest"] = version;
  j["producer"] = m.producer;
  if (m.case_digest) j["case_digest"] = *m.case_digest;
  j["rank"] = m.rank;
  j["world"] = m.world;
  j["parallel"] = {{"tp", m.parallel.tp}, {"cp", m.parallel.cp}, {"pp", m.parallel.pp},
                   {"dp", m.parallel.dp}, {"ep", m.parallel.ep}, {"etp", m.parallel.etp}};
  ordered_json groups = ordered_json::object();
  for (const auto& [name, id] : m.groups) groups[name] = group(id);
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
    for (const MainParam& p : o.main_params) {
      main_params.push_back({{"param", p.param},
                             {"begin", p.begin},
                             {"end", p.end},
                             {"attributes", attributes_json(p.attributes)},
                             {"kept", p.kept},
                             {"kept_zeros", p.kept_zeros},
                             {"stats", stats_json(p.stats)}});
      if (p.clipped_stats) main_params.back()["clipped_stats"] = stats_json(*p.clipped_stats);
    }
    optimizers.push_back(
        {{"name", o.name},
         {"stats_group", group(o.stats_group)},
         {"tp_group", group(o.tp_group)},
         {"expert_tp_group", group(o.expert_tp_group)},
         {"clip", o.clip ? ordered_json{{"max_norm", o.clip->max_norm},
                                        {"coefficient", o.clip->coefficient}}
                         : ordered_json(nullptr)},
         {"main_params", std::move(main_params)}});
  }
  j["optimizers"] = std::move(optimizers);
  j["reported"] = {{"norm", optional_value(m.reported.norm)},
                   {"inf_norm", optional_value(m.reported.inf_norm)},
                   {"zeros", optional_value(m.reported.zeros)}};
  if (!m.reported.group_norms.empty()) {
    ordered_json groups = ordered_json::object();
    for (const auto& [name, norm] : m.reported.group_norms) groups[name] = norm;
    j["reported"]["group_norms"] = std::move(groups);
  }
  return j;
}

std::string manifest_to_text(const RankManifest& m, const std::vector<std::vector<int>>& groups, int version) {
  return manifest_to_json(m, groups, version).dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

RankManifest manifest_from_json(const json& value, std::string_view source, RunGroups& groups) {
  try {
    return read_manifest(value, "manifest", groups);
  } catch (const io::JsonReadError& error) {
    throw ManifestError(io::escape_controls(std::string(source) + ": " + error.what()));
  }
}

RankManifest manifest_from_text(std::string_view text, std::string_view source, RunGroups& groups) {
  json parsed;
  try {
    parsed = io::parse_json(text, source);
  } catch (const io::JsonReadError& error) {
    throw ManifestError(io::escape_controls(error.what()));
  }
  return manifest_from_json(parsed, source, groups);
}

RunGroups::RunGroups(std::vector<std::vector<int>> table) : fixed_(true), table_(std::move(table)) {}

GroupId RunGroups::intern(const std::vector<int>& ranks) {
  const std::lock_guard<std::mutex> lock(mutex_);
  return grown_->intern(ranks);
}

std::string groups_to_text(int world, const std::vector<std::vector<int>>& groups) {
  // One group per line: the file stays readable and diffable at a million ranks.
  std::string out = "{\n  \"tally_groups\": 2,\n  \"world\": " + std::to_string(world) + ",\n  \"groups\": [";
  for (std::size_t g = 0; g < groups.size(); ++g) {
    out += g ? ",\n    [" : "\n    [";
    for (std::size_t i = 0; i < groups[g].size(); ++i) out += (i ? ", " : "") + std::to_string(groups[g][i]);
    out += "]";
  }
  return out + (groups.empty() ? "]\n}\n" : "\n  ]\n}\n");
}

int groups_from_text(std::string_view text, std::string_view source, std::vector<std::vector<int>>& groups) {
  json value;
  try {
    value = io::parse_json(text, source);
  } catch (const io::JsonReadError& error) {
    throw ManifestError(io::escape_controls(error.what()));
  }
  try {
    const std::string path = "groups";
    if (!value.is_object()) fail(path, std::string("expected the groups object, got ") + io::type_word(value));
    if (!value.contains("tally_groups"))
      fail(path, "not a tally groups file: the key \"tally_groups\" (the format version) is missing");
    const std::int64_t version = read_integer(value["tally_groups"], path + ".tally_groups", 0, kMaxInt);
    if (version != 2) fail(path + ".tally_groups", "this tally reads groups version 2, got " + std::to_string(version));
    if (!value.contains("world")) fail(path, "missing the key \"world\"");
    const int world = static_cast<int>(read_integer(value["world"], path + ".world", 1, topologies::kMaxWorld));
    std::map<std::vector<int>, std::size_t> seen;
    read_object(value, path,
                {{"tally_groups", [](const json&, const std::string&) {}},
                 {"world", [](const json&, const std::string&) {}},
                 {"groups",
                  [&](const json& v, const std::string& p) {
                    read_array(v, p, std::numeric_limits<std::size_t>::max());
                    groups.clear();
                    groups.reserve(v.size());
                    for (std::size_t g = 0; g < v.size(); ++g) {
                      std::vector<int> ranks = read_rank_list(v[g], index_path(p, g), world);
                      auto [it, fresh] = seen.try_emplace(ranks, g);
                      if (!fresh)
                        fail(index_path(p, g), "repeats groups[" + std::to_string(it->second) +
                                                   "] (each group is listed once; ranks refer to it by index)");
                      groups.push_back(std::move(ranks));
                    }
                  }}},
                "the groups file", {"tally_groups", "world", "groups"});
    return world;
  } catch (const io::JsonReadError& error) {
    throw ManifestError(io::escape_controls(std::string(source) + ": " + error.what()));
  }
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

// Calls work(0 .. count-1) on up to `threads` threads (0: one per core). Rethrows the exception
// of the lowest index that threw, so the message names the first bad file in rank order.
template <class Work>
void for_each_in_parallel(std::size_t count, unsigned threads, Work work) {
  std::vector<std::exception_ptr> errors(count);
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < count;) {
      try {
        work(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, count));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
}

// Params lists by content, shared between reading threads: data-parallel replicas hold equal
// lists, so a run's manifests keep one per distinct list, not one per rank.
class ParamsPool {
 public:
  void intern(record::SharedList<ModelParam>& params) {
    std::uint64_t hash = 0xcbf29ce484222325ull;
    auto mix = [&hash](std::uint64_t v) { hash = (hash ^ v) * 0x100000001b3ull; };
    for (const ModelParam& p : params) {
      mix(std::hash<std::string>{}(p.logical_name));
      for (std::int64_t o : p.offsets) mix(static_cast<std::uint64_t>(o));
      mix(std::bit_cast<std::uint64_t>(p.stats.sum_squares));
    }
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<record::SharedList<ModelParam>>& same = by_hash_[hash];
    for (const record::SharedList<ModelParam>& known : same)
      if (known == params) {
        params = known;
        return;
      }
    same.push_back(params);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::vector<record::SharedList<ModelParam>>> by_hash_;
};

}  // namespace

RunManifests read_run(const std::vector<std::string>& paths, const FileBytes& bytes_of,
                      const std::string& folder, unsigned threads) {
  std::vector<std::pair<int, std::string>> files;
  std::optional<std::string> groups_file;
  for (const std::string& path : paths) {
    const std::string name = std::filesystem::path(path).filename().string();
    if (name == kGroupsFileName) groups_file = path;
    const int rank = rank_of_file_name(name);
    if (rank >= 0) files.emplace_back(rank, path);
  }
  if (files.empty())
    throw ManifestError(folder + ": no manifest in the folder (expected rank-<R>.json files)");
  std::sort(files.begin(), files.end());

  RunManifests run;
  std::unique_ptr<RunGroups> groups = std::make_unique<RunGroups>();
  int groups_world = 0;
  if (groups_file) {
    std::vector<std::vector<int>> table;
    groups_world = groups_from_text(bytes_of(*groups_file), *groups_file, table);
    groups = std::make_unique<RunGroups>(std::move(table));
  }
  run.version = groups->version();

  // Each file parsed on its own thread, one at a time per thread: peak memory is the records
  // kept (their params pooled) plus one file's text and JSON tree per thread.
  run.ranks.resize(files.size());
  ParamsPool params;
  for_each_in_parallel(files.size(), threads, [&](std::size_t i) {
    const auto& [rank, file] = files[i];
    RankManifest m = manifest_from_text(bytes_of(file), file, *groups);
    if (m.rank != rank)
      throw ManifestError(io::escape_controls(file) + ": manifest.rank: the file is named for rank " +
                          std::to_string(rank) + " but holds rank " + std::to_string(m.rank));
    if (groups_file && m.world != groups_world)
      throw ManifestError(io::escape_controls(file) + ": manifest.world: " + std::to_string(m.world) +
                          ", but groups.json says " + std::to_string(groups_world));
    params.intern(m.params);
    run.ranks[i] = std::move(m);
  });
  run.groups = groups->take();
  return run;
}

RunManifests load_run(const std::string& dir, unsigned threads) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(dir, error))
    throw ManifestError(dir + ": not a folder of manifests (expected rank-<R>.json files)");
  std::vector<std::string> paths;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error))
    paths.push_back(it->path().string());
  if (error) throw ManifestError(dir + ": cannot list the folder (" + error.message() + ")");
  return read_run(paths, [](const std::string& path) {
    const bool groups = fs::path(path).filename() == kGroupsFileName;
    try {
      return io::read_bounded_file(path, groups ? kMaxGroupsBytes : kMaxManifestBytes,
                                         groups ? "groups file" : "manifest");
    } catch (const io::JsonReadError& e) {
      throw ManifestError(e.what());
    }
  }, dir, threads);
}

void write_run(const std::string& dir, const RunManifests& run, int version) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw std::runtime_error(dir + ": cannot create the folder (" + error.message() + ")");
  const std::filesystem::path folder(dir);
  if (version == 1) std::filesystem::remove(folder / kGroupsFileName, error);  // else read as version 2
  if (version == 2 && !run.ranks.empty())
    io::write_file_atomically((folder / kGroupsFileName).string(),
                                    groups_to_text(run.ranks.front().world, run.groups), "groups file");
  // Bound by fsync more than by the CPU: more threads than cores.
  for_each_in_parallel(run.ranks.size(), 4 * std::max(1u, std::thread::hardware_concurrency()), [&](std::size_t i) {
    const RankManifest& m = run.ranks[i];
    io::write_file_atomically((folder / manifest_file_name(m.rank)).string(),
                                    manifest_to_text(m, run.groups, version), "manifest");
  });
}

}  // namespace tally::manifest
