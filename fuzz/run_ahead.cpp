#include "fuzz/run_ahead.h"

#include <stdexcept>
#include <string>

namespace tally::fuzz {

RunAhead::RunAhead(unsigned threads, std::int64_t end, int window, Work work)
    : end_(end), window_(window), work_(std::move(work)) {
  if (threads == 0 || window < static_cast<int>(threads))
    throw std::invalid_argument("RunAhead needs at least one thread and a window of one case per thread (threads " +
                                std::to_string(threads) + ", window " + std::to_string(window) + ")");
  threads_.reserve(threads - 1);
  try {
    for (unsigned t = 1; t < threads; ++t) threads_.emplace_back([this] { helper_loop(); });
  } catch (...) {  // no thread to be had: the ones started end before the error goes on
    stop_helpers();
    throw;
  }
}

RunAhead::~RunAhead() { stop_helpers(); }

void RunAhead::stop_helpers() {
  {
    std::lock_guard lock(mutex_);
    quitting_ = true;
  }
  room_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void RunAhead::run_next(std::unique_lock<std::mutex>& lock) {
  const std::int64_t index = next_claim_++;
  lock.unlock();
  Slot slot;
  try {
    slot.ran = work_(index);
  } catch (...) {
    slot.error = std::current_exception();
  }
  lock.lock();
  done_.emplace(index, std::move(slot));
}

void RunAhead::helper_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    while (!quitting_ && !claimable()) {
      ++helpers_asleep_;
      room_.wait(lock);
      --helpers_asleep_;
    }
    if (quitting_) return;
    run_next(lock);
    if (taker_sleeps_) result_ready_.notify_one();
  }
}

RanCase RunAhead::take(std::int64_t index) {
  std::unique_lock lock(mutex_);
  if (index != taken_ || index >= end_)
    throw std::logic_error("RunAhead::take(" + std::to_string(index) + "): the next case is " +
                           std::to_string(taken_) + " of " + std::to_string(end_));
  for (;;) {
    if (auto found = done_.find(index); found != done_.end()) {
      Slot slot = std::move(found->second);
      done_.erase(found);
      ++taken_;
      const bool wake = helpers_asleep_ > 0;
      lock.unlock();
      if (wake) room_.notify_one();
      if (slot.error) std::rethrow_exception(slot.error);
      return std::move(slot.ran);
    }
    if (claimable()) {  // the case is a helper's, still running: run a later one meanwhile
      run_next(lock);
      continue;
    }
    taker_sleeps_ = true;
    result_ready_.wait(lock);
    taker_sleeps_ = false;
  }
}

}  // namespace tally::fuzz
