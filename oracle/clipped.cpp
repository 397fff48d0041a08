#include "oracle/clipped.h"

#include <Eigen/Core>

#include <bit>
#include <cstring>
#include <map>

#include "oracle/detail/box_index.h"
#include "oracle/detail/stored_values.h"
#include "oracle/ledger.h"

namespace tally::oracle {

namespace {

// The logical row-major index of element `at` (row-major in the box) of `box`.
std::uint64_t logical_index(const record::Extents& shape, const record::Box& box, std::int64_t at) {
  return detail::logical_index(shape.ndim, shape.size, box, at);
}

// The first element of one clipped tensor that differs from the truth, or none.
struct FirstWrong {
  std::int64_t at = -1;  // box element, row-major
  std::uint64_t element = 0;  // logical index
  float got = 0.0f, expected = 0.0f, stored = 0.0f;
};

class ClippedJudge {
 public:
  ClippedJudge(const record::RunRecord& run, const GroundTruth& truth, const GradientSource& gradients,
               const ReductionModel& reduction)
      : run_(run), truth_(truth), gradients_(gradients),
        main_scales_(clip_scales(tolerance(reduction, truth.main), truth.main.clip)),
        mtp_scales_(clip_scales(tolerance(reduction, truth.mtp), truth.mtp.clip)) {}

  std::optional<ClippedMismatch> first_mismatch(const record::RankRecord& rank) {
    auto [found, fresh] = by_rank_.try_emplace(rank.clipped.get());
    if (fresh) found->second = judge_rank(*rank.local, *rank.clipped);
    if (!found->second) return std::nullopt;
    ClippedMismatch m = *found->second;
    m.rank = rank.rank;
    return m;
  }

 private:
  const ClipTruth& clip_of(int tensor) const {
    return run_.tensors[static_cast<std::size_t>(tensor)].norm_group == 0 ? truth_.main.clip : truth_.mtp.clip;
  }

  std::optional<ClippedMismatch> judge_rank(const record::LocalRecord& local,
                                            const record::ClippedValues& clipped) {
    for (std::size_t i = 0; i < local.params.size() && i < clipped.size(); ++i) {
      const record::LocalParam& param = local.params[i];
      const FirstWrong wrong = first_wrong(param, clipped[i]);
      if (wrong.at < 0) continue;
      const ClipTruth& clip = clip_of(param.tensor);
      ClippedMismatch m;
      m.param = param.tensor;
      m.name = run_.tensors[static_cast<std::size_t>(param.tensor)].name;
      m.element = wrong.element;
      m.got = wrong.got;
      m.expected = wrong.expected;
      m.applied_coefficient = clipped[i].coefficient;
      m.expected_coefficient = clip.applied();
      return m;
    }
    return std::nullopt;
  }

  FirstWrong first_wrong(const record::LocalParam& param, const record::ClippedParam& clipped) {
    const ClipTruth& clip = clip_of(param.tensor);
    // Left as stored where the truth does not clip either: nothing to compare.
    if (!clipped.data && !clip.applies && clipped.size == static_cast<std::size_t>(param.box.numel()))
      return FirstWrong{};
    auto [found, fresh] = compared_.try_emplace(Compared{clipped.data.get(), param.tensor, param.box.offset});
    if (!fresh) return found->second;
    FirstWrong& out = found->second;

    const topologies::LogicalParam& logical = gradients_.model->param(param.tensor);
    const kernels::GeneratorSpec& gen = gradients_.generators[static_cast<std::size_t>(logical.id)];
    const std::uint64_t key = kernels::stream_key(gen.seed, static_cast<std::uint64_t>(logical.id));
    const record::Extents& shape = run_.tensors[static_cast<std::size_t>(param.tensor)].shape;
    // The stored values of the box, in its row-major order, run by run of the logical tensor:
    // from the truth's own materialization when it kept it, else from the generator.
    const auto n = static_cast<Eigen::Index>(param.box.numel());
    stored_.resize(static_cast<std::size_t>(n));  // keeps its capacity from box to box
    expected_.resize(static_cast<std::size_t>(n));
    const std::vector<float>* kept =
        static_cast<std::size_t>(param.tensor) < truth_.stored.size() ? &truth_.stored[static_cast<std::size_t>(param.tensor)] : nullptr;
    Eigen::Index at = 0;
    for_each_interval(shape, param.box, 0, param.box.numel(), [&](std::int64_t lo, std::int64_t hi) {
      if (kept) std::copy(kept->begin() + lo, kept->begin() + hi, stored_.data() + at);
      else detail::fill_stored(stored_.data() + at, hi - lo, gen, key, lo);
      at += hi - lo;
    });
    // One fp32 product per element, with the coefficient as a float: multi_tensor_scale's.
    const Eigen::Map<const Eigen::ArrayXf> stored(stored_.data(), n);
    Eigen::Map<Eigen::ArrayXf> expected(expected_.data(), n);
    if (clip.applies) expected = stored * clip.scale();
    else expected = stored;
    // Left as stored: the path's gradient is the stored one.
    const std::span<const float> got = clipped.data ? clipped.values() : std::span<const float>(stored_.data(), stored_.size());
    auto wrong_at = [&](Eigen::Index j) {
      const float want = expected[j];
      out = {j, logical_index(shape, param.box, j), j < static_cast<Eigen::Index>(got.size()) ? got[static_cast<std::size_t>(j)] : 0.0f,
             want, stored[j]};
    };
    if (static_cast<Eigen::Index>(got.size()) != n) {
      wrong_at(0);
      return out;
    }
    const ClipScales scales = run_.tensors[static_cast<std::size_t>(param.tensor)].norm_group == 0 ? main_scales_ : mtp_scales_;
    if (scales.low == scales.high) {  // one possible scale: the truth's, bit for bit
      if (std::memcmp(got.data(), expected_.data(), got.size() * sizeof(float)) == 0) return out;
      for (Eigen::Index j = 0; j < n; ++j)
        if (std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(j)]) != std::bit_cast<std::uint32_t>(expected[j])) {
          wrong_at(j);
          break;
        }
      return out;
    }
    const Eigen::Map<const Eigen::ArrayXf> values(got.data(), n);
    const Eigen::ArrayXf low = stored * scales.low, high = stored * scales.high;
    if ((values >= low.min(high) && values <= low.max(high)).all()) return out;
    for (Eigen::Index j = 0; j < n; ++j)
      if (!clipped_within(got[static_cast<std::size_t>(j)], stored[j], scales)) {
        wrong_at(j);
        break;
      }
    return out;
  }

  // A clipped tensor compared once: its values, and the box they belong to.
  struct Compared {
    const float* values;
    int tensor;
    std::array<std::int64_t, record::kMaxDims> offset;
    friend auto operator<=>(const Compared&, const Compared&) = default;
  };

  const record::RunRecord& run_;
  const GroundTruth& truth_;
  const GradientSource& gradients_;
  const ClipScales main_scales_, mtp_scales_;
  std::map<const record::ClippedValues*, std::optional<ClippedMismatch>> by_rank_;
  std::map<Compared, FirstWrong> compared_;
  std::vector<float> stored_, expected_;  // of the box being compared
};

}  // namespace

std::vector<ClippedMismatch> check_clipped(const record::RunRecord& run, const GroundTruth& truth,
                                           const GradientSource& gradients,
                                           const ReductionModel& reduction, std::size_t max_reports) {
  std::vector<ClippedMismatch> out;
  ClippedJudge judge(run, truth, gradients, reduction);
  for (const record::RankRecord& rank : run.ranks) {
    if (!rank.clipped) continue;
    if (std::optional<ClippedMismatch> m = judge.first_mismatch(rank)) out.push_back(std::move(*m));
    if (out.size() >= max_reports) break;
  }
  return out;
}

}  // namespace tally::oracle
