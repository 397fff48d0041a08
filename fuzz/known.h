// Known findings: the failing cases of a framework's release saved with their manifests
// (seeds/real holds the written-up ones), so a campaign or a sweep counts a failure that repeats
// one as known, not new: a nightly that pages only for what is new.
//
// A failure repeats a known finding when it is of the same framework and release, on the same
// code of the framework's norm (run::FrameworkTarget::norm_code: the optimizer model; DeepSpeed's
// norm code), and fails the same way (the same failure signature, fuzz/shrink.h), the known
// finding's signature being that of its saved run, judged again. Where the miscount alone explains
// both failures (each fails only the norm, the zero count, the clip or the clipped values, and
// every rank reported what its ledger implies), the same miscounted class is the same defect
// whichever statistic shows it: all-zero gradients show a dropped param in the zero count only,
// where the finding's saved run showed it in the norm. A megatron-core finding whose own
// case lies in Megatron-LM's experts-as-dense corner (experts_as_dense_with_other_groups: ETP
// groups unlike the TP groups) is a defect of the groups, not of a norm code: any norm code's
// failure in that corner that fails the same way repeats it.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "casefile/case.h"
#include "fuzz/shrink.h"
#include "oracle/verdict.h"

namespace tally::fuzz {

struct KnownFinding {
  std::string file;         // the case file
  std::string name;         // its file name without the folder and ".json": how reports name it
  std::string path;         // the framework's norm code it fails in (known_path)
  FailureSignature signature;
  bool layout_corner = false;  // a megatron-core finding in the experts-as-dense corner
  bool miscount_explains = false;  // its saved run fails only what its miscounted params make
};

// The norm code of `c`'s framework that a finding is tied to ("layerwise", "BF16_Optimizer"); the
// optimizer model for a case of tally's model.
std::string known_path(const casefile::Case& c);

// Keeps the cases whose norm code (known_path) is `prefix` or starts with its words ("megatron-fsdp",
// "megatron-fsdp optim" but not its optim_grads, "layerwise"): `--norm-code`, for
// CaseGenOptions::keep_only.
std::function<bool(const casefile::Case&)> norm_code_filter(std::string prefix);

// The findings of `framework` at `version` under `dir` (recursively): case files of that target
// whose expectation is a failure and whose saved manifests, judged again, fail. Throws
// std::runtime_error naming the folder when it cannot be read.
std::vector<KnownFinding> load_known(const std::string& dir, std::string_view framework, std::string_view version);

// The finding among `known` that the failing `verdict` of `c` repeats; nullptr when it is new.
const KnownFinding* known_as(const std::vector<KnownFinding>& known, const casefile::Case& c,
                             const oracle::Verdict& verdict);

// The known finding a failure of `c` repeats, "" when it is new: on a real framework one of
// `known` (fuzz/known.h); on tally's model (`framework` false) Megatron-LM's own layout corner,
// where Megatron's rules miscount with no fault (megatron_layout_assumptions_hold,
// fuzz/generators.h; written up in docs/findings/megatron-core-0.19.2-experts-as-dense-cp-before-tp.md).
inline constexpr std::string_view kMegatronLayoutCorner = "megatron-layout-corner (experts as dense with ETP groups unlike TP groups)";
std::string known_finding_of(const std::vector<KnownFinding>& known, bool framework, const casefile::Case& c,
                             const oracle::Verdict& verdict);

}  // namespace tally::fuzz
