// What the rule tests of the real targets generate: GPT cases of one world, Megatron's own layout
// corners included (a worker builds those too), for a test to aim with its target's `within`.
#pragma once

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

}  // namespace tally::testing
