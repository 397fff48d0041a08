// `tally check`: the manifests of one framework run judged like a `tally run` case. Validates
// the run as a whole, rebuilds the logical model from the boxes, computes the truth (each
// logical element once), builds each rank's ledger from the framework's own kept flags and
// stats groups, and diagnoses every miscounted logical param (docs/manifest.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "manifest/manifest.h"
#include "oracle/verdict.h"

namespace tally::manifest {

struct CheckOptions {
  double rtol = 1e-5;  // values: reported vs truth, reported vs ledger-implied, ranks vs ranks
  int max_diagnosed_params = 8;
};

// One rank's reported values beside what its own ledger implies.
struct RankValues {
  int rank = 0;
  Reported reported;
  double implied_norm = 0.0;        // sqrt of the kept sums of squares over its stats groups
  std::int64_t implied_zeros = 0;   // the kept_zeros zero counts over its stats groups
};

struct CheckReport {
  std::string producer;
  int world = 0;
  ParallelSizes parallel;
  std::int64_t logical_params = 0;
  std::int64_t logical_elements = 0;
  std::vector<std::string> optimizers;  // "NAME: stats group [..]" of rank 0
  double truth_norm = 0.0;
  double truth_inf_norm = 0.0;
  std::int64_t truth_zeros = 0;
  std::vector<RankValues> ranks;  // in rank order
  oracle::Verdict verdict;        // miscounted: logical params whose ledger is wrong anywhere
};

// Throws ManifestError (one line naming the rank's file, the field and the rule) when the
// manifests do not describe one consistent run: missing or repeated ranks, groups that differ
// between their members, boxes that overlap partially, elements nobody holds, replicas whose
// statistics disagree.
CheckReport check_run(const std::vector<RankManifest>& manifests, const CheckOptions& options = {});

}  // namespace tally::manifest
