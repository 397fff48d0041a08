#include "oracle/judge.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <limits>

#include "oracle/clipped.h"
#include "oracle/diagnosis.h"
#include "oracle/held_gradients.h"
#include "oracle/ledger.h"

namespace tally::oracle {

namespace {

constexpr std::size_t kMaxClippedReports = 8;
constexpr std::size_t kMaxGradientReports = 8;

// One rank's value of a statistic and what it should be.
struct Sample {
  int rank = 0;
  double got = 0.0;
  double expected = 0.0;
  double bound = 0.0;
};

// How far off a sample is relative to its expectation (NaN is the farthest): ranks whose error
// ratios tie, as every inexact value under an exact bound does, are told apart by it.
double relative_error(const Sample& s) {
  if (std::isnan(s.got) || std::isnan(s.expected)) return std::numeric_limits<double>::infinity();
  const double error = std::abs(s.got - s.expected);
  return s.expected == 0.0 ? error : error / std::abs(s.expected);
}

// The worst rank of one statistic: the largest error / bound (an inexact value where the bound
// is 0 counts as infinitely bad), then the largest relative error, then the lowest rank. Ranks
// that did not report the value are not samples.
std::optional<StatisticCheck> worst(std::string name, const std::vector<Sample>& samples) {
  if (samples.empty()) return std::nullopt;
  StatisticCheck check;
  check.name = std::move(name);
  double worst_ratio = -1.0;
  double worst_relative = -1.0;
  for (const Sample& s : samples) {
    const double ratio = error_ratio(s.got, s.expected, s.bound);
    const double relative = relative_error(s);
    if (ratio > worst_ratio || (ratio == worst_ratio && relative > worst_relative)) {
      worst_ratio = ratio;
      worst_relative = relative;
      check.got = s.got;
      check.expected = s.expected;
      check.bound = s.bound;
      check.rank = s.rank;
    }
  }
  check.error = std::abs(check.got - check.expected);
  check.ok = worst_ratio <= 1.0;
  return check;
}

const GroupTruth& group_truth(const GroundTruth& truth, int norm_group) {
  return norm_group == 0 ? truth.main : truth.mtp;
}

// The statistics' expectations and bounds: derived for the model target, relative otherwise.
class Expectations {
 public:
  Expectations(const GroundTruth& truth, const Bounds& bounds) : truth_(truth), bounds_(bounds) {
    if (bounds.reduction) {
      main_ = tolerance(*bounds.reduction, truth.main);
      mtp_ = tolerance(*bounds.reduction, truth.mtp);
    }
  }
  bool derived() const { return bounds_.reduction.has_value(); }
  double relative(double expected) const { return bounds_.rtol * std::abs(expected); }
  double norm_bound(int norm_group, double expected) const {
    if (!derived()) return relative(expected);
    return (norm_group == 0 ? main_ : mtp_).norm;
  }
  // A max is exact in any order and any framework's arithmetic: the largest stored |g|, the
  // same number the statistics report, so even a real run's inf norm is held to it exactly
  // (a relative tolerance would let inf-norm-combined-by-l2's 1e-5 error through).
  double inf_bound(double) const { return 0.0; }
  double p_norm_bound(std::size_t i, double expected) const {
    return derived() ? main_.p_norms[i] : relative(expected);
  }
  // The coefficient a child with `max_norm` must report, and its bound.
  std::pair<double, double> clip(double max_norm) const {
    const ClipTruth clip = clip_truth(max_norm, truth_.main.norm);
    const double expected = clip.applied();
    if (!derived()) return {expected, relative(expected)};
    // Where the path cannot clip, it reports 1 exactly; elsewhere its coefficient, min(c', 1),
    // is within the coefficient's bound of the truth's (min is 1-Lipschitz), on either side of
    // the decision when that is uncertain.
    const bool never_clips = !clip.applies && main_.clip_decision_certain;
    return {expected, never_clips ? 0.0 : main_.clip_coefficient};
  }

 private:
  const GroundTruth& truth_;
  const Bounds& bounds_;
  Tolerance main_, mtp_;
};

// A rank's value against its own ledger: the record's keep decisions and statistics are right
// by the ledger's reckoning, so the difference is in how the rank combined them.
std::string ledger_diagnosis(const StatisticCheck& c) {
  const std::string rank = "rank " + std::to_string(c.rank);
  if (c.name == "l2-ledger")
    return rank + " reports norm " + record::all_digits(c.got) + ", but the pieces its stats groups kept " +
           "for the norm sum to the square of " + record::all_digits(c.expected) +
           ": its reduction is not the sum of their squares (averaged, or combined otherwise)";
  if (c.name == "zeros-ledger")
    return rank + " reports " + record::all_digits(c.got) + " zeros, but the pieces its stats groups kept " +
           "for the zero count hold " + record::all_digits(c.expected) +
           ": its count is not the sum of theirs (counted in float32, or padding counted as zeros)";
  return "";
}

std::vector<StatisticCheck> check_statistics(const record::RunRecord& run, const GroundTruth& truth,
                                             const Bounds& bounds, const LedgerResult& ledgers) {
  const Expectations e(truth, bounds);
  std::vector<Sample> l2, l2_ledger, inf, zeros, zeros_ledger, clip;
  std::vector<std::vector<Sample>> group_norms(run.norm_groups.size());
  std::vector<std::vector<Sample>> p_norms(run.p_values.size());
  for (const record::RankRecord& rank : run.ranks) {
    const record::Reported& r = rank.reported;
    const int at = rank.rank;
    if (r.norm) {
      l2.push_back({at, *r.norm, truth.main.norm, e.norm_bound(0, truth.main.norm)});
      if (ledgers.has_statistics) {
        const double implied = ledgers.implied_norm[static_cast<std::size_t>(at)];
        l2_ledger.push_back({at, *r.norm, implied, e.norm_bound(0, implied)});
      }
    }
    if (r.inf_norm) inf.push_back({at, *r.inf_norm, truth.main.abs_max, e.inf_bound(truth.main.abs_max)});
    if (r.zeros) {
      zeros.push_back({at, static_cast<double>(*r.zeros), static_cast<double>(truth.zeros), 0.0});
      if (ledgers.has_statistics) {
        const auto implied = static_cast<double>(ledgers.implied_zeros[static_cast<std::size_t>(at)]);
        zeros_ledger.push_back({at, static_cast<double>(*r.zeros), implied, 0.0});
      }
    }
    for (const record::GroupNorm& g : r.group_norms) {
      const double expected = group_truth(truth, g.norm_group).norm;
      group_norms[static_cast<std::size_t>(g.norm_group)].push_back(
          {at, g.norm, expected, e.norm_bound(g.norm_group, expected)});
    }
    for (std::size_t i = 0; i < r.p_norms.size() && i < p_norms.size(); ++i) {
      const double expected = truth.main.p_norms[i].norm;
      p_norms[i].push_back({at, r.p_norms[i], expected, e.p_norm_bound(i, expected)});
    }
    for (const record::ChildRecord& child : rank.children)
      if (child.clip) {
        const auto [expected, bound] = e.clip(child.clip->max_norm);
        clip.push_back({at, child.clip->coefficient, expected, bound});
      }
  }
  std::vector<StatisticCheck> checks;
  auto add = [&](std::string name, const std::vector<Sample>& samples) {
    if (std::optional<StatisticCheck> c = worst(std::move(name), samples)) checks.push_back(std::move(*c));
  };
  add("l2", l2);
  add("l2-ledger", l2_ledger);
  add("inf", inf);
  add("zeros", zeros);
  add("zeros-ledger", zeros_ledger);
  for (std::size_t g = 1; g < group_norms.size(); ++g) add(run.norm_groups[g].name + "-l2", group_norms[g]);
  for (std::size_t i = 0; i < p_norms.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "p%g", run.p_values[i]);
    add(name, p_norms[i]);
  }
  add("clip", clip);
  for (StatisticCheck& c : checks)
    if (!c.ok) c.diagnosis = ledger_diagnosis(c);
  return checks;
}

// The first pair of ranks whose reported values differ, as a sentence; "" when all agree. The
// model target's ranks must agree bit for bit, a real run's within the relative tolerance.
std::string first_disagreement(const record::RunRecord& run, const Bounds& bounds) {
  if (run.ranks.empty()) return "";
  const record::RankRecord& first = run.ranks.front();
  const bool exact = bounds.reduction.has_value();
  auto text = [](const std::optional<double>& v) { return v ? record::all_digits(*v) : std::string("none"); };
  for (const record::RankRecord& other : run.ranks) {
    auto differ = [&](std::string_view what, std::optional<double> a, std::optional<double> b,
                      bool exact_value) -> std::string {
      const bool same = a.has_value() == b.has_value() &&
                        (!a || (exact_value ? std::bit_cast<std::uint64_t>(*a) == std::bit_cast<std::uint64_t>(*b)
                                            : std::abs(*a - *b) <= bounds.rtol * std::max(std::abs(*a), std::abs(*b))));
      if (same) return "";
      return "rank " + std::to_string(first.rank) + " reports " + std::string(what) + " " + text(a) + " but rank " +
             std::to_string(other.rank) + " reports " + text(b);
    };
    auto as_double = [](const std::optional<std::int64_t>& v) {
      return v ? std::optional<double>(static_cast<double>(*v)) : std::nullopt;
    };
    const record::Reported& a = first.reported;
    const record::Reported& b = other.reported;
    // In order; the first that differs is the message. Checked inline: every rank of every case
    // passes through here, and a list of closures would allocate for each.
    if (std::string m = differ("l2", a.norm, b.norm, exact); !m.empty()) return m;
    if (std::string m = differ("inf", a.inf_norm, b.inf_norm, exact); !m.empty()) return m;
    if (std::string m = differ("zeros", as_double(a.zeros), as_double(b.zeros), true); !m.empty()) return m;
    for (std::size_t g = 0; g < std::max(a.group_norms.size(), b.group_norms.size()); ++g) {
      auto value = [g](const record::Reported& r) {
        return g < r.group_norms.size() ? std::optional<double>(r.group_norms[g].norm) : std::nullopt;
      };
      const std::size_t group = static_cast<std::size_t>(
          (g < a.group_norms.size() ? a.group_norms[g] : b.group_norms[g]).norm_group);
      if (std::string m = differ(run.norm_groups[group].name + "-l2", value(a), value(b), exact); !m.empty())
        return m;
    }
    if (std::string m = differ("clip coefficient", a.clip_coefficient, b.clip_coefficient, exact); !m.empty())
      return m;
    for (std::size_t i = 0; i < std::max(a.p_norms.size(), b.p_norms.size()); ++i) {
      auto value = [i](const record::Reported& r) {
        return i < r.p_norms.size() ? std::optional<double>(r.p_norms[i]) : std::nullopt;
      };
      if (std::string m = differ("p-norm", value(a), value(b), exact); !m.empty()) return m;
    }
  }
  return "";
}

}  // namespace

Verdict judge(const record::RunRecord& run, const GroundTruth& truth, const Bounds& bounds,
              const GradientSource* gradients, const JudgeOptions& options) {
  Verdict verdict;
  const LedgerResult ledgers = count_ledgers(run);
  verdict.stats = check_statistics(run, truth, bounds, ledgers);
  verdict.disagreement = first_disagreement(run, bounds);
  verdict.ranks_agree = verdict.disagreement.empty();

  verdict.miscounted_total = static_cast<std::int64_t>(ledgers.wrong.size());
  for (const WrongCount& wrong : ledgers.wrong) {
    Miscount m = miscount_of(run, wrong);
    if (static_cast<int>(verdict.miscounted.size()) < options.max_diagnosed_params)
      diagnose(run, wrong.ledger, m);
    verdict.miscounted.push_back(std::move(m));
  }
  if (ledgers.has_statistics)
    for (const record::RankRecord& rank : run.ranks)
      verdict.implied.push_back({rank.rank, ledgers.implied_norm[static_cast<std::size_t>(rank.rank)],
                                 ledgers.implied_zeros[static_cast<std::size_t>(rank.rank)]});

  if (gradients && bounds.reduction)
    verdict.clipped = check_clipped(run, truth, *gradients, *bounds.reduction, kMaxClippedReports);
  if (gradients && !bounds.reduction) {
    HeldGradientCheck held = check_held_gradients(run, truth, *gradients, bounds.rtol, kMaxGradientReports);
    verdict.gradients = std::move(held.mismatches);
    verdict.gradient_mismatches = held.total;
  }

  const bool stats_ok = std::all_of(verdict.stats.begin(), verdict.stats.end(),
                                    [](const StatisticCheck& s) { return s.ok; });
  verdict.kind = stats_ok && verdict.miscounted_total == 0 && verdict.ranks_agree &&
                         verdict.clipped.empty() && verdict.gradient_mismatches == 0
                     ? Verdict::Kind::pass
                     : Verdict::Kind::fail;
  return verdict;
}

}  // namespace tally::oracle
