// What each rank of a framework's reduction group contributes to a gradient, for a worker that runs
// the framework's own reduction (DeepSpeed's all-reduce and ZeRO's reduce-scatter over its
// data-parallel and expert-data-parallel groups): the case's gradient times the divisor the
// framework divides the group's sum by, dealt into one nonzero share per rank of the group
// (kernels/shares.h), exact in the gradient's dtype whatever order the collective adds them in.
// So a reduction over another group, one that leaves a rank out or counts one twice, or divides by
// another size, changes the gradient the framework holds, which the judge checks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "casefile/case.h"
#include "kernels/gradient_generator.h"

namespace tally::run {

// How a framework reduces a case's gradients: the sizes of its reduction groups (each distinct
// size once; DeepSpeed: the DP size, and the expert-DP size where the model has experts) and what
// it divides a group's sum by (DeepSpeed: the DP size, for experts too).
struct ReductionGroups {
  std::vector<int> sizes;
  int divisor = 1;
  // One more group size, where it is not one already (one shares file serves every group of a size).
  void add(int size) {
    if (std::find(sizes.begin(), sizes.end(), size) == sizes.end()) sizes.push_back(size);
  }
  friend bool operator==(const ReductionGroups&, const ReductionGroups&) = default;
};

// Every element of `values` (the case's gradients in the gradient index's order) dealt over a group
// of `ranks`: rank i's shares at [i * values.size(), (i + 1) * values.size()), their sum exactly
// value * divisor in `dtype`. An element whose total has no exact shares (it is not representable,
// or has too many significant bits to split `ranks` ways) is given whole by the group's first rank,
// 0 by the others, and counted in `given_whole`.
struct DealtShares {
  std::vector<float> shares;
  std::int64_t given_whole = 0;
};
DealtShares deal_shares(std::span<const float> values, int ranks, int divisor, kernels::Dtype dtype);

// case-<K>.shares-<N>.f32: the file a group of N ranks' shares go into.
std::string shares_file_name(const std::string& case_name, int ranks);

}  // namespace tally::run
