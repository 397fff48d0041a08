// A sweep's cases run in lanes side by side, one command in place of shards started by hand: each
// lane is a target of its own (a real framework's worker of the world per lane; tally's model on
// sim may give every lane the same target, since it runs cases side by side) and takes the next
// whole layout, so a worker keeps Megatron's parallel state across that layout's cases as a
// shard's does. A single lane runs in the caller's thread, exactly as a loop over the cases would.
#pragma once

#include <exception>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "fuzz/sweep.h"
#include "run/target.h"

namespace tally::fuzz {

// What stopped the lanes early, where something did.
struct LanesEnd {
  bool stopped = false;          // `on_result` or `interrupted` asked to stop
  std::exception_ptr error;      // the first case, lane opening or `on_result` that threw; the others stop after their case
  std::string error_at;          // that case's id ("" when a lane could not be opened)
};

// Opens each distinct target of `lanes` for `world`, side by side (a worker takes its seconds to
// come up); the first error, or nullptr. A target opened before is not opened again, so a caller
// may open the lanes first to time the cases alone.
std::exception_ptr open_sweep_lanes(std::span<run::Target* const> lanes, int world);

// Runs `cases` (in sweep order; a layout's cases one after another) on `lanes`, each lane opened for
// `world` first, in its own thread. `on_result` hears each case as it ends with the index of the
// lane that ran it, one at a time (under a lock: it may save a state and print), and returns false
// to stop every lane after its current case (the cases in flight are still heard); `interrupted`
// is asked before each case. `options`' callbacks (known findings, the release's model, the HTML of
// a failure) run in the lanes' threads, outside the lock, side by side: each must be safe so.
// Returns how the lanes ended; an error (of a case or of `on_result`) is not rethrown, so the
// caller can save what was done first.
LanesEnd run_sweep_lanes(std::span<run::Target* const> lanes, int world, const std::vector<const SweepCase*>& cases,
                         const SweepRunOptions& options,
                         const std::function<bool(std::size_t lane, const SweepCase&, const SweepResult&)>& on_result,
                         const std::function<bool()>& interrupted);

// `cases` cut into runs of one layout each, in order.
std::vector<std::vector<const SweepCase*>> cases_by_layout(const std::vector<const SweepCase*>& cases);

}  // namespace tally::fuzz
