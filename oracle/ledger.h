// The exact ledger of a run record: for every rank, how many times its norm (each counted norm
// group) and its zero count count every logical element, from the keep decisions its stats
// groups' members recorded. Expected: each element once in its own norm group, never in
// another, and once in the zero count.
//
// How. Every piece is a row-major range of a box; cut into maximal runs of contiguous logical
// indices, the pieces' boundaries split each tensor into atoms, runs of elements that every
// piece either covers whole or not at all. A child's reduction over its stats group counts, per
// atom, the pieces its members kept (a difference array per group). A rank's ledger is the sum
// over its children's groups. So a strided distributed-optimizer range, or an element counted
// twice while another is missed, is seen element by element, not only in a total.
//
// Cost: ranks that hold and decide alike share a LocalRecord; groups whose members share theirs
// are summed once, and ranks whose children reduce over identically composed groups are judged
// once. Roughly O(distinct local records x pieces + world x children + distinct groups x atoms).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "record/run_record.h"

namespace tally::oracle {

// Ledger index: 0 .. norm_groups - 1 for the norm groups, norm_groups for the zero count.
inline int zero_count_ledger(const record::RunRecord& run) {
  return static_cast<int>(run.norm_groups.size());
}
// How many times a ledger must count each element of `tensor`: its own norm group once, another
// never, the zero count once.
int expected_times(const record::RunRecord& run, int tensor, int ledger);
// Whether a piece enters a ledger.
bool counts_in(const record::Piece& piece, int ledger, const record::RunRecord& run);

// A tensor some rank's ledger counts wrongly.
struct WrongCount {
  int tensor = 0;
  int ledger = 0;                 // the first ledger that counts it wrongly
  std::vector<int> ranks;         // every rank whose ledger is wrong, ascending
  std::vector<std::int64_t> counted_by_rank;  // elements each of them counts, parallel to ranks
  std::int64_t counted = 0;       // elements counted by the first of them
  int least = 0, most = 0;        // the fewest and most times that rank counts one element
};

struct LedgerResult {
  std::vector<WrongCount> wrong;  // by tensor, ascending
  // What each rank's own ledger implies, when every piece of the record has statistics: the
  // root of the main norm's kept sums of squares over its stats groups, and the zero counts
  // of the pieces in its zero count.
  bool has_statistics = false;
  std::vector<double> implied_norm;        // per rank
  std::vector<std::int64_t> implied_zeros;  // per rank
};

class RecordTooLarge : public std::length_error {
 public:
  using std::length_error::length_error;
};

// Throws RecordTooLarge, naming the rank, when the pieces cut the tensors into more than
// `max_intervals` runs.
LedgerResult count_ledgers(const record::RunRecord& run, std::int64_t max_intervals = 50'000'000);

// Calls fn(lo, hi) for each maximal run [lo, hi) of row-major logical indices of a tensor of
// `shape` that the row-major range [begin, end) of `box` covers.
template <class Fn>
void for_each_interval(const record::Extents& shape, const record::Box& box, std::int64_t begin,
                       std::int64_t end, Fn fn) {
  if (begin >= end) return;
  const int dims = shape.ndim;
  std::int64_t stride[record::kMaxDims];
  for (int d = dims - 1, s = 1; d >= 0; --d) {
    stride[d] = s;
    s *= shape.size[d];
  }
  // The trailing dims the box spans fully, plus the first one it does not, are contiguous.
  int j = dims;  // dims [j, dims) are full
  while (j > 0 && box.extent.size[j - 1] == shape.size[j - 1]) --j;
  const int run_dim = j == 0 ? 0 : j - 1;  // the dim a run advances along last
  std::int64_t run_length = 1;
  for (int d = j == 0 ? 0 : run_dim; d < dims; ++d) run_length *= box.extent.size[d];
  for (std::int64_t run = begin / run_length; run * run_length < end; ++run) {
    // The run's first element: `run` in mixed radix over the extents of the dims before run_dim.
    std::int64_t outer = run, start = 0;
    for (int d = run_dim; d-- > 0;) {
      start += (box.offset[d] + outer % box.extent.size[d]) * stride[d];
      outer /= box.extent.size[d];
    }
    if (j != 0) start += box.offset[run_dim] * stride[run_dim];
    const std::int64_t lo = std::max(begin, run * run_length) - run * run_length;
    const std::int64_t hi = std::min(end, (run + 1) * run_length) - run * run_length;
    fn(start + lo, start + hi);
  }
}

}  // namespace tally::oracle
