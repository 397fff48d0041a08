#include "comm/sim_communicator.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tally::comm {

namespace {

std::uint64_t key_of(const topologies::GroupId& id) {
  return (static_cast<std::uint64_t>(id.family) << 32) | static_cast<std::uint32_t>(id.index);
}


template <typename T>
void reduce_in_group_order(std::vector<void*>& buffers, std::size_t length, ReduceOp op) {
  std::vector<T> result(static_cast<T*>(buffers[0]), static_cast<T*>(buffers[0]) + length);
  for (std::size_t m = 1; m < buffers.size(); ++m) {
    const T* values = static_cast<const T*>(buffers[m]);
    for (std::size_t i = 0; i < length; ++i) result[i] = reduce_pair(result[i], values[i], op);
  }
  for (void* buffer : buffers) std::copy(result.begin(), result.end(), static_cast<T*>(buffer));
}

}  // namespace

void SimCommunicator::all_reduce(int rank, const Group& group, std::span<double> values,
                                 ReduceOp op, std::string_view label) {
  contribute(rank, group, values.data(), values.size(), ElementType::f64, op, label);
}

void SimCommunicator::all_reduce(int rank, const Group& group, std::span<std::int64_t> values,
                                 ReduceOp op, std::string_view label) {
  contribute(rank, group, values.data(), values.size(), ElementType::i64, op, label);
}

void SimCommunicator::contribute(int rank, const Group& group, void* data, std::size_t length,
                                 ElementType type, ReduceOp op, std::string_view label) {
  const int member = layout_.index_in(group.id.family, rank);
  if (member < 0 || member >= static_cast<int>(group.ranks.size()) || group.ranks[member] != rank)
    throw std::logic_error("rank " + std::to_string(rank) + " is not a member of " +
                           describe(group));
  GroupState& state = groups_[key_of(group.id)];
  if (state.calls_by_member.empty()) state.calls_by_member.assign(group.ranks.size(), 0);
  const std::int64_t sequence = state.calls_by_member[member]++;
  while (state.first_pending + static_cast<std::int64_t>(state.pending.size()) <= sequence)
    state.pending.push_back(Pending{op, type, length, std::string(label),
                                    std::vector<void*>(group.ranks.size(), nullptr), 0});
  Pending& collective = state.pending[static_cast<std::size_t>(sequence - state.first_pending)];
  if (collective.op != op || collective.type != type || collective.length != length)
    throw mismatched_collective(rank, group, op, length, label, collective.op,
                                collective.length, collective.label);
  collective.buffers[member] = data;
  if (++collective.arrived < static_cast<int>(group.ranks.size())) return;
  complete(group, collective);
  // Completed collectives leave from the front; one completed behind a pending one waits.
  while (!state.pending.empty() && state.pending.front().arrived < 0) {
    state.pending.pop_front();
    ++state.first_pending;
  }
}

void SimCommunicator::complete(const Group&, Pending& collective) {
  if (collective.type == ElementType::f64)
    reduce_in_group_order<double>(collective.buffers, collective.length, collective.op);
  else
    reduce_in_group_order<std::int64_t>(collective.buffers, collective.length, collective.op);
  collective.arrived = -1;  // done
  ++completed_;
}

void SimCommunicator::end_phase() {
  for (auto& [key, state] : groups_) {
    for (const Pending& collective : state.pending) {
      if (collective.arrived < 0) continue;
      const topologies::GroupId id{static_cast<topologies::Family>(key >> 32),
                                   static_cast<int>(key & 0xffffffffu)};
      const Group group{id, layout_.ranks(id)};
      std::string missing;
      int missing_count = 0;
      for (std::size_t m = 0; m < collective.buffers.size(); ++m) {
        if (collective.buffers[m]) continue;
        if (++missing_count <= 8) missing += (missing.empty() ? "" : ",") + std::to_string(group.ranks[m]);
      }
      if (missing_count > 8) missing += ",... (" + std::to_string(missing_count) + " ranks)";
      const std::string call = "all_reduce(" + std::string(op_name(collective.op)) + ") '" +
                               collective.label + "' on " + describe(group);
      throw InfraError(call, call + " never completed: rank(s) " + missing +
                                 " did not join (the job would hang)");
    }
  }
  groups_.clear();
}

}  // namespace tally::comm
