#include "run/run_case.h"

#include <algorithm>

#include "comm/sim_communicator.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::run {

using casefile::Case;
using casefile::Expectation;
using casefile::InvalidCase;
using casefile::check_case;
using casefile::outcome_name;

oracle::Verdict run_case(const Case& c, const oracle::JudgeOptions& judge) {
  return run_case_with_result(c, judge).verdict;
}

CaseRun run_case_with_result(const Case& c, const oracle::JudgeOptions& judge) {
  if (std::optional<std::string> error = check_case(c)) throw InvalidCase(*error);
  const topologies::RankLayout layout(c.topology);
  const topologies::LogicalModel model(c.model, c.topology);
  comm::SimCommunicator communicator(layout);
  const std::vector<int> ranks = gradnorm::all_ranks(layout);
  CaseRun run;
  try {
    run.result = gradnorm::run_path(model, layout, c.path, communicator, ranks);
  } catch (const comm::InfraError& error) {
    run.verdict.kind = oracle::Verdict::Kind::infra_error;
    run.verdict.infra_call = error.call();
    run.verdict.infra_message = error.what();
    return run;
  }
  run.verdict =
      oracle::judge(model, layout, c.path, *run.result, oracle::truth_for(model, c.path), judge);
  return run;
}

std::vector<std::string> failed_statistics(const oracle::Verdict& verdict) {
  std::vector<std::string> names;
  for (const oracle::StatisticCheck& s : verdict.stats)
    if (!s.ok) names.push_back(s.name);
  if (verdict.miscounted_total > 0) names.push_back("ledger");
  if (!verdict.ranks_agree) names.push_back("agreement");
  if (!verdict.clipped.empty()) names.push_back("clipped");
  return names;
}

std::optional<std::string> unmet_expectation(const Expectation& expect,
                                             const oracle::Verdict& verdict) {
  const std::string got(oracle::kind_name(verdict.kind));
  const std::string want(outcome_name(expect.outcome));
  if (got != want) return "expected " + want + ", got " + got;
  if (expect.outcome != Expectation::Outcome::fail) return std::nullopt;
  const std::vector<std::string> failed = failed_statistics(verdict);
  for (const std::string& name : expect.statistics)
    if (std::find(failed.begin(), failed.end(), name) == failed.end())
      return "expected statistic '" + name + "' to fail, but it passed";
  for (const std::string& name : expect.miscounted) {
    const bool found = std::any_of(verdict.miscounted.begin(), verdict.miscounted.end(),
                                   [&](const oracle::Miscount& m) { return m.name == name; });
    if (!found) return "expected param '" + name + "' to be miscounted, but it was counted once";
  }
  return std::nullopt;
}

}  // namespace tally::run
