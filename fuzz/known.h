// Known findings: a nightly that pages only for what is new. A known finding is a defect's cause in
// a corner (fuzz/findings.h: a finding file next to its saved runs, seeds/real), not one saved form
// of it. A failure is known only when every way it miscounts is explained by a finding whose corner
// holds its case; a failure two findings explain together is known by both, and says so.
//
// The unit of explanation is one param miscounted one way in one ledger: some of its elements
// counted fewer times than they should be (dropped) or more (repeated), in the main norm, a group's
// norm (MTP's) or the zero count. Two causes can miscount one param, one each way.
//
// Where tally models the release (megatron-core's DDP path, gradnorm/releases.h), the model decides:
// the failure must be what tally's model of the release gives for its case (every param counted the
// same number of times, in every ledger), and each of its units is explained by the finding whose
// cause gives it alone: a fault of the release's rules, run with that fault alone, or one of
// Megatron-LM's layout corners, run with none. So a new defect inside a known corner is new, and a
// known cause is known in any form it takes there. Elsewhere (Megatron-FSDP, the layer-wise parameter
// layout, DeepSpeed, ...) the finding file's stated corner and miscounts decide. Failures a miscount
// does not make (a rank reporting other than its ledger implies, gradients other than tally's) are
// known only where a finding's saved run fails the same statistic; a failure without a miscount only
// where a saved run without one fails the same way (fuzz/shrink.h's signature).
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "casefile/case.h"
#include "fuzz/findings.h"
#include "fuzz/generators.h"
#include "fuzz/shrink.h"
#include "oracle/verdict.h"

namespace tally::fuzz {

// One way a failure miscounts one param.
struct MiscountUnit {
  std::string param;   // the logical param's name
  std::string ledger;  // "" the main norm, "zero count", or a group norm's name
  Counted counted = Counted::fewer;
  // What the param is, as a cause sees it: its kind across models and frameworks ("tensor-parallel
  // shard", "replicated over TP", "expert replicated over ETP").
  std::string kind;
  // Dropped elements that only ranks outside the stats group own: the group is a cause, whatever
  // the param (a finding stating the kind "owned outside its stats group" explains them).
  bool owned_outside = false;
  friend auto operator<=>(const MiscountUnit&, const MiscountUnit&) = default;
};
std::vector<MiscountUnit> miscount_units(const oracle::Verdict& verdict);
// "decoder.layers.0.mlp.linear_fc2.bias (replicated over TP) counted fewer times in the zero count"
std::string describe(const MiscountUnit& unit);
bool matches(const MiscountShape& shape, const MiscountUnit& unit);

// A saved run of a finding, judged again.
struct SavedRun {
  std::string file;
  FailureSignature signature;
  std::vector<std::string> failed;  // the statistics it fails (run::failed_statistics)
  bool miscounts = false;           // its ledger miscounts some param
};

struct KnownFinding {
  FindingFile spec;
  std::vector<SavedRun> runs;
  // A saved failing run that no finding file claims is a finding of its own layout only (this
  // configuration, its norm code), miscounting as it did.
  std::optional<topologies::ParallelConfig> only_layout;
  const std::string& name() const { return spec.name; }
};

// The norm code of `c`'s framework that a finding lies in ("layerwise", "BF16_Optimizer"); the
// optimizer model for a case of tally's model.
std::string known_path(const casefile::Case& c);

// Keeps the cases whose norm code (known_path) is `prefix` or starts with its words ("megatron-fsdp",
// "megatron-fsdp optim" but not its optim_grads, "layerwise"): `--norm-code`, for
// CaseGenOptions::keep_only.
std::function<bool(const casefile::Case&)> norm_code_filter(std::string prefix);

// The findings of `framework` at `version` under `dir` (recursively): every finding file of that
// release with its saved runs, each judged again, and each saved failing run (without planted
// faults) no finding file claims. Throws std::runtime_error, one line naming the file and the rule,
// when the folder cannot be read, a finding file is malformed, or a finding's saved run does not
// fail, lies outside its stated corner or miscounts in a way its file does not state.
std::vector<KnownFinding> load_known(const std::string& dir, std::string_view framework, std::string_view version);

// Which findings explain a failure of `c`, or why none can.
struct Explanation {
  std::vector<std::string> findings;  // each finding needed to explain it, in the order of `known`; empty: new
  std::string why_new;                // "" when known
};
Explanation explain(const std::vector<KnownFinding>& known, const casefile::Case& c, const oracle::Verdict& verdict);

// The known findings a failure of `c` repeats, joined by " + ", "" when it is new: on a real
// framework from `known`; on tally's model (`framework` false) Megatron-LM's own layout corners,
// where Megatron's rules miscount with no fault (megatron_layout_corner, fuzz/generators.h; written
// up in docs/findings/megatron-core-0.19.2-experts-as-dense-cp-before-tp.md and
// megatron-core-0.19.2-dist-opt-instances-split-their-shards.md), named "megatron-layout-corner (...)".
inline constexpr std::string_view kMegatronLayoutCorner = "megatron-layout-corner (experts as dense with ETP groups unlike TP groups)";
std::string megatron_layout_corner_finding(LayoutCorner corner);
std::string known_finding_of(const std::vector<KnownFinding>& known, bool framework, const casefile::Case& c,
                             const oracle::Verdict& verdict);

}  // namespace tally::fuzz
