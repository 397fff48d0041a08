#include "oracle/verdict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "comm/communicator.h"
#include "topologies/sharding.h"

namespace tally::oracle {

namespace {

using gradnorm::PathOptions;
using gradnorm::PathResult;
using gradnorm::RankResult;
using topologies::LogicalModel;
using topologies::RankLayout;

constexpr std::size_t kMaxListedRanks = 16;
constexpr std::size_t kMaxContributions = 32;
constexpr std::size_t kMaxClippedReports = 8;

// The worst rank of one statistic: the largest error / bound (an inexact value where the bound
// is 0 counts as infinitely bad).
template <typename ValueOf>
StatisticCheck check_statistic(std::string name, const PathResult& result, double expected,
                               double bound, ValueOf value_of) {
  StatisticCheck check;
  check.name = std::move(name);
  check.expected = expected;
  check.bound = bound;
  double worst = -1.0;
  for (const RankResult& rank : result.ranks) {
    const double got = value_of(rank);
    const double ratio = error_ratio(got, expected, bound);
    if (ratio > worst) {
      worst = ratio;
      check.got = got;
      check.rank = rank.rank;
    }
  }
  check.error = std::abs(check.got - expected);
  check.ok = worst <= 1.0;
  return check;
}

bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

// The first rank whose reported statistics differ from rank 0's, as a sentence.
std::string first_disagreement(const PathResult& result) {
  if (result.ranks.empty()) return "";
  const RankResult& first = result.ranks.front();
  for (const RankResult& other : result.ranks) {
    auto differ = [&](const char* what, double a, double b) -> std::string {
      if (same_bits(a, b)) return "";
      return "rank " + std::to_string(first.rank) + " reports " + what + " " + all_digits(a) +
             " but rank " + std::to_string(other.rank) + " reports " + all_digits(b);
    };
    for (std::string message :
         {differ("l2", first.norm, other.norm), differ("inf", first.inf_norm, other.inf_norm),
          differ("zeros", static_cast<double>(first.zeros), static_cast<double>(other.zeros)),
          differ("mtp-l2", first.mtp_norm, other.mtp_norm),
          differ("clip coefficient", first.clip_coefficient, other.clip_coefficient)})
      if (!message.empty()) return message;
    for (std::size_t i = 0; i < first.p_norms.size(); ++i) {
      std::string message = differ("p-norm", first.p_norms[i], other.p_norms[i]);
      if (!message.empty()) return message;
    }
  }
  return "";
}

ReductionModel reduction_model(const LogicalModel& model, const RankLayout& layout,
                               const PathOptions& options, const PathResult& result) {
  ReductionModel m;
  m.local = options.accumulation;
  m.reduction = kernels::Accumulation::fp64;
  for (const topologies::LogicalParam& p : model.params())
    m.shard_elements = std::max(m.shard_elements, p.numel);
  m.shards = std::max<std::int64_t>(1, model.size() + 1);  // every param, and a shared copy
  int largest = 1;
  std::set<topologies::Family> families;
  for (const gradnorm::Child& child : result.plan.children) families.insert(child.stats_family);
  for (topologies::Family family : families)
    largest = std::max(largest, static_cast<int>(layout.ranks({family, 0}).size()));
  m.reduction_groups = {largest};
  // Children reduced apart add their sums of squares (and p-sums) on every rank.
  const int units = result.plan.shared_stats ? 1 : static_cast<int>(result.plan.children.size());
  if (units > 1) m.reduction_groups.push_back(units);
  m.children = 1;
  m.exact_mode = kernels::mode_is_exact(options.gradients.generator.mode);
  return m;
}

// Calls visit(logical row-major index) for each element of `slice`, in row-major order of the
// box, until it returns false.
template <typename Visit>
void for_each_element(const topologies::Shape& shape, const topologies::Slice& slice, Visit visit) {
  const int dims = shape.rank;
  std::array<std::int64_t, topologies::kMaxDims> index{};
  const std::int64_t total = slice.numel();
  for (std::int64_t n = 0; n < total; ++n) {
    std::int64_t logical = 0;
    for (int d = 0; d < dims; ++d) logical = logical * shape.dims[d] + slice.offset[d] + index[d];
    if (!visit(static_cast<std::uint64_t>(logical))) return;
    for (int d = dims - 1; d >= 0; --d) {
      if (++index[d] < slice.extent[d]) break;
      index[d] = 0;
    }
  }
}

void check_clipped(const LogicalModel& model, const RankLayout& layout, const PathOptions& options,
                   const PathResult& result, const GroundTruth& truth, const ReductionModel& rm,
                   Verdict& verdict) {
  const Tolerance main_tolerance = tolerance(rm, truth.main);
  const Tolerance mtp_tolerance = tolerance(rm, truth.mtp);
  std::vector<topologies::LocalParam> local;
  for (const RankResult& rank : result.ranks) {
    topologies::local_params(model, layout, rank.rank, local);
    for (const topologies::LocalParam& param : local) {
      const topologies::LogicalParam& logical = model.param(param.logical_id);
      const bool mtp = logical.grad_norm_group == topologies::GradNormGroup::mtp;
      const ClipTruth& clip = mtp ? truth.mtp.clip : truth.main.clip;
      const double applied = gradnorm::applied_clip(rank, result.plan, model, param.logical_id);
      const double expected = clip.applies ? clip.coefficient : 1.0;
      if (static_cast<float>(applied) == static_cast<float>(expected)) continue;
      const kernels::GeneratorSpec gen =
          gradnorm::generator_for(options.gradients, logical.param_class);
      const Tolerance& t = mtp ? mtp_tolerance : main_tolerance;
      bool reported = false;
      for_each_element(logical.shape, param.slice, [&](std::uint64_t element) {
        const float stored = kernels::gradient_value(gen, static_cast<std::uint64_t>(logical.id), element);
        const float got = applied < 1.0 ? kernels::apply_clip(stored, static_cast<float>(applied)) : stored;
        const float want = clipped_value(clip, stored);
        const double bound = rm.exact_mode ? 0.0 : clipped_bound(t, stored);
        if (error_ratio(got, want, bound) <= 1.0) return true;
        verdict.clipped.push_back({rank.rank, logical.id, logical.name, element, got, want,
                                   applied, expected});
        reported = true;
        return false;
      });
      if (reported) break;  // one mismatch per rank is enough to show it
    }
    if (verdict.clipped.size() >= kMaxClippedReports) return;
  }
}

}  // namespace

std::string_view kind_name(Verdict::Kind kind) {
  switch (kind) {
    case Verdict::Kind::pass: return "pass";
    case Verdict::Kind::fail: return "fail";
    case Verdict::Kind::infra_error: return "infra-error";
  }
  return "?";
}

GroundTruth truth_for(const LogicalModel& model, const PathOptions& options, bool per_param) {
  TruthOptions truth_options;
  truth_options.p_values = options.p_values;
  truth_options.max_norm = options.max_norm;
  truth_options.per_param = per_param;
  truth_options.class_mask = options.gradients.class_mask;
  return ground_truth(model, options.gradients.generator, truth_options);
}

Verdict judge(const LogicalModel& model, const RankLayout& layout, const PathOptions& options,
              const PathResult& result, const GroundTruth& truth,
              const JudgeOptions& judge_options) {
  Verdict verdict;
  const ReductionModel rm = reduction_model(model, layout, options, result);
  const Tolerance main_tolerance = tolerance(rm, truth.main);

  verdict.stats.push_back(check_statistic("l2", result, truth.main.norm, main_tolerance.norm,
                                          [](const RankResult& r) { return r.norm; }));
  verdict.stats.push_back(check_statistic("inf", result, truth.main.abs_max, 0.0,
                                          [](const RankResult& r) { return r.inf_norm; }));
  verdict.stats.push_back(check_statistic(
      "zeros", result, static_cast<double>(truth.zeros), 0.0,
      [](const RankResult& r) { return static_cast<double>(r.zeros); }));
  if (result.plan.has_mtp) {
    const Tolerance mtp_tolerance = tolerance(rm, truth.mtp);
    verdict.stats.push_back(check_statistic("mtp-l2", result, truth.mtp.norm, mtp_tolerance.norm,
                                            [](const RankResult& r) { return r.mtp_norm; }));
  }
  for (std::size_t i = 0; i < options.p_values.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "p%g", options.p_values[i]);
    verdict.stats.push_back(check_statistic(name, result, truth.main.p_norms[i].norm,
                                            main_tolerance.p_norms[i],
                                            [i](const RankResult& r) { return r.p_norms[i]; }));
  }
  if (options.max_norm > 0.0) {
    const ClipTruth& clip = truth.main.clip;
    verdict.stats.push_back(check_statistic(
        "clip", result, clip.applies ? clip.coefficient : 1.0,
        clip.applies && main_tolerance.clip_decision_certain ? main_tolerance.clip_coefficient : 0.0,
        [](const RankResult& r) { return r.clip_coefficient; }));
  }

  verdict.disagreement = first_disagreement(result);
  verdict.ranks_agree = verdict.disagreement.empty();

  // Ledger: every rank must count every logical element exactly once. Ranks that reduced over
  // the same groups share one ledger vector: each distinct vector is compared once.
  std::map<int, Miscount> miscounts;  // by param id
  std::map<const std::vector<std::int64_t>*, std::vector<int>> wrong_params_of;
  for (const RankResult& rank : result.ranks) {
    const std::vector<std::int64_t>& ledger = *rank.ledger;
    auto [found, fresh] = wrong_params_of.try_emplace(&ledger);
    if (fresh)
      for (const topologies::LogicalParam& p : model.params())
        if (ledger[p.id] != p.numel) found->second.push_back(p.id);
    for (int id : found->second) {
      auto [entry, first] = miscounts.try_emplace(id);
      Miscount& m = entry->second;
      if (first) {
        const topologies::LogicalParam& p = model.param(id);
        m.param = id;
        m.name = p.name;
        m.param_class = std::string(topologies::class_name(p.param_class));
        m.expected = p.numel;
        m.counted = ledger[id];
        m.observed_on = rank.rank;
      }
      ++m.wrong_rank_count;
      if (m.wrong_ranks.size() < kMaxListedRanks) m.wrong_ranks.push_back(rank.rank);
    }
  }
  verdict.miscounted_total = static_cast<std::int64_t>(miscounts.size());
  for (auto& [id, m] : miscounts) {
    if (static_cast<int>(verdict.miscounted.size()) < judge_options.max_diagnosed_params) {
      const int observed_on = m.observed_on;  // (clang 14 cannot capture a structured binding)
      const RankResult& observer = *std::find_if(
          result.ranks.begin(), result.ranks.end(),
          [observed_on](const RankResult& r) { return r.rank == observed_on; });
      const int child = result.plan.child_of_param[id];
      const topologies::GroupId group = observer.children[child].group;
      m.stats_group = comm::describe(comm::Group{group, layout.ranks(group)});
      for (int member : layout.ranks(group)) {
        for (const gradnorm::ParamOnRank& on :
             gradnorm::explain_param(model, layout, options, result.plan, member, id)) {
          if (m.contributions.size() >= kMaxContributions) break;
          m.contributions.push_back({on.rank, on.held, on.owned, on.counted,
                                     std::string(gradnorm::rule_text(on.rule)), on.shared_copy});
        }
      }
    }
    verdict.miscounted.push_back(std::move(m));
  }

  if (judge_options.check_clipped && options.max_norm > 0.0)
    check_clipped(model, layout, options, result, truth, rm, verdict);

  const bool stats_ok = std::all_of(verdict.stats.begin(), verdict.stats.end(),
                                    [](const StatisticCheck& s) { return s.ok; });
  verdict.kind = stats_ok && verdict.miscounted_total == 0 && verdict.ranks_agree &&
                         verdict.clipped.empty()
                     ? Verdict::Kind::pass
                     : Verdict::Kind::fail;
  return verdict;
}

std::string all_digits(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string rank_list_text(const std::vector<int>& ranks, std::int64_t total, std::size_t shown) {
  std::string out = "[";
  const std::size_t listed = std::min(ranks.size(), shown);
  for (std::size_t i = 0; i < listed; ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  if (total > static_cast<std::int64_t>(listed))
    out += ",... " + std::to_string(total - static_cast<std::int64_t>(listed)) + " more";
  return out + "]";
}

}  // namespace tally::oracle
