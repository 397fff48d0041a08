// SimCommunicator: every rank in one process. A collective completes when its last member
// arrives; the reduction runs over the contributions in group order (sum: ((v0 + v1) + v2)...),
// so results are deterministic: the same bits on every run and for every member.
#pragma once

#include <deque>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"

namespace tally::comm {

class SimCommunicator final : public Communicator {
 public:
  explicit SimCommunicator(const topologies::RankLayout& layout) : layout_(layout) {}

  void all_reduce(int rank, const Group& group, std::span<double> values, ReduceOp op,
                  std::string_view label) override;
  void all_reduce(int rank, const Group& group, std::span<std::int64_t> values, ReduceOp op,
                  std::string_view label) override;
  void end_phase() override;

  // Collectives completed so far (for benchmarks and tests).
  std::int64_t completed() const { return completed_; }

 private:
  enum class ElementType : std::uint8_t { f64, i64 };
  struct Pending {
    ReduceOp op;
    ElementType type;
    std::size_t length;
    std::string label;
    std::vector<void*> buffers;  // by member index; null until that member arrives
    int arrived = 0;
  };
  struct GroupState {
    std::vector<std::int64_t> calls_by_member;
    std::int64_t first_pending = 0;  // sequence number of pending.front()
    std::deque<Pending> pending;
  };

  void contribute(int rank, const Group& group, void* data, std::size_t length, ElementType type,
                  ReduceOp op, std::string_view label);
  void complete(const Group& group, Pending& collective);

  const topologies::RankLayout& layout_;
  std::unordered_map<std::uint64_t, GroupState> groups_;
  std::int64_t completed_ = 0;
};

}  // namespace tally::comm
