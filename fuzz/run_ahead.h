// A campaign's cases run side by side: helper threads generate and run the cases ahead of the
// campaign's loop, which takes each case's result in index order and, rather than wait for one,
// runs the next unclaimed case itself. The loop sees what one thread would have seen, in the same
// order (the same failures, at the same case numbers); only how far the threads got past the case
// where the loop stopped is work thrown away. Threads wake each other only when one sleeps: on two
// cores a wake-up per case cost a fifth of the gain.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "casefile/case.h"
#include "oracle/verdict.h"

namespace tally::fuzz {

struct RanCase {
  casefile::Case c;
  oracle::Verdict verdict;
};

class RunAhead {
 public:
  // Case `index`'s generation and run; called on the threads (the caller of `take` among them), for
  // each index from 0 up to (not including) `end`, at most `window` indexes past the last one taken.
  using Work = std::function<RanCase(std::int64_t index)>;

  // `threads`: the caller of `take` and threads - 1 helpers.
  RunAhead(unsigned threads, std::int64_t end, int window, Work work);
  // Stops the threads: each finishes the case it is running; results not taken are dropped.
  ~RunAhead();
  RunAhead(const RunAhead&) = delete;
  RunAhead& operator=(const RunAhead&) = delete;

  // The result of case `index`, the one after the previous call's (0 first), once it is ready.
  // Rethrows what Work threw for it.
  RanCase take(std::int64_t index);

 private:
  void helper_loop();
  void stop_helpers();  // each finishes the case it runs; joined
  // Claims the next index, runs it unlocked and stores its result; `lock` holds mutex_.
  void run_next(std::unique_lock<std::mutex>& lock);
  bool claimable() const { return next_claim_ < end_ && next_claim_ < taken_ + window_; }

  struct Slot {
    RanCase ran;
    std::exception_ptr error;
  };
  const std::int64_t end_;
  const int window_;
  const Work work_;
  std::mutex mutex_;
  std::condition_variable result_ready_;  // for the caller of take, when it sleeps
  std::condition_variable room_;          // for helpers, when the window is full
  std::int64_t next_claim_ = 0;  // the next index a thread takes up
  std::int64_t taken_ = 0;       // indexes below it were handed out
  bool taker_sleeps_ = false;
  int helpers_asleep_ = 0;
  bool quitting_ = false;
  std::map<std::int64_t, Slot> done_;
  std::vector<std::thread> threads_;
};

}  // namespace tally::fuzz
