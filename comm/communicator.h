// Communicator: the all-reduces the grad-norm path issues, over groups of a RankLayout.
//
// Contract shared by every backend (sim, mpi, nccl):
// - Every member of a group calls all_reduce once per collective, and all members issue their
//   collectives on that group in the same order with the same op, element type and length.
// - The path is written in phases: a rank may read a result only after the phase in which it
//   issued the collective has ended (blocking backends complete on return; `sim` completes a
//   collective when its last member arrives, which may be a later rank of the same phase).
// - A collective that some member never joins is an infrastructure failure (InfraError), never
//   a wrong number: backends detect it (sim at the end of the phase, mpi/nccl by a watchdog).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "topologies/rank_layout.h"

namespace tally::comm {

// A process group of a RankLayout: which one (for naming and for backends that hold one
// communicator per group) and its ranks in group order.
struct Group {
  topologies::GroupId id;
  std::span<const int> ranks;
};

// The group of `family` that holds `rank`. Throws std::logic_error when the rank belongs to none
// (only the embedding family has such ranks): a path that needs a group must name one that exists.
Group group_of(const topologies::RankLayout& layout, topologies::Family family, int rank);

// "tp-pp group 3 [0,1,4,5]" for messages (rank lists longer than 16 are abbreviated).
std::string describe(const Group& group);

enum class ReduceOp : std::uint8_t { sum, max };
std::string_view op_name(ReduceOp op);

// One element of a reduction, as every communicator reduces it. max propagates NaN: a NaN
// anywhere gives NaN, so a NaN gradient can never hide behind a larger value.
template <typename T>
T reduce_pair(T a, T b, ReduceOp op) {
  if (op == ReduceOp::sum) return a + b;
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return a > b ? a : b;
}

// The library max of MPI and NCCL (MPI_MAX, ncclMax) leaves NaN to the implementation. So the
// mpi and nccl backends reduce a max of doubles as a packed buffer of twice the length, each
// value with NaN read as +inf, then a 1 where it was NaN, else 0; the library max of packed
// buffers, unpacked, is reduce_pair's max of the values.
void pack_for_max(std::span<const double> values, std::span<double> packed);
void unpack_max(std::span<const double> packed, std::span<double> values);

// An infrastructure failure: a hang caught by a watchdog, a mismatched collective, an MPI, NCCL
// or CUDA error. `call` names what was waiting or failing. Distinct from any counting verdict.
class InfraError : public std::runtime_error {
 public:
  InfraError(std::string call, const std::string& message)
      : std::runtime_error(message), call_(std::move(call)) {}
  const std::string& call() const { return call_; }

 private:
  std::string call_;
};

// The error when members of `group` issue different collectives at the same position: `rank`
// issued (op, length, label) where the others issued (their_op, their_length, their_label).
InfraError mismatched_collective(int rank, const Group& group, ReduceOp op, std::size_t length,
                                 std::string_view label, ReduceOp their_op,
                                 std::size_t their_length, std::string_view their_label);

class Communicator {
 public:
  virtual ~Communicator() = default;

  // `rank` contributes `values` and receives the reduction over `group` in place. `label` names
  // the statistic for error messages ("dense grad stats").
  virtual void all_reduce(int rank, const Group& group, std::span<double> values, ReduceOp op,
                          std::string_view label) = 0;
  virtual void all_reduce(int rank, const Group& group, std::span<std::int64_t> values,
                          ReduceOp op, std::string_view label) = 0;

  // Ends a phase: every collective issued so far must be complete. Throws InfraError naming the
  // group, the collective and the ranks that never joined otherwise.
  virtual void end_phase() = 0;
};

}  // namespace tally::comm
