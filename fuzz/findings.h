// A finding file (docs/case-files.md, "Finding files"): one defect of one framework release, as
// data next to its saved runs: where its cause acts (its corner) and how it miscounts there, so a
// night's failure is known only where the defect can be, and only in the ways it counts.
//
// Where tally models the cause (a fault of its model of the release, gradnorm/releases.h, or one
// of Megatron-LM's layout corners, fuzz/generators.h), the file names it and that model decides,
// on every case it runs, whether the cause acts and which params it miscounts (fuzz/known.h); the
// stated corner and miscounts speak for the cases the model does not run (Megatron-FSDP, the
// layer-wise parameter layout, another framework).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "casefile/case.h"
#include "fuzz/generators.h"
#include "vocab/faults.h"

namespace tally::fuzz {

// Whether some elements of a param are counted fewer times than they should be (dropped) or more
// (repeated).
enum class Counted : std::uint8_t { fewer, more };
std::string_view counted_name(Counted counted);  // "fewer" | "more"

// Where a miscount shows: a norm (the main one or a group's, such as MTP's), the zero count, or
// either.
enum class LedgerFamily : std::uint8_t { norm, zero_count, any };
std::string_view ledger_family_name(LedgerFamily family);  // "norm" | "zero count" | "any"

// One way a cause miscounts: a kind of param (fuzz/known.h's cause_kind: "expert replicated over
// ETP"; "any"; or kOwnedOutside, elements dropped that only ranks outside the stats group own,
// whatever the param), counted fewer or more times, in a ledger family.
inline constexpr std::string_view kOwnedOutside = "owned outside its stats group";
struct MiscountShape {
  std::string kind;
  Counted counted = Counted::fewer;
  LedgerFamily in = LedgerFamily::any;
  friend bool operator==(const MiscountShape&, const MiscountShape&) = default;
};
// {"kind": "...", "counted": "fewer", "in": "norm"}: the form a finding file states it in.
std::string shape_json(const MiscountShape& shape);

// One condition of a corner, as written ("tp > 1", "ep * etp < tp", "expert biases", "not tied
// output"): sizes of the configuration compared, or a feature of the model or the gradients.
struct Condition {
  std::string text;
  // A comparison: each side a product of sizes (names of kSizeNames) and whole numbers.
  std::vector<std::string> left, right;
  std::string op;  // "<", "<=", "==", "!=", ">=", ">"; "" for a feature
  std::string feature;  // one of kFeatureNames
  bool negated = false;  // "not <feature>"
};
inline constexpr std::string_view kSizeNames[] = {"world", "tp", "cp", "pp", "ep", "etp", "gtp", "egtp",
                                                  "vpp", "dp", "dp_cp", "edp", "instances"};
inline constexpr std::string_view kFeatureNames[] = {"experts", "expert biases", "shared expert", "tied output",
                                                     "mtp", "attention sinks", "fp32", "bf16", "fp16",
                                                     "clipping", "default order"};
// Throws std::invalid_argument (one line: the text and the rule) when `text` is not a condition.
Condition parse_condition(const std::string& text);
bool holds(const Condition& condition, const casefile::Case& c);

struct FindingFile {
  std::string file;  // its path
  std::string name;  // its file name without ".finding.json": how reports name the finding
  std::string framework, version;
  std::string source;  // the write-up (docs/findings/...) or the public report it is
  // The cause, where tally models it: a fault of its model of the release, or a layout corner.
  std::optional<vocab::Fault> fault;
  LayoutCorner layout_corner = LayoutCorner::none;
  // The corner as stated: the norm codes (a case's code is one of them or starts with its words)
  // and every condition.
  std::vector<std::string> norm_codes;
  std::vector<Condition> needs;
  std::vector<MiscountShape> miscounts;  // as stated: the ways it miscounts in its corner
  std::vector<std::string> saved_runs;   // case files, relative to the finding file's folder
};

// Reads a finding file strictly. Throws std::runtime_error, one line naming the file, the field and
// the rule.
FindingFile read_finding_file(const std::string& file);

// The short names of the layout corners in finding files: "experts-as-dense",
// "instances-split-their-shards".
std::string_view layout_corner_id(LayoutCorner corner);

// Whether `code` (a case's norm code, fuzz/known.h's known_path) is one of `codes` or starts with
// one's words ("megatron-fsdp optim_grads" is "megatron-fsdp"'s, not "megatron-fsdp optim"'s).
bool norm_code_in(const std::string& code, const std::vector<std::string>& codes);

// Whether `c` lies in the stated corner of `f`: its norm code, every condition, and its layout
// corner where the cause is one.
bool in_stated_corner(const FindingFile& f, const casefile::Case& c);

}  // namespace tally::fuzz
