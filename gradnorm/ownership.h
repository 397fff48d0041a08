// Which gradient elements of a rank's main copies its optimizer owns: all of them for the
// non-distributed models, contiguous ranges of the flat buffer for the distributed optimizer,
// whole params assigned round-trip over data-parallel ranks for the layer-wise optimizer.
#pragma once

#include <cstdint>
#include <vector>

#include "gradnorm/main_params.h"
#include "kernels/local_stats.h"

namespace tally::gradnorm {

struct OwnedPiece {
  int local_index = 0;           // into the rank's main params
  kernels::ElementRange range;   // of the param's box, row-major
};

struct Ownership {
  std::vector<OwnedPiece> pieces;  // in main-param order
  std::int64_t padding = 0;        // buffer padding elements inside the owned ranges
};

struct OwnershipOptions {
  // Distributed optimizer: a bucket closes once it holds at least this many elements; 0 puts
  // every param of a buffer in one bucket.
  std::int64_t bucket_elements = 0;
};

// Distributed optimizer (docs/megatron-reference.md §5): each model chunk's buffers (dense params,
// expert-labelled params) are laid out in reverse param order (backward order), each param at a
// multiple of 64 elements, the shared embedding (pp > 1) in a bucket of its own, cut into
// buckets (by size only in the first chunk of the first stage), each padded to a multiple of
// lcm(D, 128) and split into D equal contiguous ranges; the rank owns range i, i its index in
// the intra-instance data-parallel group (dp-cp for dense, expt-dp for expert, split into
// dist_opt_instances contiguous parts).
// Layer-wise (docs/megatron-reference.md §5): params of each buffer sorted by size (largest first, ties in
// param order) are dealt to data-parallel ranks 0, 1, ..., D-1, D-1, ..., 0, 0, 1, ...; the owner
// holds the whole param.
void own_elements(vocab::OptimizerModel model, const std::vector<MainParam>& params,
                  const topologies::RankLayout& layout, int rank, const OwnershipOptions& options,
                  const vocab::FaultSet& faults, Ownership& out);

}  // namespace tally::gradnorm
