// The judge: a run record (record/run_record.h) against its truth. One judge for every target:
// `tally run` (tally's model of the path) and `tally check` (a real framework's manifests) give
// it a record and a truth, and it returns the verdict and its diagnosis:
//   - each statistic a rank reported (l2, inf, zeros, each separate norm group, p-norms, each
//     child's clip coefficient) against the truth, the worst rank shown;
//   - `l2-ledger` and `zeros-ledger`, where the record has statistics: each rank's norm and zero
//     count against the ones its own ledger implies, so a wrong reduction shows apart from a
//     wrong filter (the failing check says so in its diagnosis);
//   - the agreement of all ranks;
//   - the exact ledger (oracle/ledger.h) and, for each miscounted tensor, the diagnosis
//     (oracle/diagnosis.h);
//   - where the record holds clipped gradients and the judge knows the gradients, every clipped
//     element against the truth's coefficient times the stored gradient (oracle/clipped.h);
//   - where a real run's record holds statistics of its gradients and the judge knows the
//     gradients it was given, each of them, held and clipped (oracle/held_gradients.h).
#pragma once

#include <span>

#include <cstdint>
#include <optional>

#include "kernels/gradient_generator.h"
#include "oracle/ground_truth.h"
#include "oracle/tolerance.h"
#include "oracle/verdict.h"
#include "record/run_record.h"
#include "topologies/logical_model.h"

namespace tally::oracle {

// A real framework's relative tolerance, stated once: what Megatron-LM's own tests use for values
// reduced in fp32 in an order tally does not see (`tally check --rtol`, a real target's runs).
inline constexpr double kFrameworkRtol = 1e-5;

// How far a reported value may be from its expectation.
struct Bounds {
  // The model target: tally knows how the path summed, so every bound is derived from its
  // reduction (oracle/tolerance.h), exact gradient modes compare bit for bit, and all ranks
  // must agree bit for bit.
  std::optional<ReductionModel> reduction;
  // Otherwise (a real framework, which reduces in fp32 in an order tally does not see): values
  // within this relative tolerance of the truth, of their own ledger and of each other.
  double rtol = kFrameworkRtol;
};

// The gradients of a run whose values the judge can compute (the model target's, and a real
// target's, whose worker tally gave them): the clipped gradients the model target recorded are
// then judged element by element, the statistics a real run recorded against those values.
struct GradientSource {
  const topologies::LogicalModel* model = nullptr;  // the record's tensors, by id
  // Each tensor's generator, by id (vocab::param_generators: zeros outside the selected
  // classes, the values a case states).
  std::span<const kernels::GeneratorSpec> generators;
};

struct JudgeOptions {
  int max_diagnosed_params = 8;  // explain this many miscounted params in full
};

// Throws RecordTooLarge (oracle/ledger.h) when the record's pieces are too finely cut to count.
Verdict judge(const record::RunRecord& run, const GroundTruth& truth, const Bounds& bounds,
              const GradientSource* gradients = nullptr, const JudgeOptions& options = {});

}  // namespace tally::oracle
