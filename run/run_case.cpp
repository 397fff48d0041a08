#include "run/run_case.h"

#include <algorithm>
#include <set>

#include "comm/sim_communicator.h"
#include "vocab/gradients.h"

#ifndef TALLY_VERSION
#error "run/run_case.cpp needs TALLY_VERSION (set by run/CMakeLists.txt)"
#endif

namespace tally::run {

namespace {

using casefile::Case;
using casefile::Expectation;

// How the model target summed (oracle/tolerance.h): its local accumulation, its largest shard
// and shard count, the largest stats group, and children reduced apart.
oracle::ReductionModel reduction_model(const topologies::LogicalModel& model,
                                       const topologies::RankLayout& layout,
                                       const vocab::PathOptions& options,
                                       const gradnorm::OptimizerPlan& plan) {
  oracle::ReductionModel m;
  m.local = options.accumulation;
  m.reduction = kernels::Accumulation::fp64;
  for (const topologies::LogicalParam& p : model.params())
    m.shard_elements = std::max(m.shard_elements, p.numel);
  m.shards = std::max<std::int64_t>(1, model.size() + 1);  // every param, and a shared copy
  int largest = 1;
  std::set<topologies::Family> families;
  for (const gradnorm::Child& child : plan.children) families.insert(child.stats_family);
  for (topologies::Family family : families)
    largest = std::max(largest, static_cast<int>(layout.ranks({family, 0}).size()));
  m.reduction_groups = {largest};
  // Children reduced apart add their sums of squares (and p-sums) on every rank.
  const int units = plan.shared_stats ? 1 : static_cast<int>(plan.children.size());
  if (units > 1) m.reduction_groups.push_back(units);
  m.children = 1;
  // Stated values are any doubles (0.1 squares inexactly), and each stated generator is one more
  // kernel call whose sum is added on the rank.
  const bool stated = vocab::states_gradients(options.gradients, model.spec());
  m.exact_mode = kernels::mode_is_exact(options.gradients.generator.mode) && !stated;
  if (stated) m.shards = 2 * m.shards;
  return m;
}

}  // namespace

oracle::GroundTruth truth_of(const topologies::LogicalModel& model,
                             const vocab::PathOptions& options, bool per_param) {
  oracle::TruthOptions truth_options;
  truth_options.p_values = options.p_values;
  truth_options.max_norm = options.max_norm;
  truth_options.per_param = per_param;
  truth_options.generators = vocab::param_generators(options.gradients, model);
  // The clipped check reads the stored gradients again: keep them for models up to 64 MiB.
  if (options.max_norm > 0.0) truth_options.keep_stored_up_to = std::int64_t{1} << 24;
  return oracle::ground_truth(model, options.gradients.generator, truth_options);
}

std::string_view tally_version() { return TALLY_VERSION; }

std::string model_target_producer(const vocab::PathOptions& options) {
  return "tally " TALLY_VERSION " (its model of the grad-norm path: optimizer " +
         std::string(vocab::optimizer_model_name(options.optimizer)) + ", faults " +
         vocab::fault_list(options.faults) + ")";
}

oracle::Verdict judge_model_run(const Case& c, const topologies::LogicalModel& model,
                                const topologies::RankLayout& layout,
                                const gradnorm::OptimizerPlan& plan, const record::RunRecord& run,
                                const oracle::JudgeOptions& judge) {
  oracle::Bounds bounds;
  bounds.reduction = reduction_model(model, layout, c.path, plan);
  const std::vector<kernels::GeneratorSpec> generators = vocab::param_generators(c.path.gradients, model);
  const oracle::GradientSource gradients{&model, generators};
  return oracle::judge(run, truth_of(model, c.path), bounds, &gradients, judge);
}

oracle::Verdict run_case(const Case& c, const oracle::JudgeOptions& judge) {
  return run_case_with_record(c, judge).verdict;
}

CaseRun run_case_with_record(const Case& c, const oracle::JudgeOptions& judge) {
  if (std::optional<std::string> error = casefile::check_case(c)) throw casefile::InvalidCase(*error);
  const topologies::RankLayout layout(c.topology);
  const topologies::LogicalModel model(c.model, c.topology);
  comm::SimCommunicator communicator(layout);
  const std::vector<int> ranks = gradnorm::all_ranks(layout);
  CaseRun run;
  gradnorm::PathResult result;
  try {
    result = gradnorm::run_path(model, layout, c.path, communicator, ranks);
  } catch (const comm::InfraError& error) {
    run.verdict.kind = oracle::Verdict::Kind::infra_error;
    run.verdict.infra_call = error.call();
    run.verdict.infra_message = error.what();
    return run;
  }
  result.record.producer = model_target_producer(c.path);
  run.verdict = judge_model_run(c, model, layout, result.plan, result.record, judge);
  run.record = std::move(result.record);
  return run;
}

std::vector<std::string> failed_statistics(const oracle::Verdict& verdict) {
  std::vector<std::string> names;
  for (const oracle::StatisticCheck& s : verdict.stats)
    if (!s.ok) names.push_back(s.name);
  if (verdict.miscounted_total > 0) names.push_back("ledger");
  if (!verdict.ranks_agree) names.push_back("agreement");
  const bool clipped_stats_wrong = std::any_of(verdict.gradients.begin(), verdict.gradients.end(),
                                              [](const oracle::GradientMismatch& m) { return m.after_clip; });
  const bool held_stats_wrong = std::any_of(verdict.gradients.begin(), verdict.gradients.end(),
                                           [](const oracle::GradientMismatch& m) { return !m.after_clip; });
  if (!verdict.clipped.empty() || clipped_stats_wrong) names.push_back("clipped");
  if (held_stats_wrong) names.push_back("held-gradients");
  return names;
}

std::optional<std::string> unmet_expectation(const Expectation& expect,
                                             const oracle::Verdict& verdict) {
  const std::string got(oracle::kind_name(verdict.kind));
  const std::string want(casefile::outcome_name(expect.outcome));
  if (got != want) {
    if (verdict.kind != oracle::Verdict::Kind::infra_error) return "expected " + want + ", got " + got;
    return "expected " + want + ", got " + got + " (" + verdict.infra_call + ": " + verdict.infra_message + ")";
  }
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
