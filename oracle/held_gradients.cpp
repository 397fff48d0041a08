#include "oracle/held_gradients.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/gradient_generator.h"
#include "oracle/detail/box_index.h"
#include "oracle/detail/compensated_sum.h"

namespace tally::oracle {

namespace {

// The statistics of a row-major range of a box of one logical tensor, from the generator, and
// those of its values at or above `tiny` in magnitude.
struct RangeValues {
  double sum_squares = 0.0;
  double abs_max = 0.0;
  std::int64_t zeros = 0;
  // The nonzero values below `tiny`: how many, and what the others alone hold.
  std::int64_t below_tiny = 0;
  double sum_squares_above_tiny = 0.0;
  double abs_max_above_tiny = 0.0;
};

RangeValues range_values(const topologies::LogicalParam& param, const record::Box& box,
                         record::ElementRange range, const kernels::GeneratorSpec& spec, double tiny) {
  const std::uint64_t key = kernels::stream_key(spec.seed, static_cast<std::uint64_t>(param.id));
  detail::CompensatedSum squares, squares_above_tiny;
  RangeValues out;
  for (std::int64_t n = range.begin; n < range.end; ++n) {
    const std::uint64_t logical = detail::logical_index(param.shape.rank, param.shape.dims, box, n);
    const double g = kernels::stored_value(spec, key, logical);
    squares.add(g * g);  // exact: a square of a <= 24-bit significand
    out.abs_max = std::max(out.abs_max, std::abs(g));
    out.zeros += g == 0.0;
    if (g != 0.0 && std::abs(g) < tiny) {
      ++out.below_tiny;
    } else {
      squares_above_tiny.add(g * g);
      out.abs_max_above_tiny = std::max(out.abs_max_above_tiny, std::abs(g));
    }
  }
  out.sum_squares = squares.value();
  out.sum_squares_above_tiny = squares_above_tiny.value();
  return out;
}

// A gradient dtype's unit roundoff and smallest normal magnitude: a clipped product is rounded
// once to the dtype, and one below the smallest normal may round to zero.
struct DtypeLimits {
  double unit_roundoff;
  double smallest_normal;
};
DtypeLimits limits_of(kernels::Dtype dtype) {
  switch (dtype) {
    case kernels::Dtype::fp32: return {0x1p-24, 0x1p-126};
    case kernels::Dtype::bf16: return {0x1p-8, 0x1p-126};
    case kernels::Dtype::fp16: return {0x1p-11, 0x1p-14};
  }
  return {0x1p-8, 0x1p-14};
}

std::string box_text(const record::Box& box) {
  std::string out = "[";
  for (int d = 0; d < box.extent.ndim; ++d)
    out += (d ? ", " : "") + std::to_string(box.offset[d]) + ":" + std::to_string(box.offset[d] + box.extent.size[d]);
  return out + "]";
}

class HeldJudge {
 public:
  HeldJudge(const record::RunRecord& run, const GroundTruth& truth, const GradientSource& gradients, double rtol)
      : run_(run), truth_(truth), gradients_(gradients), rtol_(rtol) {}

  // `rank`: the first of `ranks`, whose children's clips stand for all of them.
  void judge(const record::LocalRecord& local, const std::vector<int>& ranks, const record::RankRecord& rank) {
    std::vector<bool> param_wrong(local.params.size(), false);
    for (std::size_t i = 0; i < local.params.size(); ++i) {
      const record::LocalParam& param = local.params[i];
      if (!param.stats) continue;
      const RangeValues v = values(param, {0, param.box.numel()}, 0.0);
      const std::size_t before = found_.size();
      held(param, "its gradient, box " + box_text(param.box), *param.stats, v, ranks);
      param_wrong[i] = found_.size() > before;
    }
    for (std::size_t k = 0; k < local.pieces.size(); ++k) {
      const record::Piece& piece = local.pieces[k];
      const std::optional<record::GradStats>& clipped_stats =
          k < local.clipped_stats.size() ? local.clipped_stats[k] : std::optional<record::GradStats>();
      const record::LocalParam& param = local.params[static_cast<std::size_t>(piece.param)];
      const std::string owned = "elements [" + std::to_string(piece.range.begin) + ", " +
                                std::to_string(piece.range.end) + ") of box " + box_text(param.box) + " that child '" +
                                run_.children[static_cast<std::size_t>(piece.child)] + "' owns";
      const kernels::Dtype dtype = generator(param).dtype;
      // The clip the framework was asked for: its child's own max_norm where it recorded one (a
      // framework may clip at a max_norm of its own: DeepSpeed's gradient_clipping), with the
      // truth's norm of the param's group.
      const std::optional<record::Clip>& asked = rank.children[static_cast<std::size_t>(piece.child)].clip;
      const ClipTruth clip = asked ? clip_truth(asked->max_norm, norm_of(param)) : clip_of(param);
      // The coefficients the framework may have applied: within the tolerance of the truth's,
      // never above 1 (Megatron-LM and DeepSpeed scale only below 1).
      const bool clips = clip.max_norm > 0.0;
      const double low = clips ? std::min(1.0, clip.coefficient * (1.0 - rtol_)) : 1.0;
      const double high = clips ? std::min(1.0, clip.coefficient * (1.0 + rtol_)) : 1.0;
      const RangeValues v = values(param, piece.range, limits_of(dtype).smallest_normal / low);
      if (piece.stats && !param_wrong[static_cast<std::size_t>(piece.param)]) held(param, owned, *piece.stats, v, ranks);
      if (clipped_stats) clipped(param, "after the clip, " + owned, *clipped_stats, v, low, high, dtype, ranks);
    }
  }

  HeldGradientCheck result(std::size_t max_reports) && {
    HeldGradientCheck out;
    out.total = static_cast<std::int64_t>(found_.size());
    for (auto& entry : order_) {
      if (out.mismatches.size() >= max_reports) break;
      out.mismatches.push_back(std::move(found_.at(entry)));
    }
    return out;
  }

 private:
  using Key = std::tuple<int, std::string, std::string, bool>;  // tensor, where, statistic, after the clip

  const kernels::GeneratorSpec& generator(const record::LocalParam& param) const {
    return gradients_.generators[static_cast<std::size_t>(param.tensor)];
  }
  const ClipTruth& clip_of(const record::LocalParam& param) const {
    return run_.tensors[static_cast<std::size_t>(param.tensor)].norm_group == 0 ? truth_.main.clip : truth_.mtp.clip;
  }
  double norm_of(const record::LocalParam& param) const {
    return run_.tensors[static_cast<std::size_t>(param.tensor)].norm_group == 0 ? truth_.main.norm : truth_.mtp.norm;
  }
  RangeValues values(const record::LocalParam& param, record::ElementRange range, double tiny) const {
    const topologies::LogicalParam& logical = gradients_.model->params()[static_cast<std::size_t>(param.tensor)];
    return range_values(logical, param.box, range, generator(param), tiny);
  }

  void held(const record::LocalParam& param, const std::string& where, const record::GradStats& got,
            const RangeValues& v, const std::vector<int>& ranks) {
    expect(param, where, "sum_squares", got.sum_squares, v.sum_squares * (1.0 - rtol_), v.sum_squares * (1.0 + rtol_),
           false, ranks);
    expect(param, where, "abs_max", got.abs_max, v.abs_max, v.abs_max, false, ranks);
    expect(param, where, "zeros", static_cast<double>(got.zeros), static_cast<double>(v.zeros),
           static_cast<double>(v.zeros), false, ranks);
  }

  void clipped(const record::LocalParam& param, const std::string& where, const record::GradStats& got,
               const RangeValues& v, double low, double high, kernels::Dtype dtype, const std::vector<int>& ranks) {
    // At a coefficient of 1 the gradient is left as it was: no rounding to allow for. A product
    // that may leave the dtype's normal range (a value below `tiny`) may round to anything from 0
    // to its own size: the lower bounds count only the values above it.
    const double u = limits_of(dtype).unit_roundoff;
    const double down = low < 1.0 ? (1.0 - u) : 1.0;
    const double up = high < 1.0 ? (1.0 + u) : 1.0;
    const double squares_low = low < 1.0 ? v.sum_squares_above_tiny : v.sum_squares;
    const double max_low = low < 1.0 ? v.abs_max_above_tiny : v.abs_max;
    expect(param, where, "sum_squares", got.sum_squares, low * low * down * down * squares_low * (1.0 - rtol_),
           high * high * up * up * v.sum_squares * (1.0 + rtol_), true, ranks);
    expect(param, where, "abs_max", got.abs_max, low * down * max_low, high * up * v.abs_max, true, ranks);
    const double underflows = low < 1.0 ? static_cast<double>(v.below_tiny) : 0.0;
    expect(param, where, "zeros", static_cast<double>(got.zeros), static_cast<double>(v.zeros),
           static_cast<double>(v.zeros) + underflows, true, ranks);
  }

  void expect(const record::LocalParam& param, const std::string& where, const char* statistic, double got,
              double low, double high, bool after_clip, const std::vector<int>& ranks) {
    if (got >= low && got <= high) return;  // NaN is outside
    const Key key{param.tensor, where, statistic, after_clip};
    auto [it, fresh] = found_.try_emplace(key);
    GradientMismatch& m = it->second;
    if (fresh) {
      order_.push_back(key);
      m.name = run_.tensors[static_cast<std::size_t>(param.tensor)].name;
      m.where = where;
      m.statistic = statistic;
      m.got = got;
      m.low = low;
      m.high = high;
      m.after_clip = after_clip;
    }
    for (int rank : ranks) {
      if (m.ranks.size() < kMaxRanksShown) m.ranks.push_back(rank);
      ++m.rank_count;
    }
  }

  static constexpr std::size_t kMaxRanksShown = 16;
  const record::RunRecord& run_;
  const GroundTruth& truth_;
  const GradientSource& gradients_;
  double rtol_;
  std::map<Key, GradientMismatch> found_;
  std::vector<Key> order_;
};

}  // namespace

HeldGradientCheck check_held_gradients(const record::RunRecord& run, const GroundTruth& truth,
                                       const GradientSource& gradients, double rtol, std::size_t max_reports) {
  const auto& params = gradients.model->params();
  if (run.tensors.size() != params.size() || gradients.generators.size() != params.size())
    throw std::invalid_argument("check_held_gradients: the record has " + std::to_string(run.tensors.size()) +
                                " tensors, the model " + std::to_string(params.size()) + " params");
  for (std::size_t t = 0; t < params.size(); ++t)
    if (run.tensors[t].name != params[t].name)
      throw std::invalid_argument("check_held_gradients: the record's tensor " + std::to_string(t) + " is " +
                                  run.tensors[t].name + ", the model's param " + params[t].name);
  // Each distinct local record once, with the ranks that share it.
  std::map<const record::LocalRecord*, std::vector<int>> ranks_of;
  std::vector<const record::RankRecord*> first_of;  // in rank order, one per distinct local record
  for (const record::RankRecord& rank : run.ranks) {
    auto [it, fresh] = ranks_of.try_emplace(rank.local.get());
    if (fresh) first_of.push_back(&rank);
    it->second.push_back(rank.rank);
  }
  HeldJudge judge(run, truth, gradients, rtol);
  for (const record::RankRecord* first : first_of)
    judge.judge(*first->local, ranks_of.at(first->local.get()), *first);
  return std::move(judge).result(max_reports);
}

}  // namespace tally::oracle
