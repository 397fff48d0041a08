#include "topologies/parallel_config.h"

#include <algorithm>
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
  }
  return "?";
}

int dp(const ParallelConfig& c) { return c.world / (c.tp * c.cp * c.pp); }
int edp(const ParallelConfig& c) { return c.world / (c.etp * c.ep * c.pp); }

namespace {

std::optional<Axis> axis_from_token(std::string_view token) {
  for (Axis axis : kAllAxes)
    if (axis_token(axis) == token) return axis;
  return std::nullopt;
}

// Megatron-LM's RankGenerator appends missing axes in the order of its name_to_size table.
constexpr std::array<Axis, kAxisCount> kAppendOrder = {Axis::tp, Axis::pp, Axis::dp, Axis::ep,
                                                       Axis::cp};

}  // namespace

std::optional<AxisOrder> parse_order(std::string_view order, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<AxisOrder> {
    if (error) *error = "order '" + std::string(order) + "' " + why;
    return std::nullopt;
  };
  AxisOrder result{};
  std::array<bool, kAxisCount> seen{};
  int count = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t dash = order.find('-', start);
    const std::string_view token =
        order.substr(start, dash == std::string_view::npos ? std::string_view::npos : dash - start);
    if (token.empty()) return fail("has an empty token (write tokens joined by '-', e.g. tp-cp-ep-dp-pp)");
    const std::optional<Axis> axis = axis_from_token(token);
    if (!axis) return fail("has unknown token '" + std::string(token) + "' (tokens: tp, cp, ep, dp, pp)");
    if (seen[static_cast<int>(*axis)]) return fail("repeats token '" + std::string(token) + "'");
    seen[static_cast<int>(*axis)] = true;
    result[count++] = *axis;
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  for (Axis axis : kAppendOrder)
    if (!seen[static_cast<int>(axis)]) result[count++] = axis;
  return result;
}

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
      << c.ep << ", etp " << c.etp << ", order " << c.order;
  return out.str();
}

AxisOrder resolved_order(const ParallelConfig& c) {
  std::optional<AxisOrder> order = parse_order(c.order, nullptr);
  return order ? *order : AxisOrder{};
}

std::optional<std::string> check_config(const ParallelConfig& c) {
  using std::to_string;
  const std::array<std::pair<const char*, int>, 8> sizes = {{{"world", c.world},
                                                             {"tp", c.tp},
                                                             {"cp", c.cp},
                                                             {"pp", c.pp},
                                                             {"ep", c.ep},
                                                             {"etp", c.etp},
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

  // Products are formed in 64 bits: sizes are validated one by one, not their product.
  const std::int64_t model = std::int64_t{c.tp} * c.cp * c.pp;
  if (model > c.world || c.world % model != 0)
    return "world " + to_string(c.world) + " is not divisible by tp*cp*pp = " + to_string(model);
  const std::int64_t expert_model = std::int64_t{c.etp} * c.ep * c.pp;
  if (expert_model > c.world || c.world % expert_model != 0)
    return "world " + to_string(c.world) + " is not divisible by etp*ep*pp = " +
           to_string(expert_model);

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
    const detail::Grid dense = detail::make_grid(c, *order, false);
    const detail::Grid expert = detail::make_grid(c, *order, true);
    const int at = detail::position_of(dense, Axis::pp);
    if (dense.stride[at] != expert.stride[at])
      return "pipeline groups differ between the dense grid (pp stride " +
             to_string(dense.stride[at]) + ") and the expert grid (pp stride " +
             to_string(expert.stride[at]) + ") under order '" + c.order +
             "': Megatron-LM requires identical pp groups (tp " + to_string(c.tp) + ", etp " +
             to_string(c.etp) + ", ep " + to_string(c.ep) + ", cp " + to_string(c.cp) + ")";
  }

  if (c.vpp > 1 && c.pp == 1)
    return "vpp " + to_string(c.vpp) +
           " needs pp > 1 (the interleaved schedule splits each pipeline stage)";

  const int k = c.dist_opt_instances;
  if ((std::int64_t{dense_dp} * c.cp) % k != 0)
    return "dist_opt_instances " + to_string(k) + " does not divide dp*cp = " +
           to_string(std::int64_t{dense_dp} * c.cp);
  if (expert_dp % k != 0)
    return "dist_opt_instances " + to_string(k) + " does not divide edp = " + to_string(expert_dp);
  return std::nullopt;
}

}  // namespace tally::topologies
