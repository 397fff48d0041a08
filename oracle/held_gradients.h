// The gradients a real run held, against the gradients tally gave it. A real framework's worker
// receives every logical gradient from tally (run/framework_worker.h) and records the statistics
// of what it then holds: each local param's box, each piece its optimizers own, and, where it
// clips, each piece after the clip. A framework that holds another gradient (a reduction that
// doubles it, a copy from the wrong buffer, another case's values) and computes its norm
// faithfully over it would pass a judge that trusts the recorded statistics; here each one is held
// to the statistics of the values tally generated for that box:
//   - held: sum_squares within the relative tolerance (the framework's fp64 sum is in an order
//     tally does not see), abs_max and zeros exact (a max and a count do not round);
//   - clipped: the held values times a coefficient within the relative tolerance of the truth's
//     (oracle/ground_truth.h's clip of the truth's norm with the max_norm the piece's child
//     recorded, else the case's: 1 where it does not clip, either side where the decision is
//     within the tolerance), each product rounded once to the gradient's dtype;
//     zeros at least the held ones, and at most those plus the products that may underflow (a
//     product below the dtype's smallest normal, which may round to anything from 0 to itself:
//     the lower bounds of sum_squares and abs_max count only the others).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oracle/ground_truth.h"
#include "oracle/judge.h"
#include "oracle/verdict.h"
#include "record/run_record.h"

namespace tally::oracle {

struct HeldGradientCheck {
  std::vector<GradientMismatch> mismatches;  // the first `max_reports`, ranks merged
  std::int64_t total = 0;                    // every distinct mismatch
};

// Every statistic `run` recorded of a gradient, against the values `gradients` generates for it.
// The record's tensors must be `gradients.model`'s params in id order (std::invalid_argument
// otherwise). Records without statistics (the model target's) have nothing to check.
HeldGradientCheck check_held_gradients(const record::RunRecord& run, const GroundTruth& truth,
                                       const GradientSource& gradients, double rtol, std::size_t max_reports);

}  // namespace tally::oracle
