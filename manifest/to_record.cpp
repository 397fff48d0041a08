#include "manifest/to_record.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "manifest/manifest_json.h"
#include "manifest/statistics.h"
#include "record/text.h"

namespace tally::manifest {

namespace {

constexpr std::size_t kMaxShownRanks = 16;

[[noreturn]] void invalid(int rank, const std::string& why) {
  throw ManifestError(manifest_file_name(rank) + ": " + why);
}

// The index of the separate grad-norm group `name` in the record, or -1 (0 is the main norm).
int norm_group_of(const record::RunRecord& run, const std::string& name) {
  for (std::size_t g = 1; g < run.norm_groups.size(); ++g)
    if (run.norm_groups[g].name == name) return static_cast<int>(g);
  return -1;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return record::rank_list_text(ranks, static_cast<std::int64_t>(ranks.size()), kMaxShownRanks);
}

// ---- the run as a whole -------------------------------------------------------------------

// Every rank once, in rank order; the same world, sizes and optimizer count everywhere.
std::vector<const RankManifest*> ranks_in_order(const std::vector<RankManifest>& manifests) {
  if (manifests.empty()) throw ManifestError("no manifest to check");
  const RankManifest& first = manifests.front();
  std::vector<const RankManifest*> by_rank(static_cast<std::size_t>(first.world), nullptr);
  for (const RankManifest& m : manifests) {
    if (m.world != first.world)
      invalid(m.rank, "manifest.world: " + std::to_string(m.world) + ", but rank " +
                          std::to_string(first.rank) + " says " + std::to_string(first.world));
    if (by_rank[static_cast<std::size_t>(m.rank)])
      invalid(m.rank, "manifest.rank: two manifests for rank " + std::to_string(m.rank));
    by_rank[static_cast<std::size_t>(m.rank)] = &m;
  }
  std::vector<int> missing;
  for (int r = 0; r < first.world; ++r)
    if (!by_rank[static_cast<std::size_t>(r)]) missing.push_back(r);
  if (!missing.empty())
    throw ManifestError("missing the manifests of " + std::to_string(missing.size()) + " of " +
                        std::to_string(first.world) + " ranks: " + ranks_text(missing) +
                        " (expected rank-<R>.json for every rank R of the world)");
  for (const RankManifest* m : by_rank) {
    if (m->parallel != first.parallel)
      invalid(m->rank, "manifest.parallel differs from rank " + std::to_string(first.rank) + "'s");
    if (m->optimizers.size() != first.optimizers.size())
      invalid(m->rank, "manifest.optimizers: " + std::to_string(m->optimizers.size()) +
                           " optimizers, but rank " + std::to_string(first.rank) + " has " +
                           std::to_string(first.optimizers.size()) +
                           " (every rank builds the same children)");
  }
  return by_rank;
}

// A collective group must be the same rank list on each of its members. `id_of(rank)` is the
// group that rank names (-1: it has none by that name); every rank is in the group it names
// (the reader checked), so a group is consistent exactly when as many ranks name it as it holds:
// O(world) per name, however large the groups.
template <class IdOf>
void check_group_consistent(const std::vector<const RankManifest*>& ranks, const RunManifests& run,
                            const std::string& what, IdOf id_of) {
  std::vector<std::size_t> naming(run.groups.size(), 0);
  for (const RankManifest* m : ranks)
    if (const GroupId id = id_of(*m); id >= 0) ++naming[static_cast<std::size_t>(id)];
  for (const RankManifest* m : ranks) {
    const GroupId id = id_of(*m);
    if (id < 0) continue;
    const std::vector<int>& mine = run.group(id);
    if (naming[static_cast<std::size_t>(id)] == mine.size()) continue;
    for (int member : mine) {
      const GroupId theirs = id_of(*ranks[static_cast<std::size_t>(member)]);
      if (theirs == id) continue;
      if (theirs < 0)
        invalid(m->rank, what + " " + ranks_text(mine) + " holds rank " + std::to_string(member) +
                             ", which has no " + what);
      invalid(m->rank, "inconsistent " + what + ": " + ranks_text(mine) + " here, but rank " +
                           std::to_string(member) + " lists " + ranks_text(run.group(theirs)));
    }
  }
}

void check_groups(const std::vector<const RankManifest*>& ranks, const RunManifests& run) {
  std::set<std::string> names;
  for (const RankManifest* m : ranks)
    for (const auto& [name, id] : m->groups) names.insert(name);
  for (const std::string& name : names)
    check_group_consistent(ranks, run, "group \"" + name + "\"", [&name](const RankManifest& m) {
      auto it = m.groups.find(name);
      return it == m.groups.end() ? GroupId{-1} : it->second;
    });
  const std::size_t children = ranks.front()->optimizers.size();
  for (std::size_t c = 0; c < children; ++c) {
    const std::string at = "optimizers[" + std::to_string(c) + "].";
    check_group_consistent(ranks, run, at + "stats_group",
                           [c](const RankManifest& m) { return m.optimizers[c].stats_group; });
    check_group_consistent(ranks, run, at + "tp_group", [c](const RankManifest& m) {
      return m.optimizers[c].tp_group.value_or(GroupId{-1});
    });
    check_group_consistent(ranks, run, at + "expert_tp_group", [c](const RankManifest& m) {
      return m.optimizers[c].expert_tp_group.value_or(GroupId{-1});
    });
  }
}

// Every group id a rank's manifest names.
std::vector<GroupId> group_ids(const RankManifest& m) {
  std::vector<GroupId> ids;
  for (const auto& [name, id] : m.groups) ids.push_back(id);
  for (const OptimizerRecord& o : m.optimizers) {
    ids.push_back(o.stats_group);
    if (o.tp_group) ids.push_back(*o.tp_group);
    if (o.expert_tp_group) ids.push_back(*o.expert_tp_group);
  }
  return ids;
}

// ---- the logical model --------------------------------------------------------------------

struct Holder {
  int rank = 0;
  int param = 0;  // index into that rank's params
};

struct DistinctBox {
  std::vector<std::int64_t> offsets, extents;
  Holder first;  // the first holder
};

struct LogicalParam {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  Attributes attributes;  // of the first holder that is not a shared copy
  std::vector<DistinctBox> boxes;
};

bool boxes_intersect(const DistinctBox& a, const ModelParam& b) {
  for (std::size_t d = 0; d < a.offsets.size(); ++d)
    if (a.offsets[d] + a.extents[d] <= b.offsets[d] || b.offsets[d] + b.extents[d] <= a.offsets[d])
      return false;
  return true;
}

std::string param_at(const RankManifest& m, int index) {
  return "params[" + std::to_string(index) + "] (" + m.params[static_cast<std::size_t>(index)].logical_name + ")";
}

// Logical params in order of first appearance; `index_of[rank][param]` locates each holder's.
std::vector<LogicalParam> rebuild_logical_model(const std::vector<const RankManifest*>& ranks,
                                                std::vector<std::vector<int>>& index_of) {
  std::vector<LogicalParam> model;
  std::map<std::string, int> by_name;
  index_of.assign(ranks.size(), {});
  for (const RankManifest* m : ranks) {
    for (std::size_t i = 0; i < m->params.size(); ++i) {
      const ModelParam& p = m->params[i];
      auto [it, inserted] = by_name.emplace(p.logical_name, static_cast<int>(model.size()));
      if (inserted) {
        LogicalParam l;
        l.name = p.logical_name;
        l.shape = p.logical_shape;
        l.numel = volume(p.logical_shape);
        l.attributes = p.attributes;
        model.push_back(std::move(l));
      }
      LogicalParam& l = model[static_cast<std::size_t>(it->second)];
      index_of[static_cast<std::size_t>(m->rank)].push_back(it->second);
      if (p.logical_shape != l.shape)
        invalid(m->rank, param_at(*m, static_cast<int>(i)) + ": logical_shape " +
                             sizes_text(p.logical_shape) + " differs from " + sizes_text(l.shape) +
                             " of rank " + std::to_string(l.boxes.front().first.rank));
      if (l.attributes.shared && !p.attributes.shared) l.attributes = p.attributes;
      else if (!p.attributes.shared && p.attributes.grad_norm_group != l.attributes.grad_norm_group)
        invalid(m->rank, param_at(*m, static_cast<int>(i)) + ": grad_norm_group differs from " +
                             "another holder's (every holder of a logical param is in one norm group)");
      const Holder here{m->rank, static_cast<int>(i)};
      bool placed = false;
      for (DistinctBox& box : l.boxes) {
        if (box.offsets == p.offsets && box.extents == p.extents) {  // a replica
          placed = true;
          break;
        }
        if (boxes_intersect(box, p))
          invalid(m->rank, param_at(*m, static_cast<int>(i)) + ": the box offsets " +
                               sizes_text(p.offsets) + " extents " + sizes_text(p.extents) +
                               " overlaps rank " + std::to_string(box.first.rank) + "'s box offsets " +
                               sizes_text(box.offsets) + " extents " + sizes_text(box.extents) +
                               " partially (boxes of one logical param are identical or disjoint)");
      }
      if (!placed) l.boxes.push_back({p.offsets, p.extents, here});
    }
  }
  double total = 0.0;
  for (LogicalParam& l : model) {
    total += static_cast<double>(l.numel);
    if (total > 9.0e15)
      throw ManifestError("the logical params hold more than 2^53 elements in all");
    std::int64_t held = 0;
    for (const DistinctBox& b : l.boxes) held += volume(b.extents);
    if (held != l.numel)
      throw ManifestError("logical param " + l.name + " " + sizes_text(l.shape) + ": the ranks hold " +
                          std::to_string(held) + " of its " + std::to_string(l.numel) +
                          " elements; the truth needs every element held somewhere");
  }
  return model;
}

// ---- the record -----------------------------------------------------------------------------

// What a logical param is, in a diagnosis: its attributes, as the framework set them. `split`:
// some rank holds only part of it.
std::string kind_of(const Attributes& a, bool split) {
  std::string out = a.allreduce ? "" : "expert-topology ";
  // DeepSpeed's AutoTP marks its shards tensor_model_parallel without a partition_dim.
  if (a.tensor_model_parallel)
    return out + "tensor-parallel shard (" +
           (a.partition_dim >= 0 ? "dim " + std::to_string(a.partition_dim) : std::string("no partition_dim")) + ")";
  // Held in pieces, yet unmarked: a filter takes each piece for a replica (DeepSpeed's expert
  // copies, docs/findings/deepspeed-0.19.8-expert-tp-drops-expert-shards-of-tp-ranks.md).
  if (split) return out + "shard not marked tensor_model_parallel";
  return out + (a.allreduce ? "replicated over TP" : "param replicated over ETP");
}

record::Attributes attributes_of(const Attributes& a) {
  return {a.tensor_model_parallel, a.partition_dim, a.allreduce, a.shared, a.is_gtp_weight_remat};
}

record::Extents extents_of(const std::vector<std::int64_t>& sizes) {
  record::Extents e;
  e.ndim = static_cast<int>(sizes.size());
  for (std::size_t d = 0; d < sizes.size(); ++d) e.size[d] = sizes[d];
  return e;
}

// The rule a manifest implies for a piece: Megatron-LM's filter reading the main copy's
// attributes with the groups its optimizer gave it (docs/megatron-reference.md).
// `gtp`: the run names GTP groups (megatron-core 0.19), so param_is_not_gtp_duplicate applies.
record::Rule rule_of(const MainParam& piece, const OptimizerRecord& optimizer, bool gtp) {
  const Attributes& a = piece.attributes;
  record::Rule rule;
  if (gtp && !a.shared && !a.is_gtp_weight_remat)
    rule.gtp_dedup = a.allreduce ? record::GtpDedup::gtp : record::GtpDedup::expert_gtp;
  if (a.shared) rule.basis = record::Basis::shared_copy;
  else if (a.tensor_model_parallel) rule.basis = record::Basis::tensor_parallel_shard;
  else {
    rule.basis = record::Basis::replicated;
    rule.dedup = !a.allreduce && optimizer.expert_tp_group ? record::DedupGroup::expert_tp
                 : optimizer.tp_group                      ? record::DedupGroup::tp
                                                           : record::DedupGroup::global_tp;
  }
  return rule;
}

}  // namespace

namespace {
record::RunRecord to_record(const RunManifests& manifests, bool agreement);
}  // namespace

record::RunRecord to_record(const RunManifests& manifests) { return to_record(manifests, true); }
record::RunRecord to_record_of_case(const RunManifests& manifests) { return to_record(manifests, false); }

namespace {

record::RunRecord to_record(const RunManifests& manifests, bool agreement) {
  const std::vector<const RankManifest*> ranks = ranks_in_order(manifests.ranks);
  // The readers check these per file; a run built in memory is held to them too.
  for (const RankManifest* m : ranks)
    for (const GroupId id : group_ids(*m)) {
      if (id < 0 || static_cast<std::size_t>(id) >= manifests.groups.size())
        invalid(m->rank, "group id " + std::to_string(id) + " outside the run's " +
                             std::to_string(manifests.groups.size()) + " groups");
      const std::vector<int>& group = manifests.group(id);
      if (!std::binary_search(group.begin(), group.end(), m->rank))
        invalid(m->rank, "group " + ranks_text(group) + " does not hold this manifest's own rank");
    }
  check_groups(ranks, manifests);
  std::vector<std::vector<int>> index_of;
  const std::vector<LogicalParam> model = rebuild_logical_model(ranks, index_of);
  if (model.empty())
    throw ManifestError("no rank holds a param (every manifest's params list is empty): a run of no model "
                        "counts nothing, so there is nothing to judge");
  check_statistics(ranks, index_of, agreement);

  record::RunRecord run;
  const RankManifest& first = *ranks.front();
  run.producer = first.producer;
  run.world = first.world;
  for (const OptimizerRecord& o : first.optimizers) run.children.push_back(o.name);
  // Split over ranks: some rank holds only part of it (one rank holding it in several pieces, as
  // AutoEP's stacked experts, is not).
  std::vector<bool> split(model.size(), false);
  for (const RankManifest* m : ranks) {
    std::map<int, std::int64_t> held;
    const std::vector<int>& logical = index_of[static_cast<std::size_t>(m->rank)];
    for (std::size_t i = 0; i < m->params.size(); ++i) held[logical[i]] += volume(m->params[i].extents);
    for (const auto& [l, elements] : held)
      if (elements < model[static_cast<std::size_t>(l)].numel) split[static_cast<std::size_t>(l)] = true;
  }
  for (std::size_t l = 0; l < model.size(); ++l) {
    record::Tensor& t = run.tensors.emplace_back();
    t.name = model[l].name;
    t.shape = extents_of(model[l].shape);
    t.kind = kind_of(model[l].attributes, split[l]);
    if (const std::optional<std::string>& group = model[l].attributes.grad_norm_group) {
      // A separate grad-norm group: judged (counted) once a rank reports its norm, below.
      auto known = std::find_if(run.norm_groups.begin(), run.norm_groups.end(),
                                [&](const record::NormGroup& g) { return g.name == *group; });
      t.norm_group = static_cast<int>(known - run.norm_groups.begin());
      if (known == run.norm_groups.end()) run.norm_groups.push_back({*group, false});
    }
  }
  run.zero_count_reported = std::any_of(ranks.begin(), ranks.end(),
                                       [](const RankManifest* m) { return m->reported.zeros.has_value(); });
  for (const RankManifest* m : ranks)
    for (const auto& [name, norm] : m->reported.group_norms) {
      const int group = norm_group_of(run, name);
      if (group <= 0)
        invalid(m->rank, "reported.group_norms names '" + name + "', a grad_norm_group no param of the run carries");
      run.norm_groups[static_cast<std::size_t>(group)].counted = true;
    }
  // Megatron-LM has one separate group ("mtp"), and the truth keeps one besides the main norm:
  // params of other groups only leave the main norm, as long as no rank reports their norms.
  std::vector<std::string> reported_groups;
  for (const record::NormGroup& g : run.norm_groups)
    if (!g.name.empty() && g.counted) reported_groups.push_back(g.name);
  if (reported_groups.size() > 1)
    throw ManifestError("reported.group_norms names grad_norm_group '" + reported_groups[0] + "' and '" +
                        reported_groups[1] +
                        "': tally judges one separate grad-norm group besides the main norm");

  run.groups = manifests.groups;  // group ids are the record's
  record::LocalRecordPool locals;
  auto group = [](const std::optional<GroupId>& id) { return id.value_or(-1); };
  for (const RankManifest* m : ranks) {
    record::RankRecord& rank = run.ranks.emplace_back();
    rank.rank = m->rank;
    rank.tp_group = m->groups.at("tp");
    rank.expert_tp_group = m->groups.at("expt_tp");
    const auto gtp_group = m->groups.find("gtp_remat");
    const auto expert_gtp_group = m->groups.find("expt_gtp_remat");
    const bool gtp = gtp_group != m->groups.end() && expert_gtp_group != m->groups.end();
    if (gtp) {
      rank.gtp_group = gtp_group->second;
      rank.expert_gtp_group = expert_gtp_group->second;
    }
    record::LocalRecord local;
    const std::vector<int>& logical_of = index_of[static_cast<std::size_t>(m->rank)];
    std::vector<record::LocalParam> params;
    for (std::size_t i = 0; i < m->params.size(); ++i) {
      const ModelParam& p = m->params[i];
      record::LocalParam& param = params.emplace_back();
      param.tensor = logical_of[i];
      for (std::size_t d = 0; d < p.offsets.size(); ++d) param.box.offset[d] = p.offsets[d];
      param.box.extent = extents_of(p.extents);
      param.attributes = attributes_of(p.attributes);
      param.stats = p.stats;
    }
    local.params = std::move(params);
    for (std::size_t c = 0; c < m->optimizers.size(); ++c) {
      const OptimizerRecord& o = m->optimizers[c];
      record::ChildRecord& child = rank.children.emplace_back();
      child.stats_group = o.stats_group;
      child.tp_group = group(o.tp_group);
      child.expert_tp_group = group(o.expert_tp_group);
      if (o.clip) child.clip = record::Clip{o.clip->max_norm, o.clip->coefficient};
      for (const MainParam& p : o.main_params) {
        record::Piece& piece = local.pieces.emplace_back();
        piece.param = p.param;
        piece.child = static_cast<int>(c);
        piece.range = {p.begin, p.end};
        piece.main_attributes = attributes_of(p.attributes);
        // `kept`: kept for the norm of the param's own grad-norm group.
        piece.counted_in =
            p.kept ? run.tensors[static_cast<std::size_t>(logical_of[static_cast<std::size_t>(p.param)])].norm_group : -1;
        piece.in_zero_count = p.kept_zeros;
        piece.rule = rule_of(p, o, gtp);
        piece.stats = p.stats;
        if (p.clipped_stats) {
          local.clipped_stats.resize(local.pieces.size());
          local.clipped_stats.back() = p.clipped_stats;
        }
      }
    }
    rank.local = locals.intern(std::move(local));
    rank.reported.norm = m->reported.norm;
    rank.reported.inf_norm = m->reported.inf_norm;
    rank.reported.zeros = m->reported.zeros;
    for (const auto& [name, norm] : m->reported.group_norms)
      rank.reported.group_norms.push_back({norm_group_of(run, name), norm, 1.0});
  }
  return run;
}

}  // namespace

}  // namespace tally::manifest
