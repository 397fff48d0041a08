#include "fuzz/known.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <system_error>
#include <tuple>

#include "casefile/case_file.h"
#include "run/run_case.h"
#include "run/target.h"
#include "run/target_run.h"
#include "vocab/optimizer_models.h"

namespace tally::fuzz {

namespace fs = std::filesystem;

namespace {

// Whether a failed statistic is one a miscount makes: a norm (the main one, a group's, a p-norm), the
// inf norm, the zero count, the clip, the clipped values, the ledger and the ranks' agreement. Not:
// a rank reporting other than its own ledger implies ("l2-ledger", "zeros-ledger") or holding
// gradients other than tally's ("held-gradients"), which are defects of their own.
bool made_by_a_miscount(const std::string& statistic) {
  return !statistic.ends_with("-ledger") && statistic != "held-gradients";
}

std::vector<std::string> not_made_by_a_miscount(const oracle::Verdict& verdict) {
  std::vector<std::string> out;
  for (const std::string& statistic : run::failed_statistics(verdict))
    if (!made_by_a_miscount(statistic)) out.push_back(statistic);
  return out;
}

// The kind of param a miscount is of, as a cause sees it: what the miscounted params have in common
// across models (dense or MoE, sharded by FSDP or not).
std::string cause_kind(const oracle::Miscount& m) {
  std::string kind = m.kind.empty() ? m.param_class : m.kind;
  const bool expert = kind.starts_with("expert-topology ");
  if (expert) kind.erase(0, std::string_view("expert-topology ").size());
  // A manifest's kinds are its attributes: the TP dim a shard is split on, and whether an unmarked
  // param is held whole (a replica) or in pieces (an FSDP shard, a copy that lost its TP mark), say
  // nothing of the cause. To a filter an unmarked piece is a replica.
  if (kind.starts_with("tensor-parallel shard")) kind = "tensor-parallel shard";
  else if (kind == "shard not marked tensor_model_parallel" || kind == "replicated over TP" ||
           kind == "param replicated over ETP")
    kind = expert ? "replicated over ETP" : "replicated over TP";
  return (expert ? "expert " : "") + kind;
}

// A unit without its kind: what two runs of one case are compared by.
using UnitKey = std::tuple<std::string, std::string, Counted>;
UnitKey key_of(const MiscountUnit& u) { return {u.param, u.ledger, u.counted}; }

std::set<UnitKey> keys_of(const oracle::Verdict& verdict) {
  std::set<UnitKey> out;
  for (const MiscountUnit& u : miscount_units(verdict)) out.insert(key_of(u));
  return out;
}

// Every param's counts, for comparing a run with tally's model of its release.
using Counts = std::set<std::tuple<std::string, std::string, std::int64_t, std::int64_t>>;
Counts counts_of(const oracle::Verdict& verdict) {
  Counts out;
  for (const oracle::Miscount& m : verdict.miscounted) out.emplace(m.name, m.ledger, m.least, m.most);
  return out;
}

std::string counts_text(const oracle::Verdict& v) {
  if (v.kind != oracle::Verdict::Kind::fail) return std::string(oracle::kind_name(v.kind));
  std::string out = describe(failure_signature(v));
  if (v.miscounted_total > 0) {
    out += " (" + std::to_string(v.miscounted_total) + " params miscounted";
    for (std::size_t i = 0; i < v.miscounted.size() && i < 3; ++i)
      out += std::string(i == 0 ? ": " : ", ") + v.miscounted[i].name + (v.miscounted[i].ledger.empty() ? "" : " in the " + v.miscounted[i].ledger) +
             " counted " + std::to_string(v.miscounted[i].least) + " to " + std::to_string(v.miscounted[i].most) + " times";
    out += ")";
  }
  return out;
}

// What tally's model of the release says of a case it runs: its verdict with all the release's
// rules, and which units each cause gives alone.
struct ModeledCase {
  oracle::Verdict release;
  std::map<vocab::Fault, std::set<UnitKey>> by_fault;   // the release's faults, each alone
  std::map<vocab::Fault, FailureSignature> fault_signature;  // where a fault alone fails without a miscount
  std::map<LayoutCorner, std::set<UnitKey>> by_corner;  // each of Megatron-LM's layout corners it lies in, with no fault
};

std::optional<ModeledCase> modeled(const casefile::Case& c, std::string_view framework, std::string_view version) {
  // The case's own framework, or, for a case without its target section (a campaign's, before it
  // is saved), the findings' framework.
  const run::FrameworkTarget* row = run::framework_of(c);
  if (!row) row = run::framework_target(framework);
  if (!row || !row->release_model_case) return std::nullopt;
  const std::optional<casefile::Case> model = row->release_model_case(c, version);
  if (!model) return std::nullopt;
  const auto run_with = [&](const vocab::FaultSet& faults) -> std::optional<oracle::Verdict> {
    casefile::Case m = *model;
    m.path.faults = faults;
    try {
      return run::run_case(m);
    } catch (const casefile::InvalidCase&) {
      return std::nullopt;  // a case the release runs that tally's model does not build
    }
  };
  ModeledCase out;
  const std::optional<oracle::Verdict> release = run_with(model->path.faults);
  const std::optional<oracle::Verdict> planted = run_with(c.path.faults);
  if (!release || !planted) return std::nullopt;
  out.release = *release;
  const std::set<UnitKey> baseline = keys_of(*planted);
  for (const vocab::FaultInfo& info : vocab::fault_catalog()) {
    if (!model->path.faults.has(info.fault) || c.path.faults.has(info.fault)) continue;
    const std::optional<oracle::Verdict> alone = run_with(c.path.faults.with(info.fault));
    if (!alone) continue;
    std::set<UnitKey>& units = out.by_fault[info.fault];
    for (const UnitKey& k : keys_of(*alone))
      if (!baseline.contains(k)) units.insert(k);
    if (alone->kind == oracle::Verdict::Kind::fail && alone->miscounted_total == 0 &&
        planted->kind != oracle::Verdict::Kind::fail)
      out.fault_signature.emplace(info.fault, failure_signature(*alone));
  }
  // Megatron-LM's layout corners act with no fault. A case may lie in both: experts as dense do not
  // depend on the distributed-optimizer instances, so what one instance gives is theirs, and what
  // the instances add is the instances'.
  const bool experts_as_dense = experts_as_dense_with_other_groups(c.topology);
  const bool instances = instances_split_their_shards(c.topology);
  if (experts_as_dense || instances) {
    const std::optional<oracle::Verdict> groups = c.path.faults.empty() ? planted : run_with(vocab::FaultSet{});
    std::optional<oracle::Verdict> one_instance;
    if (instances) {
      casefile::Case m = *model;
      m.path.faults = {};
      m.topology.dist_opt_instances = 1;
      try {
        one_instance = run::run_case(m);
      } catch (const casefile::InvalidCase&) {
      }
    }
    if (groups) {
      const std::set<UnitKey> all = keys_of(*groups);
      const std::set<UnitKey> without_instances = instances && one_instance ? keys_of(*one_instance) : all;
      if (experts_as_dense) out.by_corner[LayoutCorner::experts_as_dense] = instances ? without_instances : all;
      if (instances)
        for (const UnitKey& k : all)
          if (!experts_as_dense || !without_instances.contains(k)) out.by_corner[LayoutCorner::instances_split_their_shards].insert(k);
    }
  }
  return out;
}

bool is_modeled(const KnownFinding& k) { return k.spec.fault || k.spec.layout_corner != LayoutCorner::none; }

// The units a modeled finding explains on a case tally's model runs.
const std::set<UnitKey>* modeled_units(const KnownFinding& k, const ModeledCase& m) {
  if (k.spec.fault) {
    auto it = m.by_fault.find(*k.spec.fault);
    return it == m.by_fault.end() ? nullptr : &it->second;
  }
  auto it = m.by_corner.find(k.spec.layout_corner);
  return it == m.by_corner.end() ? nullptr : &it->second;
}

bool in_own_layout(const KnownFinding& k, const casefile::Case& c) {
  return k.only_layout && *k.only_layout == c.topology && norm_code_in(known_path(c), k.spec.norm_codes);
}

}  // namespace

std::vector<MiscountUnit> miscount_units(const oracle::Verdict& verdict) {
  std::vector<MiscountUnit> out;
  for (const oracle::Miscount& m : verdict.miscounted) {
    // The times each element should be counted in the ledger that shows it: once, or none outside it.
    const std::int64_t times = m.numel > 0 ? m.expected / m.numel : 0;
    if (m.least < times) out.push_back({m.name, m.ledger, Counted::fewer, cause_kind(m), m.owned_outside});
    if (m.most > times) out.push_back({m.name, m.ledger, Counted::more, cause_kind(m), false});
  }
  return out;
}

std::string describe(const MiscountUnit& unit) {
  return unit.param + " (" + unit.kind + (unit.owned_outside ? ", " + std::string(kOwnedOutside) : "") + ") counted " +
         std::string(counted_name(unit.counted)) + " times in the " +
         (unit.ledger.empty() ? "norm" : unit.ledger == "zero count" ? "zero count" : "'" + unit.ledger + "' norm");
}

namespace {

// The shape a finding states for `unit`: its kind (or that its owners lie outside the stats
// group), how it is counted, and in which family of ledgers.
MiscountShape shape_of(const MiscountUnit& unit) {
  return {unit.owned_outside ? std::string(kOwnedOutside) : unit.kind, unit.counted,
          unit.ledger == "zero count" ? LedgerFamily::zero_count : LedgerFamily::norm};
}

}  // namespace

bool matches(const MiscountShape& shape, const MiscountUnit& unit) {
  if (shape.counted != unit.counted) return false;
  const bool by_group = shape.kind == kOwnedOutside && unit.owned_outside;
  if (shape.kind != "any" && shape.kind != unit.kind && !by_group) return false;
  const bool zeros = unit.ledger == "zero count";
  return shape.in == LedgerFamily::any || (shape.in == LedgerFamily::zero_count) == zeros;
}

std::string known_path(const casefile::Case& c) {
  if (const run::FrameworkTarget* row = run::framework_of(c)) return row->norm_code(c);
  return std::string(vocab::optimizer_model_name(c.path.optimizer));
}

std::function<bool(const casefile::Case&)> norm_code_filter(std::string prefix) {
  return [prefix = std::move(prefix)](const casefile::Case& c) { return norm_code_in(known_path(c), {prefix}); };
}

namespace {

std::vector<std::string> json_files_under(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code error;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, error), end;
  for (; !error && it != end; it.increment(error)) {
    std::error_code ignored;
    if (it->is_directory(ignored) && it->path().extension() == ".manifests") {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ignored) && it->path().extension() == ".json") files.push_back(it->path().string());
  }
  if (error) throw std::runtime_error("--known " + dir + ": cannot list the folder: " + error.message());
  std::sort(files.begin(), files.end());
  return files;
}

// A saved failing run of `framework` at `version`, judged again; nullopt for any other file.
struct Saved {
  casefile::Case c;
  oracle::Verdict verdict;
};
std::optional<Saved> saved_failing_run(const std::string& file, std::string_view framework, std::string_view version) {
  Saved s;
  try {
    s.c = casefile::load_case_file(file, run::case_frameworks());
  } catch (const std::exception&) {
    return std::nullopt;  // not a case file
  }
  if (!s.c.target || s.c.target->framework != framework || s.c.target->version != version) return std::nullopt;
  if (!s.c.expect || s.c.expect->outcome != casefile::Expectation::Outcome::fail || s.c.target->manifests.empty())
    return std::nullopt;
  s.verdict = run::judge_saved_run_of(s.c, (fs::path(file).parent_path() / s.c.target->manifests).string(),
                                      oracle::kFrameworkRtol);
  return s;
}

SavedRun saved_run_of(const std::string& file, const oracle::Verdict& verdict) {
  return {file, failure_signature(verdict), run::failed_statistics(verdict), verdict.miscounted_total > 0};
}

}  // namespace

std::vector<KnownFinding> load_known(const std::string& dir, std::string_view framework, std::string_view version) {
  const std::vector<std::string> files = json_files_under(dir);
  std::vector<KnownFinding> known;
  for (const std::string& file : files) {
    if (!file.ends_with(".finding.json")) continue;
    FindingFile spec = read_finding_file(file);
    if (spec.framework != framework || spec.version != version) continue;
    if (spec.fault && framework != "megatron-core")
      throw std::runtime_error(file + ": its cause is a fault of tally's model of megatron-core, and it is a finding of " +
                               std::string(framework));
    known.push_back({std::move(spec), {}, std::nullopt});
  }
  // Each saved run: a failure in its finding's stated corner, every way it miscounts stated by a
  // finding whose corner holds it (a run may show two findings at once).
  std::set<std::string> claimed;
  for (KnownFinding& k : known) {
    for (const std::string& run : k.spec.saved_runs) {
      const std::string path = (fs::path(k.spec.file).parent_path() / run).lexically_normal().string();
      const std::string where = k.spec.file + ": saved run " + run;
      const std::optional<Saved> saved = saved_failing_run(path, framework, version);
      if (!saved)
        throw std::runtime_error(where + " is not a failing case file of " + std::string(framework) + " " +
                                 std::string(version) + " with its manifests");
      if (saved->verdict.kind != oracle::Verdict::Kind::fail)
        throw std::runtime_error(where + ", judged again, gives " + std::string(oracle::kind_name(saved->verdict.kind)) +
                                 ", not a failure");
      if (!in_stated_corner(k.spec, saved->c))
        throw std::runtime_error(where + " (norm code " + known_path(saved->c) + ") lies outside the finding's stated corner");
      for (const MiscountUnit& u : miscount_units(saved->verdict)) {
        const bool stated = std::any_of(known.begin(), known.end(), [&](const KnownFinding& other) {
          return in_stated_corner(other.spec, saved->c) &&
                 std::any_of(other.spec.miscounts.begin(), other.spec.miscounts.end(),
                             [&](const MiscountShape& s) { return matches(s, u); });
        });
        if (!stated)
          throw std::runtime_error(where + " miscounts " + describe(u) + ", which no finding whose corner holds it states: " +
                                   shape_json(shape_of(u)));
      }
      k.runs.push_back(saved_run_of(path, saved->verdict));
      claimed.insert(path);
    }
  }
  for (const std::string& file : files) {
    if (file.ends_with(".finding.json") || claimed.contains(fs::path(file).lexically_normal().string())) continue;
    const std::optional<Saved> saved = saved_failing_run(file, framework, version);
    // A run with planted faults shows what the plant did, not the framework.
    if (!saved || saved->verdict.kind != oracle::Verdict::Kind::fail || !saved->c.path.faults.empty()) continue;
    KnownFinding k;
    k.spec.file = file;
    k.spec.name = fs::path(file).stem().string();
    k.spec.framework = framework;
    k.spec.version = version;
    k.spec.source = file;
    k.spec.norm_codes = {known_path(saved->c)};
    for (const MiscountUnit& u : miscount_units(saved->verdict)) {
      const MiscountShape shape = shape_of(u);
      if (std::find(k.spec.miscounts.begin(), k.spec.miscounts.end(), shape) == k.spec.miscounts.end())
        k.spec.miscounts.push_back(shape);
    }
    k.only_layout = saved->c.topology;
    k.runs.push_back(saved_run_of(file, saved->verdict));
    known.push_back(std::move(k));
  }
  return known;
}

Explanation explain(const std::vector<KnownFinding>& known, const casefile::Case& c, const oracle::Verdict& verdict) {
  Explanation out;
  if (verdict.kind != oracle::Verdict::Kind::fail) return out;
  const std::string code = known_path(c);
  const std::string version = c.target ? c.target->version : known.empty() ? "" : known.front().spec.version;
  const std::string framework = c.target ? c.target->framework : known.empty() ? "" : known.front().spec.framework;
  const bool any_modeled = std::any_of(known.begin(), known.end(), is_modeled);
  const std::optional<ModeledCase> model = any_modeled ? modeled(c, framework, version) : std::nullopt;
  // On a case tally's model runs, a modeled cause explains only a failure that is what the model of
  // the release gives.
  std::string model_disagrees;
  if (model && (model->release.kind != verdict.kind || counts_of(model->release) != counts_of(verdict)))
    model_disagrees = "tally's model of " + framework + " " + version +
                      " gives " + counts_text(model->release) + ", the run " + counts_text(verdict);
  // Which findings apply to the case, and what each explains.
  struct Applies {
    const KnownFinding* finding;
    const std::set<UnitKey>* modeled = nullptr;  // the units it explains, decided by the model
    bool stated = false;                         // its stated shapes decide
  };
  std::vector<Applies> applying;
  for (const KnownFinding& k : known) {
    if (k.only_layout) {
      if (in_own_layout(k, c)) applying.push_back({&k, nullptr, true});
      continue;
    }
    if (is_modeled(k) && model) {
      if (!model_disagrees.empty()) continue;
      const std::set<UnitKey>* units = modeled_units(k, *model);
      const bool signature = k.spec.fault && model->fault_signature.contains(*k.spec.fault);
      if ((units && !units->empty()) || signature) applying.push_back({&k, units, false});
      continue;
    }
    if (in_stated_corner(k.spec, c)) applying.push_back({&k, nullptr, true});
  }
  // What is to be explained: each way it miscounts, each failed statistic no miscount makes, and,
  // with neither, its signature; and which applying finding explains which.
  std::vector<std::string> items;
  std::vector<std::vector<bool>> explains;  // [finding][item]
  const auto add_item = [&](std::string what, auto&& by) {
    items.push_back(std::move(what));
    explains.resize(applying.size());
    for (std::size_t i = 0; i < applying.size(); ++i) explains[i].push_back(by(applying[i]));
  };
  const std::vector<MiscountUnit> units = miscount_units(verdict);
  for (const MiscountUnit& u : units)
    add_item(describe(u), [&](const Applies& a) {
      return a.stated ? std::any_of(a.finding->spec.miscounts.begin(), a.finding->spec.miscounts.end(),
                                    [&](const MiscountShape& s) { return matches(s, u); })
                      : a.modeled && a.modeled->contains(key_of(u));
    });
  // What no miscount makes: shown by a saved run of a finding that applies.
  const std::vector<std::string> statistics = not_made_by_a_miscount(verdict);
  for (const std::string& statistic : statistics)
    add_item(statistic + " failing", [&](const Applies& a) {
      return std::any_of(a.finding->runs.begin(), a.finding->runs.end(), [&](const SavedRun& r) {
        return std::find(r.failed.begin(), r.failed.end(), statistic) != r.failed.end();
      });
    });
  if (units.empty() && statistics.empty()) {
    const FailureSignature signature = failure_signature(verdict);
    add_item(describe(signature), [&](const Applies& a) {
      if (a.stated)
        return std::any_of(a.finding->runs.begin(), a.finding->runs.end(),
                           [&](const SavedRun& r) { return !r.miscounts && r.signature == signature; });
      const auto it = a.finding->spec.fault ? model->fault_signature.find(*a.finding->spec.fault) : model->fault_signature.end();
      return it != model->fault_signature.end() && it->second == signature;
    });
  }
  std::vector<std::string> unexplained;
  for (std::size_t item = 0; item < items.size(); ++item)
    if (std::none_of(explains.begin(), explains.end(), [&](const std::vector<bool>& e) { return e[item]; }))
      unexplained.push_back(items[item]);
  if (unexplained.empty()) {
    // Named by the fewest findings that explain it all, each taken where it explains the most left.
    std::vector<bool> covered(items.size(), false), named(applying.size(), false);
    for (std::size_t left = items.size(); left > 0;) {
      std::size_t best = 0, best_count = 0;
      for (std::size_t i = 0; i < applying.size(); ++i) {
        std::size_t count = 0;
        for (std::size_t item = 0; item < items.size(); ++item) count += !covered[item] && explains[i][item];
        if (count > best_count) best = i, best_count = count;
      }
      named[best] = true;
      for (std::size_t item = 0; item < items.size(); ++item)
        if (explains[best][item] && !covered[item]) covered[item] = true, --left;
    }
    for (std::size_t i = 0; i < applying.size(); ++i)
      if (named[i]) out.findings.push_back(applying[i].finding->name());
    return out;
  }
  std::string why;
  for (std::size_t i = 0; i < unexplained.size() && i < 3; ++i) why += (i == 0 ? "" : "; ") + unexplained[i];
  if (unexplained.size() > 3) why += "; and " + std::to_string(unexplained.size() - 3) + " more";
  why += applying.empty() ? "; no known finding of " + code + " has this case in its corner"
                          : "; no known finding whose corner holds this case (" + code + ") explains it";
  if (!model_disagrees.empty()) why += " (" + model_disagrees + ")";
  out.why_new = why;
  return out;
}

std::string megatron_layout_corner_finding(LayoutCorner corner) {
  if (corner == LayoutCorner::none) return "";
  return "megatron-layout-corner (" + std::string(layout_corner_name(corner)) + ")";
}

std::string known_finding_of(const std::vector<KnownFinding>& known, bool framework, const casefile::Case& c,
                             const oracle::Verdict& verdict) {
  if (!framework) return megatron_layout_corner_finding(megatron_layout_corner(c.topology));
  std::string out;
  for (const std::string& name : explain(known, c, verdict).findings) out += (out.empty() ? "" : " + ") + name;
  return out;
}

}  // namespace tally::fuzz
