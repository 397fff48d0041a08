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

std::string_view op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "max"; }

}  // namespace tally::comm
