#include "oracle/ground_truth.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>

#include "oracle/detail/box_index.h"
#include "oracle/detail/compensated_sum.h"
#include "oracle/detail/stored_values.h"
#include "record/text.h"

namespace tally::oracle {
namespace {

using detail::CompensatedSum;
using topologies::LogicalParam;

static_assert(std::numeric_limits<long double>::digits >= 64,
              "the p-norm terms need a long double with at least 64 significand bits");
static_assert(kTruthBlock <= detail::kMaxAddends, "one accumulator per block");

// |g|^p in long double, rounded once to double: repeated multiplication for small integer p
// (exact whenever |g|^p fits in 64 bits, so exact-mode powers stay exact), powl otherwise.
struct PowerTerm {
  long double p = 0.0L;
  int integer_p = 0;  // 1..16, or 0 for powl
  double operator()(double g) const {
    const long double a = std::fabs(static_cast<long double>(g));
    if (integer_p == 0) return static_cast<double>(std::pow(a, p));
    long double r = a;
    for (int k = 1; k < integer_p; ++k) r *= a;
    return static_cast<double>(r);
  }
};

PowerTerm power_term(double p) {
  PowerTerm term;
  term.p = static_cast<long double>(p);
  if (p == std::floor(p) && p >= 1.0 && p <= 16.0) term.integer_p = static_cast<int>(p);
  return term;
}

// The running statistics of one param or one group.
struct Accumulator {
  std::int64_t elements = 0;
  CompensatedSum squares;
  std::vector<CompensatedSum> p_sums;
  double abs_max = 0.0;
  std::int64_t zeros = 0;

  explicit Accumulator(std::size_t p_count) : p_sums(p_count) {}

  void merge(const Accumulator& other) {
    elements += other.elements;
    squares.merge(other.squares);
    for (std::size_t i = 0; i < p_sums.size(); ++i) p_sums[i].merge(other.p_sums[i]);
    abs_max = std::max(abs_max, other.abs_max);
    zeros += other.zeros;
  }
};

// Sums an Eigen array expression in a fresh accumulator (at most kTruthBlock addends), evaluated
// term by term: no temporary array.
template <typename Terms>
CompensatedSum block_sum(const Eigen::ArrayBase<Terms>& terms) {
  CompensatedSum sum;
  for (Eigen::Index j = 0; j < terms.size(); ++j) sum.add(terms[j]);
  return sum;
}

Accumulator param_stats(const LogicalParam& param, const kernels::GeneratorSpec& spec,
                        const std::vector<PowerTerm>& powers, std::vector<float>* stored) {
  Accumulator acc(powers.size());
  const std::uint64_t key = kernels::stream_key(spec.seed, static_cast<std::uint64_t>(param.id));
  Eigen::ArrayXd values;
  for (std::int64_t first = 0; first < param.numel; first += kTruthBlock) {
    const std::int64_t n = std::min(kTruthBlock, param.numel - first);
    values.resize(n);
    detail::fill_stored(values.data(), n, spec, key, first);
    if (stored) stored->insert(stored->end(), values.begin(), values.end());  // exact: floats
    acc.elements += n;
    acc.squares.merge(block_sum(values.square()));  // exact squares of <= 24-bit significands
    for (std::size_t i = 0; i < powers.size(); ++i)
      acc.p_sums[i].merge(block_sum(values.unaryExpr(powers[i])));
    acc.abs_max = std::max(acc.abs_max, values.abs().maxCoeff());
    acc.zeros += (values == 0.0).count();  // -0 == 0 counts; NaN never compares equal
  }
  return acc;
}

GroupTruth finish(const Accumulator& acc, const TruthOptions& options) {
  GroupTruth group;
  group.elements = acc.elements;
  group.sum_squares = acc.squares.value();
  group.norm = std::sqrt(group.sum_squares);
  group.abs_max = acc.abs_max;
  group.zeros = acc.zeros;
  for (std::size_t i = 0; i < options.p_values.size(); ++i) {
    const double p = options.p_values[i];
    const double sum = acc.p_sums[i].value();
    group.p_norms.push_back({p, sum, std::pow(sum, 1.0 / p)});
  }
  group.clip = clip_truth(options.max_norm, group.norm);
  return group;
}

void check_options(const TruthOptions& options) {
  for (double p : options.p_values)
    if (!std::isfinite(p) || !(p > 0.0))
      throw std::invalid_argument("p-norm order " + std::to_string(p) +
                                  " must be finite and > 0");
  if (!std::isfinite(options.max_norm) || options.max_norm < 0.0)
    throw std::invalid_argument("max_norm " + std::to_string(options.max_norm) +
                                " must be finite and >= 0 (0: no clipping)");
}

}  // namespace

ClipTruth clip_truth(double max_norm, double norm) {
  ClipTruth clip;
  clip.max_norm = max_norm;
  clip.coefficient = max_norm / (norm + kClipEpsilon);
  clip.applies = max_norm > 0.0 && clip.coefficient < 1.0;
  return clip;
}

GroundTruth ground_truth(const topologies::LogicalModel& model,
                         const kernels::GeneratorSpec& gradients, const TruthOptions& options) {
  check_options(options);
  std::vector<PowerTerm> powers;
  for (double p : options.p_values) powers.push_back(power_term(p));

  Accumulator main(powers.size()), mtp(powers.size());
  GroundTruth truth;
  truth.ledger.reserve(model.params().size());
  for (const LogicalParam& param : model.params()) {
    const kernels::GeneratorSpec& spec =
        options.generators.empty() ? gradients : options.generators.at(static_cast<std::size_t>(param.id));
    const bool keep = options.keep_stored_up_to > 0 && model.total_elements() <= options.keep_stored_up_to;
    if (keep) truth.stored.emplace_back().reserve(static_cast<std::size_t>(param.numel));
    const Accumulator acc = param_stats(param, spec, powers, keep ? &truth.stored.back() : nullptr);
    (param.grad_norm_group == GradNormGroup::mtp ? mtp : main).merge(acc);
    truth.ledger.push_back({param.id, param.grad_norm_group, param.numel});
    if (options.per_param)
      truth.per_param.push_back({param.id, param.grad_norm_group, param.numel,
                                 acc.squares.value(), acc.abs_max, acc.zeros});
  }
  truth.main = finish(main, options);
  truth.mtp = finish(mtp, options);
  truth.zeros = truth.main.zeros + truth.mtp.zeros;
  return truth;
}

namespace {

// Why a norm group's truth overflowed: its params with the largest sums of squares (each distinct
// box once, as the truth counts them).
std::string overflow_message(const record::RunRecord& run, bool main_group) {
  constexpr std::size_t kShown = 4;
  std::vector<double> sums(run.tensors.size(), 0.0);
  std::set<std::pair<int, std::vector<std::int64_t>>> seen;
  for (const record::RankRecord& rank : run.ranks)
    for (const record::LocalParam& param : rank.local->params) {
      const int group = run.tensors[static_cast<std::size_t>(param.tensor)].norm_group;
      if (!param.stats || (group == 0) != main_group) continue;
      std::vector<std::int64_t> box;
      for (int d = 0; d < param.box.extent.ndim; ++d) {
        box.push_back(param.box.offset[d]);
        box.push_back(param.box.extent.size[d]);
      }
      if (seen.emplace(param.tensor, std::move(box)).second)
        sums[static_cast<std::size_t>(param.tensor)] += param.stats->sum_squares;
    }
  std::vector<std::size_t> order;
  for (std::size_t t = 0; t < sums.size(); ++t)
    if (sums[t] > 0.0) order.push_back(t);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return sums[a] > sums[b]; });
  std::string names;
  for (std::size_t i = 0; i < std::min(order.size(), kShown); ++i) {
    const double sum = sums[order[i]];
    names += (i == 0 ? "" : ", ") + run.tensors[order[i]].name +
             (std::isfinite(sum) ? " (sum_squares " + record::all_digits(sum) + ")" : " (its boxes' sums alone overflow)");
  }
  if (order.size() > kShown) names += " and " + std::to_string(order.size() - kShown) + " more";
  return "the truth cannot be computed: the sum of squares of the " +
         std::string(main_group ? "main norm group" : "separate grad-norm group") + "'s " +
         std::to_string(order.size()) + " params overflows a double (largest: " + names +
         "), so no finite norm is right";
}

}  // namespace

GroundTruth truth_from_box_statistics(const record::RunRecord& run) {
  // Each distinct (tensor, box) once; blocks of at most kMaxAddends boxes per accumulator.
  std::set<std::pair<int, std::vector<std::int64_t>>> seen;
  std::set<const record::LocalRecord*> seen_locals;
  Accumulator main(0), block(0), separate(0);
  std::int64_t in_block = 0, zeros = 0;
  for (const record::RankRecord& rank : run.ranks) {
    if (!seen_locals.insert(rank.local.get()).second) continue;
    for (const record::LocalParam& param : rank.local->params) {
      std::vector<std::int64_t> box;
      for (int d = 0; d < param.box.extent.ndim; ++d) {
        box.push_back(param.box.offset[d]);
        box.push_back(param.box.extent.size[d]);
      }
      if (!param.stats || !seen.emplace(param.tensor, std::move(box)).second) continue;
      zeros += param.stats->zeros;
      if (const int group = run.tensors[static_cast<std::size_t>(param.tensor)].norm_group; group != 0) {
        // Out of the main norm; into the truth of the one separate group the run reports
        // (manifest::to_record allows no second).
        if (!run.norm_groups[static_cast<std::size_t>(group)].counted) continue;
        Accumulator one(0);
        one.elements = param.box.numel();
        one.squares.add(param.stats->sum_squares);
        one.abs_max = param.stats->abs_max;
        one.zeros = param.stats->zeros;
        separate.merge(one);
        continue;
      }
      block.elements += param.box.numel();
      block.squares.add(param.stats->sum_squares);
      block.abs_max = std::max(block.abs_max, param.stats->abs_max);
      block.zeros += param.stats->zeros;
      if (++in_block == detail::kMaxAddends) {
        main.merge(block);
        block = Accumulator(0);
        in_block = 0;
      }
    }
  }
  main.merge(block);
  GroundTruth truth;
  truth.main = finish(main, TruthOptions{});
  truth.mtp = finish(separate, TruthOptions{});
  truth.zeros = zeros;
  if (!std::isfinite(truth.main.sum_squares) || !std::isfinite(truth.mtp.sum_squares))
    throw TruthUnknown(overflow_message(run, !std::isfinite(truth.main.sum_squares)));
  return truth;
}

record::GradStats range_truth(const topologies::LogicalParam& param, const record::Box& box,
                              record::ElementRange range, const kernels::GeneratorSpec& gradients) {
  const std::uint64_t key = kernels::stream_key(gradients.seed, static_cast<std::uint64_t>(param.id));
  Accumulator total(0), block(0);
  std::int64_t in_block = 0;
  for (std::int64_t n = range.begin; n < range.end; ++n) {
    const std::uint64_t logical = detail::logical_index(param.shape.rank, param.shape.dims, box, n);
    const double g = kernels::stored_value(gradients, key, logical);
    block.squares.add(g * g);  // exact: a square of a <= 24-bit significand
    block.abs_max = std::max(block.abs_max, std::abs(g));
    block.zeros += g == 0.0;
    if (++in_block == detail::kMaxAddends) {
      total.merge(block);
      block = Accumulator(0);
      in_block = 0;
    }
  }
  total.merge(block);
  return {total.squares.value(), total.abs_max, total.zeros};
}

float clipped_value(const ClipTruth& clip, float stored) {
  // One fp32 product, written here rather than taken from the clip kernel it checks.
  return clip.applies ? stored * clip.scale() : stored;
}

float clipped_value(const ClipTruth& clip, float stored, kernels::Dtype storage) {
  return clip.applies ? kernels::round_to(static_cast<double>(stored * clip.scale()), storage) : stored;
}

float expected_clipped(const GroundTruth& truth, const topologies::LogicalModel& model,
                       const kernels::GeneratorSpec& gradients, int param,
                       std::uint64_t element) {
  const LogicalParam& p = model.param(param);
  const float stored = kernels::gradient_value(gradients, static_cast<std::uint64_t>(param), element);
  return clipped_value(truth.group(p.grad_norm_group).clip, stored);
}

}  // namespace tally::oracle
