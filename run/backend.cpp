#include "run/backend.h"
#include "run/run_case.h"

#include "comm/sim_communicator.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::run {

oracle::Verdict SimBackend::run(const casefile::Case& c, const oracle::JudgeOptions& judge) {
  return run_case(c, judge);
}

}  // namespace tally::run
