// How a verdict reads: a table of statistics, the agreement of ranks, the diagnosis of each
// miscounted param, and the command that replays the case; or the same as JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "casefile/case.h"
#include "oracle/verdict.h"

namespace tally::cli {

// "world 2 (dense tp 2, cp 1, pp 1, dp 1; expert etp 1, ep 2, edp 1), gpt ..., layerwise, ..."
std::string case_summary(const casefile::Case& c);

void print_verdict(std::ostream& out, const casefile::Case& c, const oracle::Verdict& verdict,
                   const std::string& replay_command);

// The statistics table, the agreement of ranks, the ledger and its diagnosis, and the verdict
// line: what `tally run` and `tally check` print alike.
void print_verdict_body(std::ostream& out, const oracle::Verdict& verdict);

// {"verdict":"pass"|"fail"|"infra-error","stats":{"l2":{"got":..,"expected":..,"error":..,
// "bound":..},...},"miscounted":[{"param":..,"counted":..,"expected":..,"ranks":[..]}],
// "ranks_agree":true,...}
nlohmann::ordered_json verdict_json(const oracle::Verdict& verdict);

}  // namespace tally::cli
