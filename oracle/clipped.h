// The clipped gradients a run produced, against the truth. The path under test clips with its own
// kernel (kernels/clip_scale.h) and records the values (record::ClippedValues); here the
// expectation is computed independently: the stored gradient (the generator, the one input the
// oracle shares) times the truth's coefficient rounded to a float, one fp32 product per element
// in Eigen, as Megatron-LM's multi_tensor_scale makes it; no clipping where the truth says the
// norm is under max_norm. Where the path's coefficient may differ from the truth's by its own
// rounding (oracle/tolerance.h, item 8), each value must lie between the products with the lowest
// and highest scale that difference allows (clip_scales); where it cannot, bit for bit.
#pragma once

#include <cstddef>
#include <vector>

#include "oracle/ground_truth.h"
#include "oracle/judge.h"
#include "oracle/tolerance.h"
#include "oracle/verdict.h"
#include "record/run_record.h"

namespace tally::oracle {

// The first wrong element of each rank whose clipped gradients are wrong, in rank order, at most
// `max_reports`. Each distinct clipped tensor is compared once, however many ranks share it.
std::vector<ClippedMismatch> check_clipped(const record::RunRecord& run, const GroundTruth& truth,
                                           const GradientSource& gradients,
                                           const ReductionModel& reduction, std::size_t max_reports);

}  // namespace tally::oracle
