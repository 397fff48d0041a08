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

// Whether every statistic `verdict` fails is one the counted params make (the norm, the zero
// count, the clip and the clipped values) and the ranks reported what their ledger implies (no
// "-ledger" check fails, the ranks agree, the held gradients are tally's): the miscount alone
// explains the failure.
bool miscount_explains(const oracle::Verdict& verdict) {
  if (verdict.miscounted_total == 0) return false;
  static constexpr std::string_view kMadeByTheCount[] = {"l2", "zeros", "clip", "clipped", "ledger"};
  const std::vector<std::string> failed = run::failed_statistics(verdict);
  return std::all_of(failed.begin(), failed.end(), [](const std::string& name) {
    return std::find(std::begin(kMadeByTheCount), std::end(kMadeByTheCount), name) != std::end(kMadeByTheCount);
  });
}

// A failure that its miscount explains is its miscounted params: which statistic shows them
// depends on the gradients (all-zero gradients show a dropped param only in the zero count, normal
// ones only in the norm). Any other failure is also the statistic it fails first. (Both are fails
// with a ledger where both are explained.)
bool same_defect(const KnownFinding& known, const FailureSignature& failure, bool explained) {
  if (known.miscount_explains && explained) return known.signature.miscounted_class == failure.miscounted_class;
  return known.signature == failure;
}

}  // namespace

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
                     miscount_explains(verdict)});
  }
  return known;
}

const KnownFinding* known_as(const std::vector<KnownFinding>& known, const casefile::Case& c,
                             const oracle::Verdict& verdict) {
  if (verdict.kind != oracle::Verdict::Kind::fail) return nullptr;
  const FailureSignature signature = failure_signature(verdict);
  const std::string path = known_path(c);
  const bool corner = experts_as_dense_with_other_groups(c.topology);
  const bool explained = miscount_explains(verdict);
  for (const KnownFinding& k : known)
    if ((k.path == path || (k.layout_corner && corner)) && same_defect(k, signature, explained)) return &k;
  return nullptr;
}

std::string known_finding_of(const std::vector<KnownFinding>& known, bool framework, const casefile::Case& c,
                             const oracle::Verdict& verdict) {
  if (!framework) return megatron_layout_assumptions_hold(c.topology) ? "" : std::string(kMegatronLayoutCorner);
  const KnownFinding* k = known_as(known, c, verdict);
  return k ? k->name : "";
}

}  // namespace tally::fuzz
