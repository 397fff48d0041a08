// The diagnosis of a miscounted tensor: in which stats groups the rank that saw it first reduced
// it, and for every member holding it, how much it held, owned and counted, and the rule that
// kept or dropped each of its pieces, in the words of the framework's own filter.
#pragma once

#include <string>

#include "oracle/ledger.h"
#include "oracle/verdict.h"
#include "record/run_record.h"

namespace tally::oracle {

// Why the filter kept or dropped `piece` of `rank`, and whether `ledger` counts it: e.g.
// "no expert-TP group: fell back to the TP group [0,1] (rank 1 there), not its expert-TP group
// [1]: dropped".
std::string rule_text(const record::RunRecord& run, const record::RankRecord& rank,
                      const record::Piece& piece, int ledger);

// The miscount `wrong` describes, without the why (name, kind, counts, ranks, whether some of it is
// owned outside the observing rank's stats groups).
Miscount miscount_of(const record::RunRecord& run, const WrongCount& wrong);

// Adds the why to `m`: its stats groups on the rank that saw it first, and every member's
// contribution (at most kMaxContributions).
void diagnose(const record::RunRecord& run, int ledger, Miscount& m);

inline constexpr std::size_t kMaxContributions = 32;
inline constexpr std::size_t kMaxListedRanks = 16;

}  // namespace tally::oracle
