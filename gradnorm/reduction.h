// Megatron-LM's own reduction of the gradients, for a case whose gradients enter before it
// (gradients.enter before_reduction): every rank gives its own share of each gradient
// (kernels/shares.h), scales it by 1/|DP x CP| and sums it over the groups megatron-core 0.19.2's
// finalize_model_grads reduces over (docs/megatron-reference.md section 10), through the
// Communicator like the norm's own reductions. The reduction faults (vocab/faults.h) switch single
// rules of it. What each rank then holds is what the rest of the path reads.
//
// Every rank ends with the whole reduced gradient of what it holds, as DDP's all-reduce leaves it;
// the distributed optimizer's reduce-scatter reduces only each rank's own slice, the only part its
// norm reads. Not modelled: the reduce-scatter inside each distributed-optimizer instance followed by
// the all-reduce across instances (docs/findings/megatron-core-0.19.2-dist-opt-instances-split-their-shards.md
// is where they differ).
#pragma once

#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/gradient_generator.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"
#include "vocab/path_options.h"

namespace tally::gradnorm {

// Why tally's model does not run the reduction of `config`, as one line naming the rule; nullopt
// where it does.
std::optional<std::string> reduction_refusal(const topologies::ParallelConfig& config);

// The groups megatron-core sums `param`'s gradient over, in order: its data-parallel group (DP x CP;
// expert DP for a routed expert), then the first and last stage's copies of a tied word embedding
// (PP > 1) or the TP ranks of a q/k layernorm (TP > 1). With `faults`, the groups the faulty path
// sums over instead (a step skipped or repeated).
std::vector<topologies::Family> reduction_steps(const topologies::LogicalParam& param,
                                                const topologies::ParallelConfig& config,
                                                const vocab::FaultSet& faults = {});

// The families the reduction of a case with `options` runs over (none where the gradients enter
// after it), for backends that create a communicator per family.
std::vector<topologies::Family> families_of_reduction(const vocab::PathOptions& options);

// What the ranks hold after the reduction where it is not the case's gradient. `generators` are the
// case's, by logical param id (vocab::param_generators). For the rank at position i of `ranks`,
// `held[i][id]` is -1 where it holds the case's values of param `id`, else an index into `lists`:
// the values it holds, as a list over the whole logical tensor (row-major; only its own box is read).
struct ReducedGradients {
  std::vector<std::vector<int>> held;
  std::deque<std::vector<double>> lists;  // a deque: specs point into it
};
ReducedGradients reduce_gradients(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
                                  const vocab::PathOptions& options,
                                  std::span<const kernels::GeneratorSpec> generators,
                                  comm::Communicator& communicator, std::span<const int> ranks);

}  // namespace tally::gradnorm
