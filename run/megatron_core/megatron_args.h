// A case as the Megatron-LM command-line arguments that build the same topology, model and
// optimizer, so a finding can be rerun in the framework itself (docs/case-files.md); `tally show`
// prints them.
#pragma once

#include <string>
#include <vector>

#include "casefile/case.h"

namespace tally::run {

struct MegatronArgs {
  // Flags with their values as separate words ("--tensor-model-parallel-size", "2", ...).
  std::vector<std::string> args;
  // What has no Megatron-LM flag: the world size (the launcher's), a rank order other than the
  // two Megatron-LM spells, a custom layout, tally's gradients and faults.
  std::vector<std::string> notes;
};

MegatronArgs megatron_args(const casefile::Case& c);

}  // namespace tally::run
