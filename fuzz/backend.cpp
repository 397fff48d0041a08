#include "fuzz/backend.h"

#include "comm/sim_communicator.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::fuzz {

oracle::Verdict SimBackend::run(const Case& c, const oracle::JudgeOptions& judge) {
  return run_case(c, judge);
}

}  // namespace tally::fuzz
