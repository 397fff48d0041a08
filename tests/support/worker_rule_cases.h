// What the rule tests of the real targets generate: GPT cases of one world, Megatron's own layout
// corners included (a worker builds those too), for a test to aim with its target's `within`.
#pragma once

#include <cstdint>
#include <utility>

#include "fuzz/generators.h"

namespace tally::testing {

inline fuzz::CaseGenOptions gpt_cases_of_world(int world) {
  fuzz::CaseGenOptions options;
  options.topology.exact_world = world;
  options.topology.max_world = world;
  options.topology.avoid_megatron_corners = false;
  options.gpt_only = true;
  return options;
}

// The same, each case made what `within(case, draw)` makes of it, the draw being the case's own
// gradient seed (as a target's row draws it, so a campaign stays reproducible from its seed).
template <typename Within>
fuzz::CaseGenOptions gpt_cases_within(int world, Within within) {
  fuzz::CaseGenOptions options = gpt_cases_of_world(world);
  options.restrict_to = [within](casefile::Case c) {
    const std::uint64_t draw = c.path.gradients.generator.seed;
    return within(std::move(c), draw);
  };
  return options;
}

}  // namespace tally::testing
