// The case most tests of a target start from: Megatron-LM #6099's founding case without its fault
// (LayerWise, TP 2, EP 2, ETP 1, world 2), its expectation cleared so a test sets its own.
#pragma once

#include "casefile/case.h"
#include "casefile/case_file.h"
#include "run/target.h"

namespace tally::testing {

inline casefile::Case founding_case() {
  casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.pass.json", run::case_frameworks());
  c.expect.reset();
  return c;
}

}  // namespace tally::testing
