// The verdict of one case: the path's results on every rank against the ground truth, the
// exact ledger, the agreement of all ranks and the clipped gradients; and, on a failure, the
// diagnosis: each miscounted logical param, how often it was counted, on which ranks, and the
// rule that kept or dropped it there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradnorm/path.h"
#include "oracle/ground_truth.h"
#include "oracle/tolerance.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::oracle {

// One statistic: the worst rank's value against the truth. bound 0 means bit for bit.
struct StatisticCheck {
  std::string name;  // "l2", "inf", "zeros", "mtp-l2", "p3", "clip"
  double got = 0.0;
  double expected = 0.0;
  double error = 0.0;  // |got - expected|
  double bound = 0.0;
  int rank = 0;        // the rank whose value is shown
  bool ok = true;
};

// One rank's contribution to a miscounted param, as explain_param reports it.
struct Contribution {
  int rank = 0;
  std::int64_t held = 0;
  std::int64_t owned = 0;
  std::int64_t counted = 0;
  std::string rule;
  bool shared_copy = false;
};

struct Miscount {
  int param = 0;
  std::string name;
  std::string param_class;
  std::int64_t expected = 0;  // numel: each element once
  std::int64_t numel = 0;     // the param's elements when `expected` is not (0: the same)
  std::int64_t counted = 0;   // elements counted, as the observing rank's ledger says
  int observed_on = 0;        // the first rank whose ledger is wrong for this param
  std::vector<int> wrong_ranks;  // every rank whose ledger is wrong (capped)
  std::int64_t wrong_rank_count = 0;
  std::string stats_group;    // the group the observing rank reduced this param over
  std::vector<Contribution> contributions;  // members of that group holding the param
};

struct ClippedMismatch {
  int rank = 0;
  int param = 0;
  std::string name;
  std::uint64_t element = 0;  // row-major index in the logical tensor
  double got = 0.0;
  double expected = 0.0;
  double applied_coefficient = 1.0;
  double expected_coefficient = 1.0;
};

struct Verdict {
  enum class Kind { pass, fail, infra_error };
  Kind kind = Kind::pass;
  std::vector<StatisticCheck> stats;
  std::vector<Miscount> miscounted;
  std::int64_t miscounted_total = 0;  // params miscounted (diagnosed or not)
  bool ranks_agree = true;
  std::string disagreement;  // the first pair of ranks that disagree, when they do
  std::vector<ClippedMismatch> clipped;  // at most one per rank, capped
  std::string infra_call;     // infra_error: the collective or call that failed
  std::string infra_message;
};

std::string_view kind_name(Verdict::Kind kind);  // "pass", "fail", "infra-error"

// How verdicts and their reports write values. Every digit of a double, so two values a message
// calls different print differently.
std::string all_digits(double value);
// "[0,1,2]"; past the first `shown` of `ranks`, ",... N more" counts the rest of `total`.
std::string rank_list_text(const std::vector<int>& ranks, std::int64_t total, std::size_t shown = 16);

struct JudgeOptions {
  int max_diagnosed_params = 8;  // explain this many miscounted params in full
  bool check_clipped = true;
};

// Judges `result` (every rank of `layout`) against `truth`, computed from the same model and
// gradients without faults.
Verdict judge(const topologies::LogicalModel& model, const topologies::RankLayout& layout,
              const gradnorm::PathOptions& options, const gradnorm::PathResult& result,
              const GroundTruth& truth, const JudgeOptions& judge_options = {});

// The ground truth the path is judged against (its gradients, p-norms and clipping).
GroundTruth truth_for(const topologies::LogicalModel& model, const gradnorm::PathOptions& options,
                      bool per_param = false);

}  // namespace tally::oracle
