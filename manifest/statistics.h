// The statistics a run's manifests may hold (docs/manifest.md, "What tally check does"). The
// judge reads them twice: a param's, over its box, as the truth, and the owned pieces', as what
// each rank's ledger implies. Statistics that no gradient can have, or two pieces of the same
// elements that disagree, leave no truth to judge against: the run is rejected, never judged.
//
// Possible: finite and >= 0, zeros <= elements, all elements zero exactly when abs_max is 0 (then
// sum_squares is 0 too), and abs_max^2 <= sum_squares <= (elements - zeros) abs_max^2.
//
// Agreeing, for the pieces of one box of a logical param (a param is its whole box, a main param
// a row-major range of it; replicas on any rank hold the same box): pieces of the same elements
// have equal statistics; a part of a box holds at most what the box holds (zeros, sum_squares,
// abs_max) and at least the box's zeros that the rest of the box cannot hold; and zeros and
// sums of squares add up: ranges that tile a range sum to it, so every part the pieces imply
// (the box less a range, the overlap of two ranges) holds 0 .. all of its elements' zeros and a
// sum of squares >= 0. abs_max and zeros compare exactly; sums of squares within kRoundingRtol.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "manifest/manifest.h"

namespace tally::manifest {

// Two fp64 sums of squares of the same elements in different orders differ by far less than
// this, relatively: (n - 1) 2^-53 < 1e-9 for n < 9 10^6 summed naively; torch sums pairwise.
inline constexpr double kRoundingRtol = 1e-9;

// The rule `stats` of `elements` gradient elements break, with their values ("zeros 9 in 8
// elements"); "" when some gradient has them.
std::string impossible_statistics(const GradStats& stats, std::int64_t elements);

// Checks every piece of a run against the rules above. `ranks` in rank order, already validated
// as to_record does (manifest/to_record.h): `logical_of[rank][i]` is the logical param of
// params[i], boxes of one logical param identical or disjoint, ranges inside their box. Throws
// ManifestError (manifest/manifest_json.h): one line naming each piece it compares (file,
// field, param name, range) and the rule. `agreement` false: each piece possible, no more (a run
// of a case, whose every statistic the judge holds to the case's gradients: run/target_run.h).
void check_statistics(const std::vector<const RankManifest*>& ranks,
                      const std::vector<std::vector<int>>& logical_of, bool agreement = true);

}  // namespace tally::manifest
