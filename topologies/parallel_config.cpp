#include "topologies/parallel_config.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "topologies/detail/grid.h"

namespace tally::topologies {

std::string_view axis_token(Axis axis) {
  switch (axis) {
    case Axis::tp: return "tp";
    case Axis::cp: return "cp";
    case Axis::ep: return "ep";
    case Axis::dp: return "dp";
    case Axis::pp: return "pp";
    case Axis::gtp: return "gtp_remat";
  }
  return "?";
}

int dp(const ParallelConfig& c) { return c.world / (c.tp * c.gtp * c.cp * c.pp); }
int edp(const ParallelConfig& c) { return c.world / (c.etp * c.ep * c.egtp * c.pp); }
bool has_default_order(const ParallelConfig& c) {
  std::string error;
  const std::optional<AxisOrder> order = parse_order(c.order, &error);
  return order && order == parse_order(kDefaultOrder, &error);
}

bool uses_gtp(const ParallelConfig& c) { return c.gtp > 1 || c.egtp > 1; }

namespace {

std::optional<Axis> axis_from_token(std::string_view token) {
  for (Axis axis : kAllAxes)
    if (axis_token(axis) == token) return axis;
  return std::nullopt;
}

// Megatron-LM's RankGenerator appends missing axes in the order of its name_to_size table.
constexpr std::array<Axis, kAxisCount> kAppendOrder = {Axis::tp, Axis::pp, Axis::dp, Axis::ep,
                                                       Axis::cp};

// The tokens the order string names, in its order; the count is returned (0 on error).
int given_tokens(std::string_view order, AxisOrder& tokens, std::string* error);

}  // namespace

std::optional<AxisOrder> parse_order(std::string_view order, std::string* error) {
  AxisOrder result{};
  const int count = given_tokens(order, result, error);
  if (count == 0) return std::nullopt;
  std::array<bool, kAxisCount> seen{};
  for (int i = 0; i < count; ++i) seen[static_cast<int>(result[i])] = true;
  int at = count;
  for (Axis axis : kAppendOrder)
    if (!seen[static_cast<int>(axis)]) result[at++] = axis;
  return result;
}

GridOrder grid_order(const ParallelConfig& c, bool expert) {
  AxisOrder tokens{};
  const int count = given_tokens(c.order, tokens, nullptr);
  // _inject_gtp_remat_axis: after the anchor (ep for the expert grid, tp for the dense one),
  // after tp when the anchor is missing, first when tp is missing too.
  auto index_of = [&](Axis axis) {
    for (int i = 0; i < count; ++i)
      if (tokens[i] == axis) return i;
    return -1;
  };
  int anchor = index_of(expert ? Axis::ep : Axis::tp);
  if (anchor < 0) anchor = index_of(Axis::tp);
  const int insert_at = anchor + 1;  // 0 when neither is named
  GridOrder grid{};
  int at = 0;
  std::array<bool, kAxisCount> seen{};
  for (int i = 0; i < count; ++i) {
    if (i == insert_at) grid[at++] = Axis::gtp;
    grid[at++] = tokens[i];
    seen[static_cast<int>(tokens[i])] = true;
  }
  if (insert_at == count) grid[at++] = Axis::gtp;
  for (Axis axis : kAppendOrder)
    if (!seen[static_cast<int>(axis)]) grid[at++] = axis;
  return grid;
}

namespace {

int given_tokens(std::string_view order, AxisOrder& result, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = "order '" + std::string(order) + "' " + why;
    return 0;
  };
  std::array<bool, kAxisCount> seen{};
  int count = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t dash = order.find('-', start);
    const std::string_view token =
        order.substr(start, dash == std::string_view::npos ? std::string_view::npos : dash - start);
    if (token.empty()) return fail("has an empty token (write tokens joined by '-', e.g. tp-cp-ep-dp-pp)");
    const std::optional<Axis> axis = axis_from_token(token);
    if (!axis)
      return fail("has unknown token '" + std::string(token) +
                  "' (tokens: tp, cp, ep, dp, pp; the gtp_remat axis is placed by Megatron-LM, "
                  "after tp in the dense grid and after ep in the expert grid)");
    if (seen[static_cast<int>(*axis)]) return fail("repeats token '" + std::string(token) + "'");
    seen[static_cast<int>(*axis)] = true;
    result[count++] = *axis;
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  return count;
}

}  // namespace

std::string order_string(const AxisOrder& order) {
  std::string out;
  for (Axis axis : order) {
    if (!out.empty()) out += '-';
    out += axis_token(axis);
  }
  return out;
}

std::string describe(const ParallelConfig& c) {
  std::ostringstream out;
  out << "world " << c.world << ", tp " << c.tp << ", cp " << c.cp << ", pp " << c.pp << ", ep "
      << c.ep << ", etp " << c.etp;
  if (uses_gtp(c)) out << ", gtp " << c.gtp << ", egtp " << c.egtp;
  out << ", order " << c.order;
  return out.str();
}

std::optional<std::string> check_config(const ParallelConfig& c) {
  using std::to_string;
  const std::array<std::pair<const char*, int>, 10> sizes = {{{"world", c.world},
                                                              {"tp", c.tp},
                                                              {"cp", c.cp},
                                                              {"pp", c.pp},
                                                              {"ep", c.ep},
                                                              {"etp", c.etp},
                                                              {"gtp", c.gtp},
                                                              {"egtp", c.egtp},
                                                              {"vpp", c.vpp},
                                                              {"dist_opt_instances", c.dist_opt_instances}}};
  for (const auto& [name, value] : sizes)
    if (value < 1) return std::string(name) + " must be at least 1 (got " + to_string(value) + ")";

  if (c.world > kMaxWorld)
    return "world " + to_string(c.world) + " is larger than tally supports (at most " +
           to_string(kMaxWorld) + " ranks)";

  std::string order_error;
  const std::optional<AxisOrder> order = parse_order(c.order, &order_error);
  if (!order) return order_error;

  // Each size is at most 2^20, so a product of four could pass 2^63: stop past the world.
  auto product_within_world = [&c](std::initializer_list<int> sizes) {
    std::int64_t product = 1;
    for (int size : sizes) product = std::min<std::int64_t>(product * size, std::int64_t{c.world} + 1);
    return product;
  };
  const bool gtp = uses_gtp(c);
  const std::int64_t model = product_within_world({c.tp, c.cp, c.pp, c.gtp});
  // The message shows the whole product, exact in a long double's 64-bit mantissa up to 2^64.
  auto not_divisible = [&c](const char* what, std::initializer_list<int> sizes) {
    long double product = 1;
    for (int size : sizes) product *= size;
    std::ostringstream text;
    text << std::fixed << std::setprecision(0) << product;
    return "world " + to_string(c.world) + " is not divisible by " + what + " = " + text.str();
  };
  if (model > c.world || c.world % model != 0)
    return not_divisible(gtp ? "tp*gtp*cp*pp" : "tp*cp*pp", {c.tp, c.cp, c.pp, c.gtp});
  const std::int64_t expert_model = product_within_world({c.etp, c.ep, c.pp, c.egtp});
  if (expert_model > c.world || c.world % expert_model != 0)
    return not_divisible(gtp ? "etp*ep*egtp*pp" : "etp*ep*pp", {c.etp, c.ep, c.pp, c.egtp});

  // An axis left out of the order string must have size 1 in both grids (RankGenerator).
  const int given = static_cast<int>(std::count(c.order.begin(), c.order.end(), '-')) + 1;
  for (int i = given; i < kAxisCount; ++i) {
    const Axis axis = (*order)[i];
    for (bool expert : {false, true}) {
      const int size = detail::axis_size(c, axis, expert);
      if (size != 1) {
        const char* name = axis == Axis::tp ? (expert ? "etp" : "tp")
                           : axis == Axis::dp ? (expert ? "edp" : "dp")
                                              : axis_token(axis).data();
        return "order '" + c.order + "' omits " + std::string(axis_token(axis)) + ", but " +
               name + " = " + to_string(size) + " (an axis left out of the order must have size 1)";
      }
    }
  }

  const int dense_dp = dp(c);
  const int expert_dp = edp(c);
  const bool pp_last = std::string_view(c.order).ends_with("pp");
  if (!pp_last && c.pp > 1 && expert_dp != dense_dp)
    return "order '" + c.order + "' does not end in pp and pp = " + to_string(c.pp) +
           ", so edp (" + to_string(expert_dp) + ") must equal dp (" + to_string(dense_dp) + ")";

  // The pp groups of both grids are {base + i * stride}: they coincide iff the strides do.
  if (c.pp > 1) {
    const detail::Grid dense = detail::make_grid(c, false);
    const detail::Grid expert = detail::make_grid(c, true);
    // gtp_remat sits at a different place in each grid, so pp may too.
    const int dense_stride = dense.stride[detail::position_of(dense, Axis::pp)];
    const int expert_stride = expert.stride[detail::position_of(expert, Axis::pp)];
    if (dense_stride != expert_stride)
      return "pipeline groups differ between the dense grid (pp stride " +
             to_string(dense_stride) + ") and the expert grid (pp stride " +
             to_string(expert_stride) + ") under order '" + c.order +
             "': Megatron-LM requires identical pp groups (tp " + to_string(c.tp) + ", etp " +
             to_string(c.etp) + ", ep " + to_string(c.ep) + ", cp " + to_string(c.cp) +
             (gtp ? ", gtp " + to_string(c.gtp) + " after tp, egtp " + to_string(c.egtp) + " after ep"
                  : std::string()) +
             ")";
  }

  if (c.vpp > 1 && c.pp == 1)
    return "vpp " + to_string(c.vpp) +
           " needs pp > 1 (the interleaved schedule splits each pipeline stage)";

  const int k = c.dist_opt_instances;
  // megatron-core 0.19 asserts this before building any group.
  if (gtp && k > 1)
    return "dist_opt_instances " + to_string(k) + " with gtp " + to_string(c.gtp) + ", egtp " +
           to_string(c.egtp) +
           ": Megatron-LM supports generalized TP with one distributed-optimizer instance only";
  if ((std::int64_t{dense_dp} * c.cp) % k != 0)
    return "dist_opt_instances " + to_string(k) + " does not divide dp*cp = " +
           to_string(std::int64_t{dense_dp} * c.cp);
  if (expert_dp % k != 0)
    return "dist_opt_instances " + to_string(k) + " does not divide edp = " + to_string(expert_dp);
  return std::nullopt;
}

}  // namespace tally::topologies
