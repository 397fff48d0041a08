// Fault lists on the command line, read alike by `tally run --fault`, `tally fuzz --faults` and
// `tally mutants --faults`: comma-separated and repeatable; "none" (no fault), "all" (every fault
// of the catalog, vocab/faults.h), or catalog names, each kept once in the order given.
#pragma once

#include <string>
#include <vector>

#include "vocab/faults.h"

namespace tally::cli {

// Throws UsageError naming `flag` and the rule: an unknown or empty name, or "none" combined with
// faults.
std::vector<vocab::Fault> parse_fault_list(const std::vector<std::string>& lists,
                                              const std::string& flag);

}  // namespace tally::cli
