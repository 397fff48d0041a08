#include "manifest/check.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "manifest/manifest_json.h"

namespace tally::manifest {

namespace {

constexpr std::int64_t kMaxIntervals = 50'000'000;  // pieces cut into row segments, whole run
constexpr double kReplicaRtol = 1e-9;               // replicas hold the same gradient
constexpr std::size_t kMaxShownRanks = 16;

[[noreturn]] void invalid(int rank, const std::string& why) {
  throw ManifestError(manifest_file_name(rank) + ": " + why);
}

std::string ranks_text(const std::vector<int>& ranks) {
  return oracle::rank_list_text(ranks, static_cast<std::int64_t>(ranks.size()), kMaxShownRanks);
}

std::string shape_text(const std::vector<std::int64_t>& sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? "," : "") + std::to_string(sizes[i]);
  return out + "]";
}

std::int64_t volume(const std::vector<std::int64_t>& extents) {
  std::int64_t n = 1;
  for (std::int64_t e : extents) n *= e;
  return n;
}

// Neumaier's compensated sum: the truth and the ledger-implied norms add many squares.
struct CompensatedSum {
  double sum = 0.0, compensation = 0.0;
  void add(double x) {
    const double t = sum + x;
    if (!std::isfinite(t)) {  // overflow: the sum is inf, not inf - inf
      sum = t;
      compensation = 0.0;
      return;
    }
    compensation += std::abs(sum) >= std::abs(x) ? (sum - t) + x : (x - t) + sum;
    sum = t;
  }
  double value() const { return std::isfinite(sum) ? sum + compensation : sum; }
};

bool close(double a, double b, double rtol) {
  return std::abs(a - b) <= rtol * std::max(std::abs(a), std::abs(b));
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

// A collective group must be the same rank list on each of its members. `list_of(rank)` is
// that rank's list (null: the rank has none by that name). Lists are interned so a world-sized
// group costs one id comparison per member, not one list comparison.
template <class ListOf>
void check_group_consistent(const std::vector<const RankManifest*>& ranks, const std::string& what,
                            ListOf list_of) {
  std::map<std::vector<int>, int> ids;
  std::vector<int> id_of(ranks.size(), -1);
  for (const RankManifest* m : ranks)
    if (const std::vector<int>* mine = list_of(*m))
      id_of[static_cast<std::size_t>(m->rank)] = ids.emplace(*mine, static_cast<int>(ids.size())).first->second;
  for (const RankManifest* m : ranks) {
    const std::vector<int>* mine = list_of(*m);
    if (!mine) continue;
    for (int member : *mine) {
      if (id_of[static_cast<std::size_t>(member)] == id_of[static_cast<std::size_t>(m->rank)]) continue;
      const std::vector<int>* theirs = list_of(*ranks[static_cast<std::size_t>(member)]);
      if (!theirs)
        invalid(m->rank, what + " " + ranks_text(*mine) + " holds rank " + std::to_string(member) +
                             ", which has no " + what);
      invalid(m->rank, "inconsistent " + what + ": " + ranks_text(*mine) + " here, but rank " +
                           std::to_string(member) + " lists " + ranks_text(*theirs));
    }
  }
}

void check_groups(const std::vector<const RankManifest*>& ranks) {
  std::set<std::string> names;
  for (const RankManifest* m : ranks)
    for (const auto& [name, list] : m->groups) names.insert(name);
  for (const std::string& name : names)
    check_group_consistent(ranks, "group \"" + name + "\"",
                           [&name](const RankManifest& m) -> const std::vector<int>* {
                             auto it = m.groups.find(name);
                             return it == m.groups.end() ? nullptr : &it->second;
                           });
  const std::size_t children = ranks.front()->optimizers.size();
  for (std::size_t c = 0; c < children; ++c) {
    const std::string at = "optimizers[" + std::to_string(c) + "].";
    check_group_consistent(ranks, at + "stats_group", [c](const RankManifest& m) {
      return &m.optimizers[c].stats_group;
    });
    check_group_consistent(ranks, at + "tp_group",
                           [c](const RankManifest& m) -> const std::vector<int>* {
                             const auto& g = m.optimizers[c].tp_group;
                             return g ? &*g : nullptr;
                           });
    check_group_consistent(ranks, at + "expert_tp_group",
                           [c](const RankManifest& m) -> const std::vector<int>* {
                             const auto& g = m.optimizers[c].expert_tp_group;
                             return g ? &*g : nullptr;
                           });
  }
}

// ---- the logical model --------------------------------------------------------------------

struct Holder {
  int rank = 0;
  int param = 0;  // index into that rank's params
};

struct DistinctBox {
  std::vector<std::int64_t> offsets, extents;
  Holder first;  // the holder whose statistics stand for the box
  GradStats stats;
};

struct LogicalParam {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  Attributes attributes;  // of the first holder that is not a shared copy
  bool in_main_norm = true;
  std::vector<DistinctBox> boxes;
  std::vector<std::int64_t> cuts;  // atom boundaries in row-major logical indices: 0 .. numel
  std::int64_t first_atom = 0;     // into the run's atom index
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
                             shape_text(p.logical_shape) + " differs from " + shape_text(l.shape) +
                             " of rank " + std::to_string(l.boxes.front().first.rank));
      if (l.attributes.shared && !p.attributes.shared) l.attributes = p.attributes;
      else if (!p.attributes.shared && p.attributes.grad_norm_group != l.attributes.grad_norm_group)
        invalid(m->rank, param_at(*m, static_cast<int>(i)) + ": grad_norm_group differs from " +
                             "another holder's (every holder of a logical param is in one norm group)");
      const Holder here{m->rank, static_cast<int>(i)};
      bool placed = false;
      for (DistinctBox& box : l.boxes) {
        if (box.offsets == p.offsets && box.extents == p.extents) {
          const GradStats& s = box.stats;
          if (s.zeros != p.stats.zeros || s.abs_max != p.stats.abs_max ||
              !close(s.sum_squares, p.stats.sum_squares, kReplicaRtol))
            invalid(m->rank, param_at(*m, static_cast<int>(i)) +
                                 ": replicas disagree: sum_squares " +
                                 oracle::all_digits(p.stats.sum_squares) + ", abs_max " +
                                 oracle::all_digits(p.stats.abs_max) + ", zeros " +
                                 std::to_string(p.stats.zeros) + " here, but " +
                                 oracle::all_digits(s.sum_squares) + ", " + oracle::all_digits(s.abs_max) +
                                 ", " + std::to_string(s.zeros) + " on rank " +
                                 std::to_string(box.first.rank) + " for the same box offsets " +
                                 shape_text(p.offsets) + " extents " + shape_text(p.extents));
          placed = true;
          break;
        }
        if (boxes_intersect(box, p))
          invalid(m->rank, param_at(*m, static_cast<int>(i)) + ": the box offsets " +
                               shape_text(p.offsets) + " extents " + shape_text(p.extents) +
                               " overlaps rank " + std::to_string(box.first.rank) + "'s box offsets " +
                               shape_text(box.offsets) + " extents " + shape_text(box.extents) +
                               " partially (boxes of one logical param are identical or disjoint)");
      }
      if (!placed) l.boxes.push_back({p.offsets, p.extents, here, p.stats});
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
      throw ManifestError("logical param " + l.name + " " + shape_text(l.shape) + ": the ranks hold " +
                          std::to_string(held) + " of its " + std::to_string(l.numel) +
                          " elements; the truth needs every element held somewhere");
    l.in_main_norm = !l.attributes.grad_norm_group.has_value();
  }
  return model;
}

// Calls fn(lo, hi) for each maximal contiguous run [lo, hi) of row-major logical indices that
// the row-major range [begin, end) of `box` covers.
template <class Fn>
void for_each_interval(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& offsets,
                       const std::vector<std::int64_t>& extents, std::int64_t begin, std::int64_t end,
                       Fn fn) {
  const std::size_t dims = shape.size();
  std::vector<std::int64_t> stride(dims, 1);
  for (std::size_t d = dims; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  // The trailing dims the box spans fully, plus the first one it does not, are contiguous.
  std::size_t j = dims;  // dims [j, dims) are full
  while (j > 0 && extents[j - 1] == shape[j - 1]) --j;
  const std::size_t run_dim = j == 0 ? 0 : j - 1;  // the dim a run advances along last
  std::int64_t run_length = 1;
  for (std::size_t d = j == 0 ? 0 : run_dim; d < dims; ++d) run_length *= extents[d];
  std::vector<std::int64_t> coordinate(dims, 0);
  for (std::int64_t run = begin / run_length; run * run_length < end; ++run) {
    // The run's first element: `run` in mixed radix over the extents of the dims before run_dim.
    std::int64_t outer = run, start = 0;
    for (std::size_t d = run_dim; d-- > 0;) {
      start += (offsets[d] + outer % extents[d]) * stride[d];
      outer /= extents[d];
    }
    if (j != 0) start += offsets[run_dim] * stride[run_dim];
    const std::int64_t lo = std::max(begin, run * run_length) - run * run_length;
    const std::int64_t hi = std::min(end, (run + 1) * run_length) - run * run_length;
    fn(start + lo, start + hi);
  }
}

// ---- ledgers --------------------------------------------------------------------------------

// The two ledgers: which elements each rank's norm counts, and which its zero count counts.
enum class Ledger { norm, zeros };

bool keeps(const MainParam& piece, Ledger ledger) {
  return ledger == Ledger::norm ? piece.kept : piece.kept_zeros;
}

// How often a ledger must count an element of `param`: the zero count counts every param once,
// the main norm those outside a separate grad_norm_group.
int expected_times(const LogicalParam& param, Ledger ledger) {
  return ledger == Ledger::zeros || param.in_main_norm ? 1 : 0;
}

struct AtomRange {
  std::int64_t first = 0, last = 0;  // [first, last) in the run's atom index
  bool norm = false, zeros = false;  // kept for the norm, for the zero count
};

// The atoms (maximal runs of elements no piece boundary cuts) of every logical param, and the
// kept pieces of each rank's optimizers as atom ranges.
struct Atoms {
  std::int64_t count = 0;
  std::vector<std::int64_t> size;  // elements per atom
  std::vector<int> param_of;       // logical param per atom
  // kept[rank][child]: the atom ranges its kept pieces cover
  std::vector<std::vector<std::vector<AtomRange>>> kept;
};

Atoms cut_atoms(const std::vector<const RankManifest*>& ranks, std::vector<LogicalParam>& model,
                const std::vector<std::vector<int>>& index_of) {
  std::int64_t intervals = 0;
  auto pieces = [&](auto fn) {
    for (const RankManifest* m : ranks)
      for (std::size_t c = 0; c < m->optimizers.size(); ++c)
        for (const MainParam& p : m->optimizers[c].main_params) {
          const ModelParam& box = m->params[static_cast<std::size_t>(p.param)];
          const int logical = index_of[static_cast<std::size_t>(m->rank)][static_cast<std::size_t>(p.param)];
          fn(*m, c, p, box, model[static_cast<std::size_t>(logical)]);
        }
  };
  for (LogicalParam& l : model) l.cuts = {0, l.numel};
  pieces([&](const RankManifest& m, std::size_t, const MainParam& p, const ModelParam& box,
             LogicalParam& l) {
    for_each_interval(l.shape, box.offsets, box.extents, p.begin, p.end,
                      [&](std::int64_t lo, std::int64_t hi) {
                        if (++intervals > kMaxIntervals)
                          invalid(m.rank, "the pieces cut the logical params into more than " +
                                              std::to_string(kMaxIntervals) + " intervals");
                        l.cuts.push_back(lo);
                        l.cuts.push_back(hi);
                      });
  });
  Atoms atoms;
  for (std::size_t i = 0; i < model.size(); ++i) {
    LogicalParam& l = model[i];
    std::sort(l.cuts.begin(), l.cuts.end());
    l.cuts.erase(std::unique(l.cuts.begin(), l.cuts.end()), l.cuts.end());
    l.first_atom = atoms.count;
    for (std::size_t k = 0; k + 1 < l.cuts.size(); ++k) {
      atoms.size.push_back(l.cuts[k + 1] - l.cuts[k]);
      atoms.param_of.push_back(static_cast<int>(i));
    }
    atoms.count += static_cast<std::int64_t>(l.cuts.size()) - 1;
  }
  atoms.kept.assign(ranks.size(), std::vector<std::vector<AtomRange>>(ranks.front()->optimizers.size()));
  pieces([&](const RankManifest& m, std::size_t c, const MainParam& p, const ModelParam& box,
             LogicalParam& l) {
    if (!p.kept && !p.kept_zeros) return;
    for_each_interval(l.shape, box.offsets, box.extents, p.begin, p.end,
                      [&](std::int64_t lo, std::int64_t hi) {
                        const auto at = [&](std::int64_t x) {
                          return l.first_atom + (std::lower_bound(l.cuts.begin(), l.cuts.end(), x) - l.cuts.begin());
                        };
                        atoms.kept[static_cast<std::size_t>(m.rank)][c].push_back(
                            {at(lo), at(hi), p.kept, p.kept_zeros});
                      });
  });
  return atoms;
}

// What one child's reduction over one group adds up: per atom how often it is counted, and the
// kept statistics.
struct GroupSum {
  std::vector<int> counts;        // per atom, in the norm
  std::vector<int> zero_counts;   // per atom, in the zero count
  double sum_squares = 0.0;
  std::int64_t zeros = 0;
};

GroupSum sum_over_group(const std::vector<const RankManifest*>& ranks, const Atoms& atoms,
                        std::size_t child, const std::vector<int>& group) {
  GroupSum out;
  std::vector<int> difference(static_cast<std::size_t>(atoms.count) + 1, 0);
  std::vector<int> zero_difference(difference.size(), 0);
  CompensatedSum squares;
  for (int member : group) {
    for (const AtomRange& r : atoms.kept[static_cast<std::size_t>(member)][child]) {
      difference[static_cast<std::size_t>(r.first)] += r.norm;
      difference[static_cast<std::size_t>(r.last)] -= r.norm;
      zero_difference[static_cast<std::size_t>(r.first)] += r.zeros;
      zero_difference[static_cast<std::size_t>(r.last)] -= r.zeros;
    }
    for (const MainParam& p : ranks[static_cast<std::size_t>(member)]->optimizers[child].main_params) {
      if (p.kept) squares.add(p.stats.sum_squares);
      if (p.kept_zeros) out.zeros += p.stats.zeros;
    }
  }
  out.counts.resize(static_cast<std::size_t>(atoms.count));
  out.zero_counts.resize(out.counts.size());
  int running = 0, zero_running = 0;
  for (std::size_t a = 0; a < out.counts.size(); ++a) {
    out.counts[a] = running += difference[a];
    out.zero_counts[a] = zero_running += zero_difference[a];
  }
  out.sum_squares = squares.value();
  return out;
}

// ---- diagnosis ------------------------------------------------------------------------------

std::string group_role(const std::vector<int>& group, const RankManifest& holder) {
  const int position = static_cast<int>(std::lower_bound(group.begin(), group.end(), holder.rank) - group.begin());
  return ranks_text(group) + " (rank " + std::to_string(position) + " there)";
}

// Why the framework's filter kept or dropped a piece, from the attributes the filter saw and the
// groups the optimizer gave it.
std::string explain_piece(const MainParam& piece, const ModelParam& model_param,
                          const OptimizerRecord& optimizer, const RankManifest& holder,
                          Ledger ledger) {
  const Attributes& a = piece.attributes;
  const std::vector<int>& tp = holder.groups.at("tp");
  const std::vector<int>& expt_tp = holder.groups.at("expt_tp");
  std::string why;
  if (!model_param.attributes.allreduce && a.allreduce)
    why = "the main copy lost allreduce=False (treated as dense); ";
  if (a.shared) {
    why += "a shared copy";
  } else if (a.grad_norm_group) {
    why += "in grad_norm_group '" + *a.grad_norm_group + "'";
  } else if (a.tensor_model_parallel) {
    why += "a tensor_model_parallel shard";
  } else if (!a.allreduce) {
    if (optimizer.expert_tp_group) {
      const std::vector<int>& g = *optimizer.expert_tp_group;
      if (g == expt_tp)
        why += "replicated expert param, expert-TP group " + group_role(g, holder);
      else if (g == tp)
        why += "expert-topology param de-duplicated on a TP group " + group_role(g, holder) +
               ", not its expert-TP group " + ranks_text(expt_tp);
      else
        why += "expert-topology param de-duplicated on " + group_role(g, holder) +
               ", not its expert-TP group " + ranks_text(expt_tp);
    } else {
      const std::vector<int>& g = optimizer.tp_group ? *optimizer.tp_group : tp;
      why += "no expert-TP group: fell back to the TP group " + group_role(g, holder);
      if (g != expt_tp) why += ", not its expert-TP group " + ranks_text(expt_tp);
    }
  } else {
    if (optimizer.tp_group && *optimizer.tp_group != tp)
      why += "replicated, de-duplicated on " + group_role(*optimizer.tp_group, holder) +
             ", not its TP group " + ranks_text(tp);
    else
      why += std::string(optimizer.tp_group ? "replicated, TP group "
                                            : "replicated; no TP group given: fell back to the "
                                              "global TP group ") +
             group_role(tp, holder);
  }
  return why + (keeps(piece, ledger) ? ": kept" : ": dropped");
}

std::string class_text(const Attributes& a) {
  std::string out = a.allreduce ? "" : "expert-topology ";
  if (a.tensor_model_parallel) return out + "tensor-parallel shard (dim " + std::to_string(a.partition_dim) + ")";
  return out + (a.allreduce ? "replicated over TP" : "param replicated over ETP");
}

// A param some rank's ledger counts wrongly: those ranks, and the element counts of the first.
struct WrongLedger {
  std::vector<int> ranks;
  std::int64_t counted = 0;
  int least = 0, most = 0;  // the fewest and most times the first rank counts one element
};

// What the ledger says of a miscounted param: how often, on which ranks.
oracle::Miscount miscount(const LogicalParam& l, int logical, Ledger ledger, const WrongLedger& wrong) {
  oracle::Miscount m;
  m.param = logical;
  m.name = l.name;
  m.param_class = class_text(l.attributes) + (ledger == Ledger::zeros ? "; in the zero count" : "");
  if (wrong.least != wrong.most)  // a total can look right while elements are not
    m.param_class += "; its elements counted from " + std::to_string(wrong.least) + " to " +
                     std::to_string(wrong.most) + " times";
  m.expected = expected_times(l, ledger) * l.numel;
  m.numel = l.numel;
  m.counted = wrong.counted;
  m.observed_on = wrong.ranks.front();
  m.wrong_rank_count = static_cast<std::int64_t>(wrong.ranks.size());
  m.wrong_ranks.assign(wrong.ranks.begin(),
                       wrong.ranks.begin() + static_cast<std::ptrdiff_t>(std::min(wrong.ranks.size(), kMaxShownRanks)));
  return m;
}

// Adds to `m` why: the stats groups the first wrong rank reduced the param over, and for each
// member holding it the rule that kept or dropped its pieces.
void diagnose(const std::vector<const RankManifest*>& ranks,
              const std::vector<std::vector<int>>& index_of, int logical, Ledger ledger,
              oracle::Miscount& m) {
  const RankManifest& observer = *ranks[static_cast<std::size_t>(m.observed_on)];
  std::set<int> members;
  for (std::size_t c = 0; c < observer.optimizers.size(); ++c) {
    const OptimizerRecord& o = observer.optimizers[c];
    bool holds = false;
    for (int member : o.stats_group) {
      const RankManifest& s = *ranks[static_cast<std::size_t>(member)];
      for (const MainParam& p : s.optimizers[c].main_params)
        holds = holds || index_of[static_cast<std::size_t>(member)][static_cast<std::size_t>(p.param)] == logical;
    }
    if (!holds) continue;
    m.stats_group += (m.stats_group.empty() ? "" : "; ") + std::string("stats group ") +
                     ranks_text(o.stats_group) + " of " + o.name;
    members.insert(o.stats_group.begin(), o.stats_group.end());
  }
  if (m.stats_group.empty()) m.stats_group = "stats groups, where no optimizer holds it";
  std::vector<int> outside;
  for (const RankManifest* s : ranks) {
    const std::vector<int>& logical_of = index_of[static_cast<std::size_t>(s->rank)];
    oracle::Contribution k;
    k.rank = s->rank;
    std::string rule;
    for (std::size_t i = 0; i < s->params.size(); ++i)
      if (logical_of[i] == logical) {
        k.held += volume(s->params[i].extents);
        k.shared_copy = k.shared_copy || s->params[i].attributes.shared;
      }
    for (std::size_t c = 0; c < s->optimizers.size(); ++c)
      for (const MainParam& p : s->optimizers[c].main_params) {
        if (logical_of[static_cast<std::size_t>(p.param)] != logical) continue;
        k.owned += p.end - p.begin;
        if (keeps(p, ledger)) k.counted += p.end - p.begin;
        const std::string why = explain_piece(p, s->params[static_cast<std::size_t>(p.param)],
                                              s->optimizers[c], *s, ledger);
        if (rule.find(why) == std::string::npos) rule += (rule.empty() ? "" : "; ") + why;
      }
    if (k.held == 0 && k.owned == 0) continue;
    if (!members.count(s->rank)) {
      if (k.owned > 0) outside.push_back(s->rank);
      continue;
    }
    k.rule = rule.empty() ? "holds it, but none of its optimizers owns a piece (another rank's does, or none)" : rule;
    if (m.contributions.size() < kMaxShownRanks) m.contributions.push_back(std::move(k));
  }
  if (!outside.empty())
    m.stats_group += "; owned outside it by ranks " + ranks_text(outside);
}

// Ranks sharing one ledger (the same group for every child) are judged once.
std::map<int, WrongLedger> find_miscounts(
    const std::map<std::vector<const GroupSum*>, std::vector<int>>& ranks_by_ledger,
    const Atoms& atoms, const std::vector<LogicalParam>& model, Ledger ledger) {
  std::map<int, WrongLedger> wrong;
  for (const auto& [sums, holders] : ranks_by_ledger) {
    std::map<int, std::int64_t> counted;
    std::map<int, std::pair<int, int>> range;  // logical param -> least, most times
    std::set<int> wrong_here;
    for (std::int64_t a = 0; a < atoms.count; ++a) {
      int times = 0;
      for (const GroupSum* g : sums)
        times += (ledger == Ledger::norm ? g->counts : g->zero_counts)[static_cast<std::size_t>(a)];
      const int logical = atoms.param_of[static_cast<std::size_t>(a)];
      counted[logical] += times * atoms.size[static_cast<std::size_t>(a)];
      auto [it, first] = range.emplace(logical, std::pair{times, times});
      if (!first) it->second = {std::min(it->second.first, times), std::max(it->second.second, times)};
      if (times != expected_times(model[static_cast<std::size_t>(logical)], ledger))
        wrong_here.insert(logical);
    }
    for (int logical : wrong_here) {
      WrongLedger& w = wrong[logical];
      if (w.ranks.empty() || holders.front() < w.ranks.front()) {
        w.counted = counted[logical];
        std::tie(w.least, w.most) = range[logical];
      }
      w.ranks.insert(w.ranks.end(), holders.begin(), holders.end());
      std::sort(w.ranks.begin(), w.ranks.end());
    }
  }
  return wrong;
}

// ---- statistics -----------------------------------------------------------------------------

// The worst rank's value against its expectation.
oracle::StatisticCheck worst(const std::string& name, const std::vector<std::pair<int, std::pair<double, double>>>& values,
                             double rtol) {
  oracle::StatisticCheck check;
  check.name = name;
  double worst_ratio = -1.0;
  for (const auto& [rank, got_expected] : values) {
    const auto [got, expected] = got_expected;
    const double error = std::abs(got - expected);
    const double bound = rtol * std::abs(expected);
    const double ratio = bound > 0 ? error / bound : (error > 0 ? INFINITY : 0.0);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      check.got = got;
      check.expected = expected;
      check.error = error;
      check.bound = bound;
      check.rank = rank;
      check.ok = error <= bound;
    }
  }
  return check;
}

}  // namespace

CheckReport check_run(const std::vector<RankManifest>& manifests, const CheckOptions& options) {
  const std::vector<const RankManifest*> ranks = ranks_in_order(manifests);
  check_groups(ranks);
  std::vector<std::vector<int>> index_of;
  std::vector<LogicalParam> model = rebuild_logical_model(ranks, index_of);
  const Atoms atoms = cut_atoms(ranks, model, index_of);

  CheckReport report;
  const RankManifest& first = *ranks.front();
  report.producer = first.producer;
  report.world = first.world;
  report.parallel = first.parallel;
  report.logical_params = static_cast<std::int64_t>(model.size());
  for (const OptimizerRecord& o : first.optimizers)
    report.optimizers.push_back(o.name + ": stats group " + ranks_text(o.stats_group));

  // The truth: each logical element once, from one holder of each distinct box.
  CompensatedSum squares;
  for (const LogicalParam& l : model) {
    report.logical_elements += l.numel;
    for (const DistinctBox& b : l.boxes) {
      report.truth_zeros += b.stats.zeros;
      if (!l.in_main_norm) continue;
      squares.add(b.stats.sum_squares);
      report.truth_inf_norm = std::max(report.truth_inf_norm, b.stats.abs_max);
    }
  }
  report.truth_norm = std::sqrt(squares.value());

  // Each child's reduction per distinct group, shared by the ranks of that group.
  const std::size_t children = first.optimizers.size();
  std::vector<std::map<std::vector<int>, GroupSum>> sums(children);
  std::map<std::vector<const GroupSum*>, std::vector<int>> ranks_by_ledger;
  for (const RankManifest* m : ranks) {
    std::vector<const GroupSum*> mine;
    CompensatedSum implied;
    std::int64_t implied_zeros = 0;
    for (std::size_t c = 0; c < children; ++c) {
      const std::vector<int>& group = m->optimizers[c].stats_group;
      auto it = sums[c].find(group);
      if (it == sums[c].end()) it = sums[c].emplace(group, sum_over_group(ranks, atoms, c, group)).first;
      mine.push_back(&it->second);
      implied.add(it->second.sum_squares);
      implied_zeros += it->second.zeros;
    }
    ranks_by_ledger[mine].push_back(m->rank);
    report.ranks.push_back({m->rank, m->reported, std::sqrt(implied.value()), implied_zeros});
  }

  // The ledgers: every atom counted once (by the norm: zero times outside the main norm) on
  // every rank. The zero count's miscounts are listed after the norm's, for other params.
  oracle::Verdict& verdict = report.verdict;
  std::set<int> listed;
  for (Ledger ledger : {Ledger::norm, Ledger::zeros}) {
    for (auto& [logical, wrong] : find_miscounts(ranks_by_ledger, atoms, model, ledger)) {
      if (!listed.insert(logical).second) continue;
      ++verdict.miscounted_total;
      oracle::Miscount m = miscount(model[static_cast<std::size_t>(logical)], logical, ledger, wrong);
      if (static_cast<int>(verdict.miscounted.size()) < options.max_diagnosed_params)
        diagnose(ranks, index_of, logical, ledger, m);
      verdict.miscounted.push_back(std::move(m));
    }
  }

  // The statistics each rank reported.
  std::vector<std::pair<int, std::pair<double, double>>> l2, l2_ledger, inf, zeros, clip;
  for (const RankValues& v : report.ranks) {
    if (v.reported.norm) {
      l2.push_back({v.rank, {*v.reported.norm, report.truth_norm}});
      l2_ledger.push_back({v.rank, {*v.reported.norm, v.implied_norm}});
    }
    if (v.reported.inf_norm) inf.push_back({v.rank, {*v.reported.inf_norm, report.truth_inf_norm}});
    if (v.reported.zeros)
      zeros.push_back({v.rank, {static_cast<double>(*v.reported.zeros), static_cast<double>(report.truth_zeros)}});
    for (const OptimizerRecord& o : ranks[static_cast<std::size_t>(v.rank)]->optimizers)
      if (o.clip)
        clip.push_back({v.rank, {o.clip->coefficient,
                                 std::min(1.0, o.clip->max_norm / (report.truth_norm + 1e-6))}});
  }
  if (!l2.empty()) verdict.stats.push_back(worst("l2", l2, options.rtol));
  if (!l2_ledger.empty()) verdict.stats.push_back(worst("l2-ledger", l2_ledger, options.rtol));
  if (!inf.empty()) verdict.stats.push_back(worst("inf", inf, options.rtol));
  if (!zeros.empty()) verdict.stats.push_back(worst("zeros", zeros, 0.0));
  if (!clip.empty()) verdict.stats.push_back(worst("clip", clip, options.rtol));

  // Every rank reports the same values.
  const RankValues& r0 = report.ranks.front();
  for (const RankValues& v : report.ranks) {
    auto differ = [&](const char* what, const std::string& a, const std::string& b) {
      verdict.ranks_agree = false;
      verdict.disagreement = std::string(what) + ": rank " + std::to_string(r0.rank) + " reported " + a +
                             ", rank " + std::to_string(v.rank) + " " + b;
    };
    if (!verdict.ranks_agree) break;
    if (v.reported.norm.has_value() != r0.reported.norm.has_value() ||
        (v.reported.norm && !close(*v.reported.norm, *r0.reported.norm, options.rtol)))
      differ("norm", r0.reported.norm ? oracle::all_digits(*r0.reported.norm) : "none",
             v.reported.norm ? oracle::all_digits(*v.reported.norm) : "none");
    else if (v.reported.inf_norm.has_value() != r0.reported.inf_norm.has_value() ||
             (v.reported.inf_norm && !close(*v.reported.inf_norm, *r0.reported.inf_norm, options.rtol)))
      differ("inf norm", r0.reported.inf_norm ? oracle::all_digits(*r0.reported.inf_norm) : "none",
             v.reported.inf_norm ? oracle::all_digits(*v.reported.inf_norm) : "none");
    else if (v.reported.zeros != r0.reported.zeros)
      differ("zeros", r0.reported.zeros ? std::to_string(*r0.reported.zeros) : "none",
             v.reported.zeros ? std::to_string(*v.reported.zeros) : "none");
  }
  const bool stats_ok = std::all_of(verdict.stats.begin(), verdict.stats.end(),
                                    [](const oracle::StatisticCheck& s) { return s.ok; });
  verdict.kind = stats_ok && verdict.ranks_agree && verdict.miscounted_total == 0
                     ? oracle::Verdict::Kind::pass
                     : oracle::Verdict::Kind::fail;
  return report;
}

}  // namespace tally::manifest
