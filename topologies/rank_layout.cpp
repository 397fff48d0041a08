#include "topologies/rank_layout.h"

#include <algorithm>

#include "topologies/detail/grid.h"

namespace tally::topologies {

namespace {

struct FamilySpec {
  Family family;
  std::string_view name;
  bool expert;                            // built on the expert grid
  std::array<bool, kGridAxisCount> axes;  // indexed by Axis: tp cp ep dp pp gtp
};

// The token sets initialize_model_parallel passes to RankGenerator.get_ranks (megatron-core
// 0.19: gtp_remat in the model-parallel, tp-dp-cp and tp-dp tokens; an axis of size 1 changes
// no group, so 0.16.1's groups are these with gtp = egtp = 1).
constexpr std::array<FamilySpec, 27> kGridFamilies = {{
    {Family::tp, "tp", false, {true, false, false, false, false, false}},
    {Family::cp, "cp", false, {false, true, false, false, false, false}},
    {Family::dp, "dp", false, {false, false, false, true, false, false}},
    {Family::dp_cp, "dp-cp", false, {false, true, false, true, false, false}},
    {Family::pp, "pp", false, {false, false, false, false, true, false}},
    {Family::tp_pp, "tp-pp", false, {true, false, false, false, true, true}},
    {Family::tp_cp, "tp-cp", false, {true, true, false, false, false, false}},
    {Family::tp_dp_cp, "tp-dp-cp", false, {true, true, false, true, false, true}},
    {Family::tp_dp, "tp-dp", false, {true, false, false, true, false, true}},
    {Family::expt_tp, "expt-tp", true, {true, false, false, false, false, false}},
    {Family::expt_ep, "expt-ep", true, {false, false, true, false, false, false}},
    {Family::expt_dp, "expt-dp", true, {false, false, false, true, false, false}},
    {Family::expt_tp_ep, "expt-tp-ep", true, {true, false, true, false, false, false}},
    {Family::expt_tp_ep_pp, "expt-tp-ep-pp", true, {true, false, true, false, true, false}},
    {Family::gtp, "gtp", false, {false, false, false, false, false, true}},
    {Family::gtp_dp, "gtp-dp", false, {false, false, false, true, false, true}},
    {Family::gtp_dp_cp, "gtp-dp-cp", false, {false, true, false, true, false, true}},
    {Family::expt_gtp, "expt-gtp", true, {false, false, false, false, false, true}},
    {Family::expt_gtp_dp, "expt-gtp-dp", true, {false, false, false, true, false, true}},
    {Family::expt_tp_ep_gtp_pp, "expt-tp-ep-gtp-pp", true, {true, false, true, false, true, true}},
    {Family::expt_tp_pp, "expt-tp-pp", true, {true, false, false, false, true, false}},
    {Family::expt_tp_gtp_pp, "expt-tp-gtp-pp", true, {true, false, false, false, true, true}},
    {Family::expt_tp_dp_pp, "expt-tp-dp-pp", true, {true, false, false, true, true, true}},
    {Family::expt_tp_dp, "expt-tp-dp", true, {true, false, false, true, false, true}},
    {Family::tp_gtp, "tp-gtp", false, {true, false, false, false, false, true}},
    {Family::expt_tp_ep_gtp, "expt-tp-ep-gtp", true, {true, false, true, false, false, true}},
    {Family::expt_tp_gtp, "expt-tp-gtp", true, {true, false, false, false, false, true}},
}};

}  // namespace

std::string_view family_name(Family family) {
  for (const FamilySpec& spec : kGridFamilies)
    if (spec.family == family) return spec.name;
  switch (family) {
    case Family::embedding: return "embedding";
    case Family::world: return "world";
    case Family::dist_opt: return "dist-opt";
    case Family::dist_opt_stage: return "dist-opt-pp-stage";
    case Family::dist_opt_without_ep: return "dist-opt-ep-rank";
    case Family::dist_opt_stage_without_ep: return "dist-opt-pp-stage-ep-rank";
    default: return "?";
  }
}

std::span<const Family> megatron_families(const ParallelConfig& config) {
  return std::span<const Family>(kMegatronFamilies)
      .first(uses_gtp(config) ? kMegatronFamilies.size() : kMegatron0161FamilyCount);
}

std::optional<Family> family_from_name(std::string_view name) {
  for (Family family : kAllFamilies)
    if (family_name(family) == name) return family;
  return std::nullopt;
}

namespace {

// Megatron-LM's generate_masked_orthogonal_rank_groups, computed per rank: a rank's group
// index is the mixed-radix value of its coordinates on the axes outside the mask, its index in
// the group the value on the axes inside it, both with the first axis of the order fastest.
void fill_grid_family(const detail::Grid& grid, const std::array<bool, kGridAxisCount>& in_mask,
                      int world, std::vector<int>& offsets, std::vector<int>& ranks,
                      std::vector<int>& group_of_rank, std::vector<int>& index_of_rank) {
  std::array<int, kGridAxisCount> masked_stride{}, unmasked_stride{};
  int group_size = 1, group_count = 1;
  for (int i = 0; i < kGridAxisCount; ++i) {
    if (in_mask[static_cast<int>(grid.order[i])]) {
      masked_stride[i] = group_size;
      group_size *= grid.size[i];
    } else {
      unmasked_stride[i] = group_count;
      group_count *= grid.size[i];
    }
  }
  offsets.resize(group_count + 1);
  for (int g = 0; g <= group_count; ++g) offsets[g] = g * group_size;
  ranks.assign(world, 0);
  group_of_rank.assign(world, 0);
  index_of_rank.assign(world, 0);
  for (int rank = 0; rank < world; ++rank) {
    int group = 0, index = 0;
    for (int i = 0; i < kGridAxisCount; ++i) {
      const int coord = (rank / grid.stride[i]) % grid.size[i];
      if (in_mask[static_cast<int>(grid.order[i])])
        index += coord * masked_stride[i];
      else
        group += coord * unmasked_stride[i];
    }
    ranks[group * group_size + index] = rank;
    group_of_rank[rank] = group;
    index_of_rank[rank] = index;
  }
}

// The non-empty intersections of a group of `a` with a group of `b`, ordered by the pair of
// group indices; ranks ascending.
void fill_intersection(const std::vector<int>& group_a, const std::vector<int>& group_b, int world,
                       std::vector<int>& offsets, std::vector<int>& ranks,
                       std::vector<int>& group_of_rank, std::vector<int>& index_of_rank) {
  std::vector<int> order(world);
  for (int r = 0; r < world; ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return std::pair(group_a[x], group_b[x]) < std::pair(group_a[y], group_b[y]);
  });
  offsets.assign(1, 0);
  ranks.clear();
  group_of_rank.assign(world, 0);
  index_of_rank.assign(world, 0);
  for (int i = 0; i < world; ++i) {
    const int r = order[i];
    if (i > 0 && (group_a[r] != group_a[order[i - 1]] || group_b[r] != group_b[order[i - 1]]))
      offsets.push_back(static_cast<int>(ranks.size()));
    group_of_rank[r] = static_cast<int>(offsets.size()) - 1;
    index_of_rank[r] = static_cast<int>(ranks.size()) - offsets.back();
    ranks.push_back(r);
  }
  offsets.push_back(world);
}

}  // namespace

RankLayout::RankLayout(ParallelConfig config) : config_(std::move(config)) {
  if (std::optional<std::string> error = check_config(config_)) throw InvalidConfig(*error);
  dp_ = topologies::dp(config_);
  edp_ = topologies::edp(config_);
  const int world = config_.world;
  dense_grid_ = detail::make_grid(config_, false);
  expert_grid_ = detail::make_grid(config_, true);
  const detail::Grid& dense = dense_grid_;
  const detail::Grid& expert = expert_grid_;

  for (const FamilySpec& spec : kGridFamilies) {
    FamilyTable& t = tables_[static_cast<int>(spec.family)];
    fill_grid_family(spec.expert ? expert : dense, spec.axes, world, t.offsets, t.ranks,
                     t.group_of_rank, t.index_of_rank);
  }

  // Embedding: the first and last rank of every pp group (default_embedding_ranks).
  {
    const FamilyTable& pp = table(Family::pp);
    FamilyTable& t = tables_[static_cast<int>(Family::embedding)];
    t.group_of_rank.assign(world, -1);
    t.index_of_rank.assign(world, -1);
    t.offsets.push_back(0);
    for (int g = 0; g + 1 < static_cast<int>(pp.offsets.size()); ++g) {
      const int first = pp.ranks[pp.offsets[g]];
      const int last = pp.ranks[pp.offsets[g + 1] - 1];
      for (int member : first == last ? std::vector<int>{first} : std::vector<int>{first, last}) {
        t.group_of_rank[member] = g;
        t.index_of_rank[member] = static_cast<int>(t.ranks.size()) - t.offsets.back();
        t.ranks.push_back(member);
      }
      t.offsets.push_back(static_cast<int>(t.ranks.size()));
    }
  }

  // World: one group of every rank.
  {
    FamilyTable& t = tables_[static_cast<int>(Family::world)];
    t.offsets = {0, world};
    t.ranks.resize(world);
    t.group_of_rank.assign(world, 0);
    t.index_of_rank.resize(world);
    for (int r = 0; r < world; ++r) t.ranks[r] = t.index_of_rank[r] = r;
  }

  // Distributed-optimizer instances: the expert tp-ep-pp groups concatenated edp/k at a time;
  // torch.distributed.new_group sorts the ranks, which fixes the ranks within the instance.
  // With GTP (k = 1 then) megatron-core 0.19 makes it every rank: the tp-ep-pp groups miss EGTP.
  {
    const FamilyTable& mp = table(Family::expt_tp_ep_pp);
    FamilyTable& t = tables_[static_cast<int>(Family::dist_opt)];
    const int k = config_.dist_opt_instances;
    const int per_instance =
        uses_gtp(config_) ? static_cast<int>(mp.offsets.size()) - 1 : edp_ / k;
    t.group_of_rank.assign(world, 0);
    t.index_of_rank.assign(world, 0);
    t.ranks.reserve(world);
    t.offsets.push_back(0);
    for (int instance = 0; instance < k; ++instance) {
      const auto begin = mp.ranks.begin() + mp.offsets[instance * per_instance];
      const auto end = mp.ranks.begin() + mp.offsets[(instance + 1) * per_instance];
      const std::size_t start = t.ranks.size();
      t.ranks.insert(t.ranks.end(), begin, end);
      std::sort(t.ranks.begin() + static_cast<std::ptrdiff_t>(start), t.ranks.end());
      for (std::size_t i = start; i < t.ranks.size(); ++i) {
        t.group_of_rank[t.ranks[i]] = instance;
        t.index_of_rank[t.ranks[i]] = static_cast<int>(i - start);
      }
      t.offsets.push_back(static_cast<int>(t.ranks.size()));
    }
  }

  // What a faulty clip reduces over with several instances: an instance's part of one stage
  // (clip-per-stage-norm) or of one EP rank (clip-per-ep-group-norm).
  for (const auto& [family, other] : {std::pair{Family::dist_opt_stage, Family::pp},
                                      std::pair{Family::dist_opt_without_ep, Family::expt_ep}}) {
    FamilyTable& t = tables_[static_cast<int>(family)];
    // pp groups hold one rank of each stage: a rank's stage is its index there; likewise EP.
    fill_intersection(table(Family::dist_opt).group_of_rank, table(other).index_of_rank, world,
                      t.offsets, t.ranks, t.group_of_rank, t.index_of_rank);
  }
  {  // both faults at once: the instance's part of one stage and one EP rank
    FamilyTable& t = tables_[static_cast<int>(Family::dist_opt_stage_without_ep)];
    fill_intersection(table(Family::dist_opt_stage).group_of_rank,
                      table(Family::expt_ep).index_of_rank, world, t.offsets, t.ranks,
                      t.group_of_rank, t.index_of_rank);
  }
}

int RankLayout::group_count(Family family) const {
  return static_cast<int>(table(family).offsets.size()) - 1;
}

std::span<const int> RankLayout::ranks(GroupId group) const {
  const FamilyTable& t = table(group.family);
  if (group.index < 0 || group.index >= group_count(group.family))
    throw std::out_of_range("group " + std::to_string(group.index) + " of family " +
                            std::string(family_name(group.family)) + " does not exist");
  return {t.ranks.data() + t.offsets[group.index],
          static_cast<std::size_t>(t.offsets[group.index + 1] - t.offsets[group.index])};
}

std::optional<GroupId> RankLayout::group_of(Family family, int rank) const {
  const int g = table(family).group_of_rank.at(rank);
  if (g < 0) return std::nullopt;
  return GroupId{family, g};
}

std::span<const int> RankLayout::group_ranks(Family family, int rank) const {
  const std::optional<GroupId> group = group_of(family, rank);
  return group ? ranks(*group) : std::span<const int>{};
}

int RankLayout::index_in(Family family, int rank) const {
  return table(family).index_of_rank.at(rank);
}

Coordinates RankLayout::coordinates(int rank) const {
  if (rank < 0 || rank >= world())
    throw std::out_of_range("rank " + std::to_string(rank) + " is outside world " +
                            std::to_string(world()));
  const detail::Grid& dense = dense_grid_;
  const detail::Grid& expert = expert_grid_;
  Coordinates c;
  c.tp = detail::coordinate(dense, rank, Axis::tp);
  c.cp = detail::coordinate(dense, rank, Axis::cp);
  c.dp = detail::coordinate(dense, rank, Axis::dp);
  c.pp = detail::coordinate(dense, rank, Axis::pp);
  c.gtp = detail::coordinate(dense, rank, Axis::gtp);
  c.etp = detail::coordinate(expert, rank, Axis::tp);
  c.ep = detail::coordinate(expert, rank, Axis::ep);
  c.edp = detail::coordinate(expert, rank, Axis::dp);
  c.egtp = detail::coordinate(expert, rank, Axis::gtp);
  return c;
}

}  // namespace tally::topologies
