// The known matcher measured in both directions (issue 64), on megatron-core releases tally models:
// a stand-in framework (tally's model writing the manifests a worker would, judged as the
// framework's run) runs generated cases of one world,
// - as the release itself (tally's model of its rules): every failure must be known;
// - as the release with one more catalog fault that no finding is the cause of: a failure whose
//   counts differ from the release's must be new (a new defect inside a known corner);
// - as a framework with that fault alone (issue 64's stand-in): a failure must be new where the case
//   passes without the fault, unless the run is, param by param and count by count, what the
//   release itself gives (a coincidence no run can tell from the known defect), counted apart.
// tests/fuzz/known_test.cpp runs the short form, bench/known_matcher_bench.cpp the long one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "casefile/case.h"
#include "fuzz/known.h"
#include "oracle/verdict.h"
#include "vocab/faults.h"

namespace tally::fuzz {

// `c` (a case of a real target) run by a stand-in of its framework: tally's model with `planted`
// writes the manifests, judged as the framework's run of `c`.
oracle::Verdict stand_in_run(const casefile::Case& c, const vocab::FaultSet& planted);

struct PlantedCounts {
  std::int64_t failures = 0;       // runs that failed where the case counts otherwise than without the plant
  std::int64_t known = 0;          // of them, called known: misses
  std::int64_t coincidences = 0;   // planted alone: known, and what the release itself gives
};

struct MatcherMeasure {
  int world = 0;
  std::int64_t cases = 0;
  std::int64_t release_failures = 0, release_new = 0;  // the release model as the framework
  std::map<vocab::Fault, PlantedCounts> in_release;    // each fault planted in the release
  std::map<vocab::Fault, PlantedCounts> alone;         // each fault planted alone
  std::vector<std::string> misses;                     // the first few, one line each
  double seconds = 0.0;
};

// `cases` generated cases (campaign seed `seed`) of megatron-core `version` at `world`, within what
// a worker running tally's model builds, against `known` (the release's findings).
MatcherMeasure measure_known_matcher(const std::vector<KnownFinding>& known, const std::string& version, int world,
                                     std::int64_t cases, std::uint64_t seed);

}  // namespace tally::fuzz
