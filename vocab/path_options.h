// What a case asks of the grad-norm path: the optimizer model, the gradients, the statistics,
// clipping and the faults switched on. Plain data, shared by the path, the case files and the
// harness.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vocab/faults.h"
#include "vocab/optimizer_models.h"
#include "kernels/gradient_generator.h"
#include "kernels/summation_order.h"
#include "topologies/model_spec.h"

namespace tally::vocab {

// Stated gradients for the params one selector names: a logical param by its name, or every
// param of a class.
struct StatedFor {
  std::string param;                               // a logical param's name, or ""
  std::optional<topologies::ParamClass> param_class;  // when `param` is ""
  topologies::StatedGradient gradient;
  friend bool operator==(const StatedFor&, const StatedFor&) = default;
};

// Which params get generated gradients; the others have all-zero gradients (the selective
// invariant of docs/megatron-reference.md §7: only one class non-zero isolates that class's rule).
// A custom layout's own `gradient` for a param overrides both, and `stated` overrides all of them
// for the params it names, in order (a later entry wins).
struct GradientSpec {
  kernels::GeneratorSpec generator;
  std::uint32_t class_mask = ~std::uint32_t{0};  // bit i: topologies::ParamClass i
  std::vector<StatedFor> stated;
  // Where the gradients enter Megatron-LM's path: after its data-parallel reduction (every rank
  // holds the reduced gradient of what it holds), or before it (each rank its own share, which
  // megatron-core's finalize_model_grads reduces into the gradient; docs/megatron-reference.md
  // §10). tally's model (gradnorm/reduction.h) and the megatron-core target run "before"; the
  // values generated are the same.
  bool before_reduction = false;
  friend bool operator==(const GradientSpec&, const GradientSpec&) = default;
};
inline std::uint32_t class_bit(topologies::ParamClass c) {
  return std::uint32_t{1} << static_cast<int>(c);
}

struct PathOptions {
  OptimizerModel optimizer = OptimizerModel::plain;
  GradientSpec gradients;
  kernels::Accumulation accumulation = kernels::Accumulation::fp64;
  std::vector<double> p_values;  // extra p-norms of the main group (finite p > 0)
  double max_norm = 0.0;         // Megatron-LM's clip_grad; 0 never clips
  std::int64_t bucket_elements = 0;  // distributed optimizer; 0: one bucket per buffer
  // layerwise on megatron-core 0.19 and later: Megatron-LM's default parameter layout
  // (use_layer_wise_param_layout), where the layer-wise optimizer keeps Muon's matrices and a
  // DistributedOptimizer the rest, chained. Only the megatron-core target builds it.
  bool layer_wise_param_layout = false;
  FaultSet faults;
  friend bool operator==(const PathOptions&, const PathOptions&) = default;
};

}  // namespace tally::vocab
