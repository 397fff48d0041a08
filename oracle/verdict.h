// The verdict of one run (oracle/judge.h makes it): every reported statistic against the truth,
// the exact ledger, the agreement of all ranks and the clipped gradients; and, on a failure, the
// diagnosis: each miscounted logical param, how often it was counted, on which ranks, and the
// rule that kept or dropped it there. Plain values, printed by cli/verdict_report.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "record/text.h"

namespace tally::oracle {

// One statistic: the worst rank's value against the truth. bound 0 means bit for bit.
struct StatisticCheck {
  std::string name;  // "l2", "l2-ledger", "inf", "zeros", "zeros-ledger", "mtp-l2", "p3", "clip"
  double got = 0.0;
  double expected = 0.0;
  double error = 0.0;  // |got - expected|
  double bound = 0.0;
  int rank = 0;        // the rank whose value is shown
  bool ok = true;
  // Why it failed, where the judge can say more than the numbers: "" otherwise.
  std::string diagnosis;
};

// One rank's contribution to a miscounted param.
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
  std::string kind;           // the param's kind alone: param_class without where it was counted
  std::string ledger;         // where it was counted: "" the main norm, "zero count", or a group norm's name
  std::int64_t least = 0;     // the fewest times the observing rank's ledger counts one of its elements
  std::int64_t most = 0;      // the most times
  // Some of its elements are owned only by ranks outside every stats group the observing rank
  // reduces it over (an instance counting only its own shards): no filter of that group saw them.
  bool owned_outside = false;
  std::int64_t expected = 0;  // element counts expected: numel, or 0 outside the ledger's norm
  std::int64_t numel = 0;
  std::int64_t counted = 0;   // elements counted, as the observing rank's ledger says
  int observed_on = 0;        // the first rank whose ledger is wrong for this param
  std::vector<int> wrong_ranks;  // every rank whose ledger is wrong (capped)
  std::vector<std::int64_t> wrong_counted;  // elements each of them counts, parallel to wrong_ranks
  std::int64_t wrong_rank_count = 0;
  std::string stats_group;    // the groups the observing rank reduced this param over
  std::vector<Contribution> contributions;  // members of those groups holding the param
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

// A statistic a real run recorded of a gradient it held that is not the statistic of the gradient
// tally gave it (a reduction that doubled it, a copy from the wrong buffer, another case's
// gradients), or, after the clip, not what the clip coefficient makes of it.
struct GradientMismatch {
  std::string name;       // the logical param
  std::string where;      // "its gradient", "the piece [0, 64) child 'dense' owns"
  std::string statistic;  // "sum_squares", "abs_max", "zeros"
  double got = 0.0;
  double low = 0.0;   // the values the statistic may take: [low, high]
  double high = 0.0;
  bool after_clip = false;  // a statistic of the clipped gradient
  std::vector<int> ranks;   // the ranks that recorded it (capped)
  std::int64_t rank_count = 0;
};

struct Verdict {
  // refused: the target declined the case (a framework's own check while it set the case up): no
  // verdict on how it counts; infra_call says who declined it, infra_message why.
  enum class Kind { pass, fail, infra_error, refused };
  Kind kind = Kind::pass;
  std::vector<StatisticCheck> stats;
  std::vector<Miscount> miscounted;
  std::int64_t miscounted_total = 0;  // params miscounted (diagnosed or not)
  bool ranks_agree = true;
  std::string disagreement;  // the first pair of ranks that disagree, when they do
  std::vector<ClippedMismatch> clipped;  // at most one per rank, capped
  // Where the judge knows the gradients a real run was given: each recorded statistic that is not
  // theirs (capped), and how many there were.
  std::vector<GradientMismatch> gradients;
  std::int64_t gradient_mismatches = 0;
  std::string infra_call;     // infra_error: the collective or call that failed
  std::string infra_message;
  // What each rank's own ledger implies (oracle/ledger.h), when the record has statistics.
  struct Implied {
    int rank = 0;
    double norm = 0.0;
    std::int64_t zeros = 0;
  };
  std::vector<Implied> implied;
};

std::string_view kind_name(Verdict::Kind kind);  // "pass", "fail", "infra-error", "refused"

// A verdict of kind infra_error: `call` failed with `message` (no counting verdict).
Verdict infra_error_verdict(std::string call, std::string message);

// A verdict of kind refused: `who` (a framework and its release) declined the case, saying `why`.
Verdict refused_verdict(std::string who, std::string why);

}  // namespace tally::oracle
