#include "fuzz/known.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "casefile/case_file.h"
#include "fuzz/generators.h"
#include "run/target.h"
#include "run/run_case.h"
#include "run/target_run.h"
#include "vocab/optimizer_models.h"

namespace tally::fuzz {

namespace fs = std::filesystem;

namespace {

// The kind of param a miscount is of, as a cause: what the miscounted params have in common
// across models (dense or MoE, sharded by FSDP or not).
std::string cause_kind(const oracle::Miscount& m, bool only_dropped);

// Whether a failed statistic is one a miscount makes: a norm (the main one, a group's, a p-norm), the
// inf norm, the zero count, the clip, the clipped values, the ledger and the ranks' agreement. Not:
// a rank reporting other than its own ledger implies ("l2-ledger", "zeros-ledger") or holding
// gradients other than tally's ("held-gradients"), which are defects of their own.
bool made_by_a_miscount(const std::string& statistic) {
  return !statistic.ends_with("-ledger") && statistic != "held-gradients";
}

// What a failure is, for matching: how it miscounts, the statistics it fails that no miscount makes,
// and its signature.
struct FailureShape {
  std::set<Miscounting> miscounts;
  std::vector<std::string> unexplained;
  FailureSignature signature;
};

FailureShape shape_of(const oracle::Verdict& verdict) {
  FailureShape f{miscountings(verdict), {}, failure_signature(verdict)};
  for (const std::string& statistic : run::failed_statistics(verdict))
    if (!made_by_a_miscount(statistic)) f.unexplained.push_back(statistic);
  return f;
}

// The findings whose norm code is `path` (the code of `c`) or a code `path` refines by more words
// ("DeepSpeedZeroOptimizer" for "DeepSpeedZeroOptimizer CPU offload", "megatron-fsdp optim_grads_params"
// for "... outer optim": the same function with more around it), and, in Megatron-LM's
// layout corners, the findings of that corner.
std::vector<const KnownFinding*> findings_of_code(const std::vector<KnownFinding>& known, const casefile::Case& c,
                                                  const std::string& path) {
  const LayoutCorner corner = megatron_layout_corner(c.topology);
  std::vector<const KnownFinding*> out;
  for (const KnownFinding& k : known)
    if (k.path == path || path.starts_with(k.path + " ") || (k.corner != LayoutCorner::none && k.corner == corner))
      out.push_back(&k);
  return out;
}

// Whether `known` shows `statistic` failing.
bool fails(const KnownFinding& known, const std::string& statistic) {
  return std::find(known.failed.begin(), known.failed.end(), statistic) != known.failed.end();
}

// The finding among `candidates` (the findings of the failure's norm code) that `failure` repeats,
// when every miscounting and every other failed statistic of it is some candidate's (two known
// defects of one code may show in one run): the one that shows most of its miscountings; nullptr
// when it is new.
const KnownFinding* repeated_finding(const std::vector<const KnownFinding*>& candidates, const FailureShape& failure) {
  // Without a miscount, a failure is what it fails that no miscount makes (a rank reporting other
  // than its ledger implies); with none of that either, its signature.
  if (failure.miscounts.empty() && failure.unexplained.empty()) {
    for (const KnownFinding* k : candidates)
      if (k->miscounts.empty() && k->signature == failure.signature) return k;
    return nullptr;
  }
  const auto shown_by_one = [&](auto&& shows) {
    return std::any_of(candidates.begin(), candidates.end(), [&](const KnownFinding* k) { return shows(*k); });
  };
  for (const Miscounting& m : failure.miscounts)
    if (!shown_by_one([&](const KnownFinding& k) { return k.miscounts.contains(m); })) return nullptr;
  for (const std::string& statistic : failure.unexplained)
    if (!shown_by_one([&](const KnownFinding& k) { return fails(k, statistic); })) return nullptr;
  if (failure.miscounts.empty()) {  // known by the statistics no miscount makes
    for (const KnownFinding* k : candidates)
      if (std::all_of(failure.unexplained.begin(), failure.unexplained.end(), [&](const std::string& s) { return fails(*k, s); }))
        return k;
    for (const KnownFinding* k : candidates)
      if (fails(*k, failure.unexplained.front())) return k;
  }
  const KnownFinding* best = nullptr;
  std::size_t best_shown = 0;
  for (const KnownFinding* k : candidates) {
    const auto shown = static_cast<std::size_t>(std::count_if(
        failure.miscounts.begin(), failure.miscounts.end(), [&](const Miscounting& m) { return k->miscounts.contains(m); }));
    if (shown > best_shown) best = k, best_shown = shown;
  }
  return best;
}

}  // namespace

namespace {
std::string cause_kind(const oracle::Miscount& m, bool only_dropped) {
  // Only dropped, because only ranks outside the stats group own it: whatever the param, the group
  // is the cause (an instance that counts only its own shards).
  if (only_dropped && m.owned_outside) return "owned outside its stats group";
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
}  // namespace

std::set<Miscounting> miscountings(const oracle::Verdict& verdict) {
  std::set<Miscounting> out;
  for (const oracle::Miscount& m : verdict.miscounted) {
    // The times each element should be counted in the ledger that shows it: once, or none outside it.
    const std::int64_t times = m.numel > 0 ? m.expected / m.numel : 0;
    const bool dropped = m.least < times, repeated = m.most > times;
    out.insert({cause_kind(m, dropped && !repeated), dropped, repeated});
  }
  return out;
}

std::string describe(const Miscounting& m) {
  return m.kind + (m.dropped && m.repeated ? " dropped and repeated" : m.dropped ? " dropped" : " repeated");
}

std::string known_path(const casefile::Case& c) {
  if (const run::FrameworkTarget* row = run::framework_of(c)) return row->norm_code(c);
  return std::string(vocab::optimizer_model_name(c.path.optimizer));
}

std::function<bool(const casefile::Case&)> norm_code_filter(std::string prefix) {
  // Whole words: "megatron-fsdp optim" is not "megatron-fsdp optim_grads".
  return [prefix = std::move(prefix)](const casefile::Case& c) {
    const std::string code = known_path(c);
    return code == prefix || code.starts_with(prefix + " ");
  };
}

std::vector<KnownFinding> load_known(const std::string& dir, std::string_view framework, std::string_view version) {
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
  std::vector<KnownFinding> known;
  for (const std::string& file : files) {
    casefile::Case c;
    try {
      c = casefile::load_case_file(file);
    } catch (const std::exception&) {
      continue;  // not a case file
    }
    if (!c.target || c.target->framework != framework || c.target->version != version) continue;
    if (!c.expect || c.expect->outcome != casefile::Expectation::Outcome::fail || c.target->manifests.empty()) continue;
    const oracle::Verdict verdict = run::judge_saved_run_of(
        c, (fs::path(file).parent_path() / c.target->manifests).string(), oracle::kFrameworkRtol);
    if (verdict.kind != oracle::Verdict::Kind::fail) continue;
    known.push_back({file, fs::path(file).stem().string(), known_path(c), failure_signature(verdict),
                     framework == "megatron-core" ? megatron_layout_corner(c.topology) : LayoutCorner::none,
                     miscountings(verdict), run::failed_statistics(verdict)});
  }
  return known;
}

const KnownFinding* known_as(const std::vector<KnownFinding>& known, const casefile::Case& c,
                             const oracle::Verdict& verdict) {
  if (verdict.kind != oracle::Verdict::Kind::fail) return nullptr;
  const std::string path = known_path(c);
  const std::vector<const KnownFinding*> candidates = findings_of_code(known, c, path);
  return repeated_finding(candidates, shape_of(verdict));
}

std::string why_new(const std::vector<KnownFinding>& known, const casefile::Case& c, const oracle::Verdict& verdict) {
  if (verdict.kind != oracle::Verdict::Kind::fail || known_as(known, c, verdict)) return "";
  const std::string path = known_path(c);
  const std::vector<const KnownFinding*> candidates = findings_of_code(known, c, path);
  const FailureShape failure = shape_of(verdict);
  std::string unknown;
  for (const Miscounting& m : failure.miscounts)
    if (std::none_of(candidates.begin(), candidates.end(), [&](const KnownFinding* k) { return k->miscounts.contains(m); }))
      unknown += (unknown.empty() ? "" : ", ") + describe(m);
  for (const std::string& statistic : failure.unexplained)
    if (std::none_of(candidates.begin(), candidates.end(), [&](const KnownFinding* k) { return fails(*k, statistic); }))
      unknown += (unknown.empty() ? "" : ", ") + statistic + " failing";
  if (failure.miscounts.empty() && unknown.empty()) unknown = describe(failure.signature);
  return unknown + "; no known finding of " + path + (candidates.empty() ? " at all" : "") + " shows it";
}

std::string megatron_layout_corner_finding(LayoutCorner corner) {
  if (corner == LayoutCorner::none) return "";
  return "megatron-layout-corner (" + std::string(layout_corner_name(corner)) + ")";
}

std::string known_finding_of(const std::vector<KnownFinding>& known, bool framework, const casefile::Case& c,
                             const oracle::Verdict& verdict) {
  if (!framework) return megatron_layout_corner_finding(megatron_layout_corner(c.topology));
  const KnownFinding* k = known_as(known, c, verdict);
  return k ? k->name : "";
}

}  // namespace tally::fuzz
