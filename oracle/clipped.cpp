#include "oracle/clipped.h"

#include <Eigen/Core>

#include <map>

namespace tally::oracle {

namespace {

// Calls visit(logical row-major index) for each element of `box`, in the box's row-major order.
template <typename Visit>
void for_each_element(const record::Extents& shape, const record::Box& box, Visit visit) {
  const int dims = shape.ndim;
  std::array<std::int64_t, record::kMaxDims> index{};
  const std::int64_t total = box.numel();
  for (std::int64_t n = 0; n < total; ++n) {
    std::int64_t logical = 0;
    for (int d = 0; d < dims; ++d) logical = logical * shape.size[d] + box.offset[d] + index[d];
    visit(static_cast<std::uint64_t>(logical));
    for (int d = dims - 1; d >= 0; --d) {
      if (++index[d] < box.extent.size[d]) break;
      index[d] = 0;
    }
  }
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
      : run_(run), truth_(truth), gradients_(gradients), reduction_(reduction),
        main_tolerance_(tolerance(reduction, truth.main)), mtp_tolerance_(tolerance(reduction, truth.mtp)) {}

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
      const FirstWrong wrong = first_wrong(param, *clipped[i].values);
      if (wrong.at < 0) continue;
      const ClipTruth& clip = clip_of(param.tensor);
      ClippedMismatch m;
      m.param = param.tensor;
      m.name = run_.tensors[static_cast<std::size_t>(param.tensor)].name;
      m.element = wrong.element;
      m.got = wrong.got;
      m.expected = wrong.expected;
      m.applied_coefficient = clipped[i].coefficient;
      m.expected_coefficient = clip.applies ? clip.coefficient : 1.0;
      return m;
    }
    return std::nullopt;
  }

  FirstWrong first_wrong(const record::LocalParam& param, const std::vector<float>& got) {
    std::vector<std::int64_t> key{param.tensor};
    key.push_back(reinterpret_cast<std::intptr_t>(got.data()));
    for (int d = 0; d < param.box.extent.ndim; ++d) key.push_back(param.box.offset[d]);
    auto [found, fresh] = compared_.try_emplace(std::move(key));
    if (!fresh) return found->second;
    FirstWrong& out = found->second;

    const topologies::LogicalParam& logical = gradients_.model->param(param.tensor);
    kernels::GeneratorSpec gen = gradients_.generator;
    if (!(gradients_.class_mask & (std::uint32_t{1} << static_cast<int>(logical.param_class))))
      gen.mode = kernels::GradientMode::zeros;
    const record::Extents& shape = run_.tensors[static_cast<std::size_t>(param.tensor)].shape;
    std::vector<std::uint64_t> elements;
    elements.reserve(static_cast<std::size_t>(param.box.numel()));
    for_each_element(shape, param.box, [&](std::uint64_t e) { elements.push_back(e); });
    Eigen::ArrayXf stored(static_cast<Eigen::Index>(elements.size()));
    for (Eigen::Index j = 0; j < stored.size(); ++j)
      stored[j] = kernels::gradient_value(gen, static_cast<std::uint64_t>(logical.id), elements[static_cast<std::size_t>(j)]);
    const ClipTruth& clip = clip_of(param.tensor);
    // One fp32 product per element, with the coefficient as a float: multi_tensor_scale's.
    const Eigen::ArrayXf expected = clip.applies ? Eigen::ArrayXf(stored * clip.scale()) : stored;
    const bool exact = reduction_.exact_mode;
    const Tolerance& t = run_.tensors[static_cast<std::size_t>(param.tensor)].norm_group == 0 ? main_tolerance_ : mtp_tolerance_;
    if (static_cast<Eigen::Index>(got.size()) != expected.size()) {
      out = {0, elements.empty() ? 0 : elements[0], 0.0f, expected.size() ? expected[0] : 0.0f, 0.0f};
      return out;
    }
    for (Eigen::Index j = 0; j < expected.size(); ++j) {
      const double bound = exact ? 0.0 : clipped_bound(t, stored[j]);
      if (error_ratio(got[static_cast<std::size_t>(j)], expected[j], bound) <= 1.0) continue;
      out = {j, elements[static_cast<std::size_t>(j)], got[static_cast<std::size_t>(j)], expected[j], stored[j]};
      break;
    }
    return out;
  }

  const record::RunRecord& run_;
  const GroundTruth& truth_;
  const GradientSource& gradients_;
  const ReductionModel& reduction_;
  const Tolerance main_tolerance_, mtp_tolerance_;
  std::map<const record::ClippedValues*, std::optional<ClippedMismatch>> by_rank_;
  std::map<std::vector<std::int64_t>, FirstWrong> compared_;
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
