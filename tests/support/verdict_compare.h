// Two verdicts of the same case on two backends must agree: the same kind, statistics (bit for
// bit in exact modes, within twice the derived bound otherwise), miscounts and agreement.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "oracle/verdict.h"

namespace tally::testing {

inline void expect_same_verdict(const oracle::Verdict& sim, const oracle::Verdict& other,
                                bool exact) {
  ASSERT_EQ(oracle::kind_name(sim.kind), oracle::kind_name(other.kind));
  ASSERT_EQ(sim.stats.size(), other.stats.size());
  for (std::size_t i = 0; i < sim.stats.size(); ++i) {
    const oracle::StatisticCheck &a = sim.stats[i], &b = other.stats[i];
    EXPECT_EQ(a.name, b.name);
    if (exact)
      EXPECT_EQ(std::bit_cast<std::uint64_t>(a.got), std::bit_cast<std::uint64_t>(b.got)) << a.name;
    else
      EXPECT_LE(std::abs(a.got - b.got), 2 * a.bound + 1e-300) << a.name;
    EXPECT_EQ(a.ok, b.ok) << a.name;
  }
  EXPECT_EQ(sim.miscounted_total, other.miscounted_total);
  for (std::size_t i = 0; i < std::min(sim.miscounted.size(), other.miscounted.size()); ++i) {
    EXPECT_EQ(sim.miscounted[i].name, other.miscounted[i].name);
    EXPECT_EQ(sim.miscounted[i].counted, other.miscounted[i].counted);
  }
  EXPECT_EQ(sim.ranks_agree, other.ranks_agree);
}

}  // namespace tally::testing
