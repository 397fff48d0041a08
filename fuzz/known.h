// Known findings: the failing cases of a framework's release saved with their manifests
// (seeds/real holds the written-up ones), so a campaign or a sweep counts a failure that repeats
// one as known, not new: a nightly that pages only for what is new.
//
// A finding is its cause, not one saved form of it: the framework and release, the code of the
// framework's norm it lies in (run::FrameworkTarget::norm_code: the optimizer model, Megatron-FSDP's
// strategy, DeepSpeed's optimizer), and how it miscounts: each kind of param it miscounts and
// whether it counts some of its elements fewer times than once (drops them) or more (repeats them),
// read from its saved run, judged again. A failure repeats it when it lies in the same norm code and
// every (kind, direction) it miscounts is a finding's, whatever else differs: the model (dense or
// MoE, the layer a param is in), the gradients, the world, the norm it was counted in (the main
// norm, a group norm such as MTP's, the zero count) and the statistics that show it (all-zero
// gradients show a dropped param in the zero count only, where the saved run showed it in the
// norm). The same kind miscounted the other way, or a kind no finding of that norm code miscounts, is
// another defect (two known defects of one norm code may show in one run); so is a failure of a
// statistic no miscount makes (a rank reporting other than its ledger implies, "*-ledger"; gradients
// other than tally's, "held-gradients") that no such finding's saved run failed. A failure without a miscount repeats a finding without one that fails the
// same statistic first (the failure signature, fuzz/shrink.h). A megatron-core finding whose own
// case lies in one of Megatron-LM's layout corners (megatron_layout_corner, fuzz/generators.h:
// experts as dense with ETP groups unlike the TP groups; distributed-optimizer instances whose stats
// groups split their shards) is a defect of the groups, not of a norm code: any norm code's failure
// in that same corner that miscounts the same way repeats it.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "casefile/case.h"
#include "fuzz/generators.h"
#include "fuzz/shrink.h"
#include "oracle/verdict.h"

namespace tally::fuzz {

// How a failure miscounts one kind of param (topologies' class name, "expert-row-bias"), wherever it
// was counted: whether some of its elements are counted fewer times than once (dropped) or more
// (repeated), on the rank whose ledger shows it.
struct Miscounting {
  std::string kind;
  bool dropped = false;
  bool repeated = false;
  friend auto operator<=>(const Miscounting&, const Miscounting&) = default;
};
std::set<Miscounting> miscountings(const oracle::Verdict& verdict);
std::string describe(const Miscounting& m);  // "expert-row-bias dropped"

struct KnownFinding {
  std::string file;         // the case file
  std::string name;         // its file name without the folder and ".json": how reports name it
  std::string path;         // the framework's norm code it fails in (known_path)
  FailureSignature signature;
  LayoutCorner corner = LayoutCorner::none;  // of a megatron-core finding: the layout corner its case lies in
  std::set<Miscounting> miscounts;  // of its saved run
  std::vector<std::string> failed;  // the statistics its saved run fails (run::failed_statistics)
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

// Why the failing `verdict` of `c` is new: what of it no finding of its norm code shows ("expert
// tensor-parallel shard repeated; no known finding of DeepSpeedZeroOptimizer miscounts it"); "" when
// it repeats one.
std::string why_new(const std::vector<KnownFinding>& known, const casefile::Case& c, const oracle::Verdict& verdict);

// The known finding a failure of `c` repeats, "" when it is new: on a real framework one of
// `known` (fuzz/known.h); on tally's model (`framework` false) Megatron-LM's own layout corners,
// where Megatron's rules miscount with no fault (megatron_layout_corner, fuzz/generators.h; written
// up in docs/findings/megatron-core-0.19.2-experts-as-dense-cp-before-tp.md and
// megatron-core-0.19.2-dist-opt-instances-split-their-shards.md), named "megatron-layout-corner (...)".
inline constexpr std::string_view kMegatronLayoutCorner = "megatron-layout-corner (experts as dense with ETP groups unlike TP groups)";
std::string megatron_layout_corner_finding(LayoutCorner corner);
std::string known_finding_of(const std::vector<KnownFinding>& known, bool framework, const casefile::Case& c,
                             const oracle::Verdict& verdict);

}  // namespace tally::fuzz
