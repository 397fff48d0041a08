// RankLayout: every process group of a parallel configuration, laid out exactly as
// Megatron-LM's RankGenerator and initialize_model_parallel lay them out.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "topologies/detail/grid.h"
#include "topologies/parallel_config.h"

namespace tally::topologies {

// Group families, named by Megatron-LM's tokens. Dense grid first, then the expert grid, then
// the groups initialize_model_parallel derives from them.
enum class Family : std::uint8_t {
  tp,
  cp,
  dp,        // the replicate DP: with GTP, world / (tp * gtp * cp * pp)
  dp_cp,
  pp,
  tp_pp,     // the model-parallel group (MP): tp-gtp_remat-pp from megatron-core 0.19
  tp_cp,
  tp_dp_cp,  // spans gtp_remat from 0.19
  tp_dp,     // spans gtp_remat from 0.19
  expt_tp,   // ETP
  expt_ep,
  expt_dp,   // EDP (the replicate expert DP)
  expt_tp_ep,
  expt_tp_ep_pp,
  embedding,  // first and last rank of each pp group; middle stages belong to none
  world,
  dist_opt,   // the ranks of one distributed-optimizer instance (the world when k = 1 or GTP)
  // megatron-core 0.19's generalized-TP groups (singletons, or equal to the groups above
  // without gtp_remat, when gtp = egtp = 1).
  gtp,                // gtp_remat: the ranks holding the GTP shards of one TP shard
  gtp_dp,             // gtp_remat-dp: the full data-distribution group
  gtp_dp_cp,          // gtp_remat-dp-cp
  expt_gtp,           // expert gtp_remat (EGTP)
  expt_gtp_dp,        // expert gtp_remat-dp
  expt_tp_ep_gtp_pp,  // tp-ep-gtp_remat-pp: the expert stats group of a non-distributed optimizer
  // Not Megatron-LM groups: the groups a faulty path reduces over when it misses an axis.
  expt_tp_pp,      // expt-tp-ep-pp without the EP axis
  expt_tp_dp_pp,   // the world without the EP axis
  expt_tp_dp,      // one pipeline stage without the EP axis
  tp_gtp,          // tp-pp without the PP axis
  expt_tp_ep_gtp,  // expt-tp-ep-gtp-pp without the PP axis
  expt_tp_gtp,     // expt-tp-ep-gtp-pp without the PP and EP axes
  dist_opt_stage,  // one distributed-optimizer instance's ranks on one pipeline stage
  dist_opt_without_ep,  // one instance's ranks of one EP rank
  dist_opt_stage_without_ep,  // one instance's ranks of one stage and one EP rank
  expt_tp_gtp_pp,  // expt-tp-ep-gtp-pp without the EP axis
};
inline constexpr int kFamilyCount = 33;
// The groups Megatron-LM creates, in the order `tally topo` prints them: 0.16.1's, then the
// generalized-TP ones of megatron-core 0.19.
inline constexpr std::size_t kMegatron0161FamilyCount = 17;
inline constexpr std::array<Family, 23> kMegatronFamilies = {
    Family::tp,         Family::cp,         Family::dp,      Family::dp_cp,
    Family::pp,         Family::tp_pp,      Family::tp_cp,   Family::tp_dp_cp,
    Family::tp_dp,      Family::expt_tp,    Family::expt_ep, Family::expt_dp,
    Family::expt_tp_ep, Family::expt_tp_ep_pp, Family::embedding, Family::world,
    Family::dist_opt,   Family::gtp,        Family::gtp_dp,  Family::gtp_dp_cp,
    Family::expt_gtp,   Family::expt_gtp_dp, Family::expt_tp_ep_gtp_pp};
inline constexpr std::array<Family, kFamilyCount> kAllFamilies = {
    Family::tp,         Family::cp,         Family::dp,      Family::dp_cp,
    Family::pp,         Family::tp_pp,      Family::tp_cp,   Family::tp_dp_cp,
    Family::tp_dp,      Family::expt_tp,    Family::expt_ep, Family::expt_dp,
    Family::expt_tp_ep, Family::expt_tp_ep_pp, Family::embedding, Family::world,
    Family::dist_opt,   Family::gtp,        Family::gtp_dp,  Family::gtp_dp_cp,
    Family::expt_gtp,   Family::expt_gtp_dp, Family::expt_tp_ep_gtp_pp,
    Family::expt_tp_pp, Family::expt_tp_dp_pp, Family::expt_tp_dp, Family::tp_gtp,
    Family::expt_tp_ep_gtp, Family::expt_tp_gtp, Family::dist_opt_stage,
    Family::dist_opt_without_ep, Family::dist_opt_stage_without_ep, Family::expt_tp_gtp_pp};

// The Megatron-LM families of a configuration: 0.16.1's seventeen, then megatron-core 0.19's
// generalized-TP ones when gtp or egtp > 1 (otherwise they repeat groups of the first).
std::span<const Family> megatron_families(const ParallelConfig& config);

std::string_view family_name(Family family);  // "tp", "dp-cp", "expt-tp-ep-pp", ...
std::optional<Family> family_from_name(std::string_view name);

// One group of one family: the `index`-th group Megatron-LM creates for it.
struct GroupId {
  Family family = Family::world;
  int index = 0;
  friend bool operator==(const GroupId&, const GroupId&) = default;
};

// A rank's position on every axis of both grids (pp is shared by both).
struct Coordinates {
  int tp = 0, cp = 0, dp = 0, pp = 0, gtp = 0;  // dense grid
  int etp = 0, ep = 0, edp = 0, egtp = 0;       // expert grid
  friend bool operator==(const Coordinates&, const Coordinates&) = default;
};

class InvalidConfig : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Immutable once built. Each group lists its ranks in ascending order, which is both the order
// RankGenerator produces and the order torch.distributed assigns group ranks in; a rank's
// index in that list is its rank in the group.
class RankLayout {
 public:
  // Throws InvalidConfig with check_config's message when the configuration is not valid.
  explicit RankLayout(ParallelConfig config);

  const ParallelConfig& config() const { return config_; }
  int world() const { return config_.world; }
  int dp() const { return dp_; }
  int edp() const { return edp_; }

  int group_count(Family family) const;
  std::span<const int> ranks(GroupId group) const;

  // The group of `family` that holds `rank`; nullopt only for embedding on middle stages.
  std::optional<GroupId> group_of(Family family, int rank) const;
  // The ranks of that group (empty when there is none).
  std::span<const int> group_ranks(Family family, int rank) const;
  // `rank`'s index in its group of `family`; -1 when it belongs to none.
  int index_in(Family family, int rank) const;

  Coordinates coordinates(int rank) const;

 private:
  struct FamilyTable {
    std::vector<int> offsets;        // group g holds ranks[offsets[g] .. offsets[g+1])
    std::vector<int> ranks;
    std::vector<int> group_of_rank;  // -1: in no group of this family
    std::vector<int> index_of_rank;
  };
  const FamilyTable& table(Family family) const { return tables_[static_cast<int>(family)]; }

  ParallelConfig config_;
  int dp_ = 1;
  int edp_ = 1;
  detail::Grid dense_grid_, expert_grid_;  // built once: coordinates() reads them per rank
  std::array<FamilyTable, kFamilyCount> tables_;
};

}  // namespace tally::topologies
