// The ground truth: every statistic of the grad-norm path, computed on the unsharded model with
// Eigen in fp64, each logical element read exactly once (docs/megatron-reference.md
// §5). It shares only the gradient *generator* with the path under test (docs/architecture.md, "What must never happen"):
// the values are kernels::gradient_value, the sums are the oracle's own.
//
// How. Each logical tensor is materialised blockwise (kTruthBlock elements at a time) into an
// Eigen::ArrayXd of the stored values widened to double; squares, |g|, |g|^p, the max and the
// zero count are Eigen array expressions; the sums go through a double-double accumulator
// (oracle/detail/compensated_sum.h) merged block -> param -> group, never the summation order of
// kernels/local_stats.
//
// Accuracy (u = 2^-53):
//   - abs-max, zero count, element counts: exact.
//   - sum of squares: squares of stored values (at most 24 significand bits) are exact in fp64;
//     the compensated sum is within (1 + 2^-9) u relative of the exact sum (<= 1 ulp).
//   - L2 norm = sqrt(sum of squares), correctly rounded: within 1.51 u relative.
//   - p-sums: each |g|^p is computed in long double (repeated multiplication for integer
//     1 <= p <= 16, powl otherwise) and rounded once to double, within 1.01 u relative of |g|^p;
//     the sum is then within 2.02 u relative. p-norm = std::pow(p_sum, 1.0 / p), the fp64 formula a path
//     uses (Megatron-LM: total_norm ** (1.0 / norm_type)); its own error against the exact root
//     (the rounding of 1/p, pow's < 1 ulp) is part of oracle/tolerance.h's model.
//   - Exact modes (ones, zeros, dyadic, rank-encoded): every sum of squares is exact, so the
//     norm is the correctly rounded sqrt of the exact sum: all ones gives std::sqrt(N) bit for
//     bit. p-sums are exact for integer p whose powers are exact (dyadic up to p = 4 within the
//     generator's element limits; ones, zeros and rank-encoded for any integer p <= 16).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/gradient_generator.h"
#include "record/run_record.h"
#include "topologies/logical_model.h"

namespace tally::oracle {

using topologies::GradNormGroup;

// Elements materialised at once per tensor (8 MiB of doubles).
inline constexpr std::int64_t kTruthBlock = std::int64_t{1} << 20;

// Megatron-LM's clip_grad_by_total_norm_fp32 epsilon: coef = max_norm / (norm + 1e-6).
inline constexpr double kClipEpsilon = 1.0e-6;

struct TruthOptions {
  std::vector<double> p_values;  // finite p > 0: general p-norms, in the order wanted back
  double max_norm = 0.0;         // clip_grad; 0: no clipping
  bool per_param = false;        // also fill GroundTruth::per_param (for the diagnosis)
  // Also keep every tensor's stored gradient values (GroundTruth::stored), when the model has at
  // most this many elements: the clipped check then reads them instead of generating them again.
  std::int64_t keep_stored_up_to = 0;
  // Each param's generator, by id (vocab::param_generators: zeros outside the selected
  // classes, the values a case states); empty: the `gradients` argument for every param.
  std::vector<kernels::GeneratorSpec> generators;
  friend bool operator==(const TruthOptions&, const TruthOptions&) = default;
};

struct PNormTruth {
  double p = 0.0;
  double sum = 0.0;   // sum of |g|^p
  double norm = 0.0;  // std::pow(sum, 1.0 / p)
  friend bool operator==(const PNormTruth&, const PNormTruth&) = default;
};

// The clip coefficient exactly as Megatron-LM computes it from a float norm: in fp64,
// max_norm / (norm + 1e-6), applied only when below 1. `coefficient` is the raw value (0 when
// max_norm is 0, which disables clipping): what a path multiplies by is applied().
struct ClipTruth {
  double max_norm = 0.0;
  double coefficient = 0.0;
  bool applies = false;  // max_norm > 0 and coefficient < 1
  // The coefficient a path reports and multiplies its gradients by: 1 where it does not clip
  // (max_norm <= 0 never clips, as gradnorm/path.cpp's clip_coefficient). The one place the
  // judge and the clipped check read it from.
  double applied() const { return applies ? coefficient : 1.0; }
  // The coefficient multi_tensor_scale receives: a Python float entering as a float.
  float scale() const { return static_cast<float>(coefficient); }
  friend bool operator==(const ClipTruth&, const ClipTruth&) = default;
};

ClipTruth clip_truth(double max_norm, double norm);

// One grad-norm group (Megatron-LM's grad_norm_group: main = absent, or "mtp").
struct GroupTruth {
  std::int64_t elements = 0;  // logical elements in the group
  double sum_squares = 0.0;
  double norm = 0.0;     // sqrt(sum_squares)
  double abs_max = 0.0;  // the inf norm: max |g|, 0 when the group is empty
  std::int64_t zeros = 0;  // zeros among the group's elements (see GroundTruth::zeros)
  std::vector<PNormTruth> p_norms;  // one per TruthOptions::p_values entry
  ClipTruth clip;  // from this group's norm: MTP params are clipped with the MTP norm
  friend bool operator==(const GroupTruth&, const GroupTruth&) = default;
};

// The expected ledger: each logical element counted exactly once, in its own norm group.
struct LedgerEntry {
  int param = 0;
  GradNormGroup group = GradNormGroup::main;
  std::int64_t count = 0;  // = numel
  friend bool operator==(const LedgerEntry&, const LedgerEntry&) = default;
};

struct ParamTruth {
  int param = 0;
  GradNormGroup group = GradNormGroup::main;
  std::int64_t numel = 0;
  double sum_squares = 0.0;
  double abs_max = 0.0;
  std::int64_t zeros = 0;
  friend bool operator==(const ParamTruth&, const ParamTruth&) = default;
};

struct GroundTruth {
  GroupTruth main;  // the global grad norm: MTP params excluded
  GroupTruth mtp;   // all zero when the model has no MTP-group params
  // count_zeros_fp32: over ALL params, main and MTP (no grad_norm_group exclusion). Exact:
  // g == 0, so -0 counts and NaN does not.
  std::int64_t zeros = 0;
  std::vector<LedgerEntry> ledger;   // one per logical param, in id order
  std::vector<ParamTruth> per_param;  // one per logical param when TruthOptions::per_param
  // Per logical param, its stored gradient values in row-major order, when kept (see
  // TruthOptions::keep_stored_up_to); empty otherwise.
  std::vector<std::vector<float>> stored;
  friend bool operator==(const GroundTruth&, const GroundTruth&) = default;

  const GroupTruth& group(GradNormGroup g) const { return g == GradNormGroup::mtp ? mtp : main; }
};

// Throws std::invalid_argument for a p that is not finite and > 0, or a max_norm that is not
// finite and >= 0.
GroundTruth ground_truth(const topologies::LogicalModel& model,
                         const kernels::GeneratorSpec& gradients, const TruthOptions& options);

// A truth that cannot be computed: the recorded statistics are each finite, but their sum of
// squares is not (it overflows a double). Bad input: no finite norm is right, so no verdict is.
class TruthUnknown : public std::domain_error {
 public:
  using std::domain_error::domain_error;
};

// The truth of a run whose gradients tally cannot generate (a real framework's): from the
// statistics its ranks recorded of the boxes they hold, each distinct box of each tensor once
// (manifest/ has checked that a tensor's boxes are identical or disjoint, cover every element,
// and that replicas agree). main: the tensors of the main norm group; zeros: every tensor; the
// same compensated sums as above. No p-norms; no clip (each child's clip is judged against
// its own max_norm). Throws TruthUnknown, naming the params with the largest sums, when a norm
// group's sum of squares overflows.
GroundTruth truth_from_box_statistics(const record::RunRecord& run);

// The statistics of the row-major range `range` of `box` of one logical tensor, from the
// generator `gradients` (already resolved for the param's class): the oracle's own sums, for
// describing a model-target run in manifests.
record::GradStats range_truth(const topologies::LogicalParam& param, const record::Box& box,
                              record::ElementRange range, const kernels::GeneratorSpec& gradients);

// The parameter norm (calc_params_l2_norm) is the same computation over parameter values: it
// is ground_truth called with the GeneratorSpec of the parameters, nothing else. Its main.norm
// is the parameter L2 norm (main.clip and zeros mean nothing there).
inline GroundTruth parameter_truth(const topologies::LogicalModel& model,
                                   const kernels::GeneratorSpec& parameters,
                                   const TruthOptions& options) {
  return ground_truth(model, parameters, options);
}

// The expected clipped gradient: the fp32 product stored * clip.scale() when clipping applies,
// else the stored value unchanged. The second form stores the product back in `storage` (a bf16
// decoupled_grad), rounded to nearest even.
float clipped_value(const ClipTruth& clip, float stored);
float clipped_value(const ClipTruth& clip, float stored, kernels::Dtype storage);

// Element `element` (row-major index in the logical tensor) of logical param `param` after
// clipping with its own group's coefficient.
float expected_clipped(const GroundTruth& truth, const topologies::LogicalModel& model,
                       const kernels::GeneratorSpec& gradients, int param,
                       std::uint64_t element);

}  // namespace tally::oracle
