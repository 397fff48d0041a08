// ParallelConfig: the sizes of one Megatron-LM parallel configuration, and the rules
// (docs/megatron-reference.md §4) that decide whether Megatron-LM accepts it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tally::topologies {

// The five tokens of Megatron-LM's `order` string, then `gtp` (megatron-core 0.19's
// `gtp_remat`), which no order names: initialize_model_parallel injects it after `tp` in the
// dense grid and after `ep` in the expert grid. In the dense grid `ep` has size 1; in the
// expert grid `cp` has size 1, `tp` means ETP, `gtp` means EGTP and `dp` means EDP.
enum class Axis : std::uint8_t { tp, cp, ep, dp, pp, gtp };
inline constexpr int kAxisCount = 5;  // the tokens of an order string
inline constexpr std::array<Axis, kAxisCount> kAllAxes = {Axis::tp, Axis::cp, Axis::ep, Axis::dp,
                                                          Axis::pp};
inline constexpr int kGridAxisCount = 6;  // the axes of a rank grid
std::string_view axis_token(Axis axis);   // "tp", ..., "gtp_remat"

// An order string resolved to all five tokens, fastest-varying first. Megatron-LM appends axes
// missing from the string in the order tp, pp, dp, ep, cp; they must have size 1 there.
using AxisOrder = std::array<Axis, kAxisCount>;
// The axes of one grid, fastest first: the order string with gtp injected, then the missing
// tokens appended (RankGenerator appends after the injection).
using GridOrder = std::array<Axis, kGridAxisCount>;

// tally's own bound: a RankLayout holds every group of every family in memory.
inline constexpr int kMaxWorld = 1 << 20;

inline constexpr std::string_view kDefaultOrder = "tp-cp-ep-dp-pp";

struct ParallelConfig {
  int world = 1;
  int tp = 1;
  int cp = 1;
  int pp = 1;
  int ep = 1;
  int etp = 1;  // callers that mirror Megatron-LM's default pass etp = tp
  // Generalized TP (megatron-core 0.19): weight shards per TP rank of the dense and the expert
  // grid (gtp_weight_remat_size, expert_gtp_weight_remat_size); 1 is plain TP.
  int gtp = 1;
  int egtp = 1;
  int vpp = 1;  // virtual pipeline chunks per stage
  std::string order = std::string(kDefaultOrder);
  int dist_opt_instances = 1;

  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

// Derived sizes. Only meaningful for a configuration that passes check_config.
int dp(const ParallelConfig& config);
// Whether `config.order` is tally's default order in any spelling ("tp-cp-ep-dp-pp", "tp-dp").
bool has_default_order(const ParallelConfig& config);   // world / (tp * gtp * cp * pp): the replicate degree
int edp(const ParallelConfig& config);  // world / (etp * ep * egtp * pp)
bool uses_gtp(const ParallelConfig& config);  // gtp > 1 or egtp > 1

// Parses an order string ("tp-cp-ep-dp-pp", "tp-dp", ...). On error returns nullopt and sets
// `error` to a one-line message naming the string and the broken rule.
std::optional<AxisOrder> parse_order(std::string_view order, std::string* error);

// The canonical form of an order: all five tokens, missing ones appended as Megatron-LM does.
std::string order_string(const AxisOrder& order);

// The first rule of Megatron-LM's initialize_model_parallel (plus its argument checks for vpp)
// that `config` breaks, as one line naming the sizes and the rule; nullopt when it is valid.
std::optional<std::string> check_config(const ParallelConfig& config);

// The axes of the dense (expert = false) or expert grid of a configuration that passes
// check_config, as megatron-core 0.19's _inject_gtp_remat_axis and RankGenerator order them.
// With gtp = egtp = 1 the injected axis has size 1 and the grid is 0.16.1's.
GridOrder grid_order(const ParallelConfig& config, bool expert);

// "world 8, tp 2, cp 1, pp 1, ep 4, etp 1, order tp-cp-ep-dp-pp" for messages (", gtp 2,
// egtp 1" added when either is > 1).
std::string describe(const ParallelConfig& config);

}  // namespace tally::topologies
