#include "comm/communicator.h"

namespace tally::comm {

Group group_of(const topologies::RankLayout& layout, topologies::Family family, int rank) {
  const std::optional<topologies::GroupId> id = layout.group_of(family, rank);
  if (!id)
    throw std::logic_error("rank " + std::to_string(rank) + " belongs to no " +
                           std::string(topologies::family_name(family)) + " group");
  return Group{*id, layout.ranks(*id)};
}

std::string describe(const Group& group) {
  std::string out = std::string(topologies::family_name(group.id.family)) + " group " +
                    std::to_string(group.id.index) + " [";
  const std::size_t shown = group.ranks.size() > 16 ? 8 : group.ranks.size();
  for (std::size_t i = 0; i < shown; ++i) out += (i ? "," : "") + std::to_string(group.ranks[i]);
  if (shown < group.ranks.size())
    out += ",...," + std::to_string(group.ranks.back()) + "] (" +
           std::to_string(group.ranks.size()) + " ranks)";
  else
    out += "]";
  return out;
}

InfraError mismatched_collective(int rank, const Group& group, ReduceOp op, std::size_t length,
                                 std::string_view label, ReduceOp their_op,
                                 std::size_t their_length, std::string_view their_label) {
  return InfraError("all_reduce(" + std::string(op_name(op)) + ") '" + std::string(label) +
                        "' on " + describe(group),
                    "rank " + std::to_string(rank) + " issued all_reduce(" +
                        std::string(op_name(op)) + ", " + std::to_string(length) + " values) '" +
                        std::string(label) + "' where other members of " + describe(group) +
                        " issued all_reduce(" + std::string(op_name(their_op)) + ", " +
                        std::to_string(their_length) + " values) '" + std::string(their_label) +
                        "'");
}

void pack_for_max(std::span<const double> values, std::span<double> packed) {
  const std::size_t n = values.size();
  for (std::size_t i = 0; i < n; ++i) {
    const bool nan = std::isnan(values[i]);
    packed[i] = nan ? std::numeric_limits<double>::infinity() : values[i];
    packed[n + i] = nan ? 1.0 : 0.0;
  }
}

void unpack_max(std::span<const double> packed, std::span<double> values) {
  const std::size_t n = values.size();
  for (std::size_t i = 0; i < n; ++i)
    values[i] = packed[n + i] > 0.0 ? std::numeric_limits<double>::quiet_NaN() : packed[i];
}

std::string_view op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "max"; }

}  // namespace tally::comm
