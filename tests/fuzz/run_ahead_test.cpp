#include "fuzz/run_ahead.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

namespace tally::fuzz {
namespace {

// Work whose result names its index, slow on some indexes so threads finish out of order.
RanCase named(std::int64_t index) {
  if (index % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  RanCase ran;
  ran.c.description = "case " + std::to_string(index);
  return ran;
}

TEST(RunAhead, HandsOutResultsInIndexOrder) {
  for (unsigned threads : {1u, 2u, 4u}) {
    RunAhead ahead(threads, 50, 8, named);
    for (std::int64_t i = 0; i < 50; ++i) EXPECT_EQ(ahead.take(i).c.description, "case " + std::to_string(i));
  }
}

TEST(RunAhead, RunsNothingPastItsEndNorFarPastWhatWasTaken) {
  std::atomic<std::int64_t> highest{-1};
  std::atomic<int> runs{0};
  {
    RunAhead ahead(3, 10, 4, [&](std::int64_t index) {
      ++runs;
      for (std::int64_t seen = highest.load(); index > seen && !highest.compare_exchange_weak(seen, index);) {
      }
      return named(index);
    });
    ahead.take(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_LE(highest.load(), 4) << "at most the window past the last case taken";
    for (std::int64_t i = 1; i < 10; ++i) ahead.take(i);
    EXPECT_THROW(ahead.take(10), std::logic_error) << "past the end";
  }
  EXPECT_EQ(runs.load(), 10);
}

TEST(RunAhead, RethrowsWhatACaseThrewWhenItIsTaken) {
  RunAhead ahead(2, 5, 4, [](std::int64_t index) {
    if (index == 2) throw std::runtime_error("case 2 broke");
    return named(index);
  });
  ahead.take(0);
  ahead.take(1);
  try {
    ahead.take(2);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "case 2 broke");
  }
  EXPECT_EQ(ahead.take(3).c.description, "case 3");
}

TEST(RunAhead, TakesCasesOnlyInOrder) {
  RunAhead ahead(2, 5, 4, named);
  EXPECT_THROW(ahead.take(1), std::logic_error);
}

}  // namespace
}  // namespace tally::fuzz
