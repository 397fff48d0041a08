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

// Whether `known` shows `statistic` failing.
bool fails(const KnownFinding& known, const std::string& statistic) {
  return std::find(known.failed.begin(), known.failed.end(), statistic) != known.failed.end();
}

// The finding among `candidates` (the findings of the failure's norm code) that `failure` repeats,
// when every miscounting and every other failed statistic of it is some candidate's (two known
// defects of one code may show in one run): the one that shows most of its miscountings; nullptr
// when it is new.
const KnownFinding* repeated_finding(const std::vector<const KnownFinding*>& candidates, const FailureShape& failure) {
  if (failure.miscounts.empty()) {
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
    if (!shown_by_one([&](const KnownFinding& k) { return !k.miscounts.empty() && fails(k, statistic); })) return nullptr;
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

std::set<Miscounting> miscountings(const oracle::Verdict& verdict) {
  std::set<Miscounting> out;
  for (const oracle::Miscount& m : verdict.miscounted) {
    // The times each element should be counted in the ledger that shows it: once, or none outside it.
    const std::int64_t times = m.numel > 0 ? m.expected / m.numel : 0;
    out.insert({m.kind.empty() ? m.param_class : m.kind, m.least < times, m.most > times});
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
    const oracle::Verdict verdict = run::judge_target_run(
        c, (fs::path(file).parent_path() / c.target->manifests).string(), oracle::kFrameworkRtol);
    if (verdict.kind != oracle::Verdict::Kind::fail) continue;
    known.push_back({file, fs::path(file).stem().string(), known_path(c), failure_signature(verdict),
                     framework == "megatron-core" && experts_as_dense_with_other_groups(c.topology),
                     miscountings(verdict), run::failed_statistics(verdict)});
  }
  return known;
}

const KnownFinding* known_as(const std::vector<KnownFinding>& known, const casefile::Case& c,
                             const oracle::Verdict& verdict) {
  if (verdict.kind != oracle::Verdict::Kind::fail) return nullptr;
  const std::string path = known_path(c);
  const bool corner = experts_as_dense_with_other_groups(c.topology);
  std::vector<const KnownFinding*> candidates;
  for (const KnownFinding& k : known)
    if (k.path == path || (k.layout_corner && corner)) candidates.push_back(&k);
  return repeated_finding(candidates, shape_of(verdict));
}

std::string known_finding_of(const std::vector<KnownFinding>& known, bool framework, const casefile::Case& c,
                             const oracle::Verdict& verdict) {
  if (!framework) return megatron_layout_assumptions_hold(c.topology) ? "" : std::string(kMegatronLayoutCorner);
  const KnownFinding* k = known_as(known, c, verdict);
  return k ? k->name : "";
}

}  // namespace tally::fuzz
