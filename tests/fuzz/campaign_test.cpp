#include "run/run_case.h"
#include "fuzz/campaign.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "casefile/case_file.h"
#include "run/backend.h"
#include "run/target.h"
#include "tests/support/runner_target.h"

namespace tally::fuzz {
namespace {

namespace fs = std::filesystem;
using vocab::Fault;

// A fresh folder under the build tree for one test's corpus.
std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(TALLY_BINARY_DIR) / "tests" / "fuzz" / "corpus" / name;
  fs::remove_all(dir);
  return dir.string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

oracle::Verdict sim(const casefile::Case& c) { return run::run_case(c); }

// A campaign on tally's model on sim, as `tally fuzz` runs it.
CampaignResult run_on_model(const CampaignOptions& o, CampaignObserver& observer,
                            const std::atomic<bool>* stop = nullptr) {
  run::SimBackend backend;
  const std::unique_ptr<run::Target> model = run::model_target(backend);
  return run_campaign(o, *model, observer, stop);
}

std::vector<MutantResult> mutants_on_model(const MutantOptions& o) {
  run::SimBackend backend;
  const std::unique_ptr<run::Target> model = run::model_target(backend);
  return run_mutants(o, *model);
}

// Replays a case file as `tally replay` does: its expectation must be met.
void expect_replays(const std::string& path) {
  const casefile::Case c = casefile::load_case_file(path, run::case_frameworks());
  ASSERT_TRUE(c.expect.has_value()) << path;
  EXPECT_EQ(c.expect->outcome, casefile::Expectation::Outcome::fail) << path;
  EXPECT_FALSE(c.expect->statistics.empty()) << path;
  const std::optional<std::string> unmet = run::unmet_expectation(*c.expect, run::run_case(c));
  EXPECT_FALSE(unmet) << path << ": " << unmet.value_or("");
}

// The first case of a campaign with `fault` that fails at a world of at least `min_world`.
struct Found {
  rc::Shrinkable<casefile::Case> shrinkable;
  casefile::Case value;
  oracle::Verdict verdict;
};
std::optional<Found> first_failure(Fault fault, int min_world, std::uint64_t seed = 1) {
  CaseGenOptions o;
  o.topology.max_world = 64;
  o.faults = {fault};
  o.big_zeros_one_in = 0;
  for (int i = 0; i < 3000; ++i) {
    if (case_size_param(i) < 90) continue;  // the large worlds
    rc::Shrinkable<casefile::Case> s = generate_case(o, seed, i);
    casefile::Case c = s.value();
    if (c.topology.world < min_world) continue;
    oracle::Verdict v = run::run_case(c);
    if (v.kind != oracle::Verdict::Kind::pass) return Found{s, c, v};
  }
  return std::nullopt;
}

TEST(FailureSignature, SameWayNeedsTheSameKindLedgerClassAndStatistic) {
  oracle::Verdict v;
  v.kind = oracle::Verdict::Kind::fail;
  v.stats = {{"l2", 2, 1, 1, 0, 0, false, ""}, {"zeros", 0, 0, 0, 0, 0, true, ""}};
  v.miscounted_total = 1;
  oracle::Miscount m;
  m.param_class = "expert-row-bias";
  v.miscounted = {m};
  const FailureSignature s = failure_signature(v);
  EXPECT_EQ(describe(s), "fail: ledger (expert-row-bias), l2");
  EXPECT_TRUE(fails_the_same_way(s, v));

  oracle::Verdict other_class = v;
  other_class.miscounted[0].param_class = "replicated";
  EXPECT_FALSE(fails_the_same_way(s, other_class));
  oracle::Verdict no_ledger = v;
  no_ledger.miscounted_total = 0;
  no_ledger.miscounted.clear();
  EXPECT_FALSE(fails_the_same_way(s, no_ledger));
  oracle::Verdict other_stat = v;
  other_stat.stats[0].ok = true;
  other_stat.stats[1].ok = false;
  EXPECT_FALSE(fails_the_same_way(s, other_stat));
  oracle::Verdict hang;
  hang.kind = oracle::Verdict::Kind::infra_error;
  EXPECT_FALSE(fails_the_same_way(s, hang));
  EXPECT_TRUE(fails_the_same_way(failure_signature(hang), hang));
  EXPECT_EQ(describe(failure_signature(hang)), "infra-error");
}

// A failure found at a big world shrinks to a small world, few layers and few experts, and
// still fails the same way.
TEST(Shrink, BigWorldFailuresShrinkToSmallCases) {
  for (Fault fault : {Fault::expert_dedup_on_dense_tp, Fault::missing_pp_reduction,
                      Fault::tied_copy_not_shared, Fault::stats_over_replicas,
                      Fault::missing_ep_reduction, Fault::replicated_marked_tp}) {
    SCOPED_TRACE(std::string(vocab::fault_info(fault).name));
    const std::optional<Found> found = first_failure(fault, 32);
    ASSERT_TRUE(found.has_value());
    const ShrinkOutcome out = shrink_failure(found->shrinkable, found->verdict, sim, ShrinkLimits{});
    EXPECT_TRUE(out.complete);
    EXPECT_TRUE(fails_the_same_way(failure_signature(found->verdict), out.verdict));
    EXPECT_EQ(out.verdict.kind, found->verdict.kind);
    const CaseSize size = case_size(out.shrunk);
    EXPECT_LE(size.world, 4) << topologies::describe(out.shrunk.topology);
    EXPECT_LE(size.layers, 2);
    EXPECT_LE(size.experts, 2);
    EXPECT_LT(size.elements, case_size(found->value).elements);
    EXPECT_EQ(out.shrunk.path.faults, found->value.path.faults);  // the fault never shrinks away
  }
}

// A local minimum says why it is one: every smaller candidate of the shrunk case ran, and what
// each gave. A runner that passes every smaller case leaves the failure unshrunk and says so.
TEST(Shrink, ALocalMinimumAccountsForEverySmallerCandidate) {
  const std::optional<Found> found = first_failure(Fault::stats_over_replicas, 32);
  ASSERT_TRUE(found.has_value());
  const ShrinkOutcome shrunk = shrink_failure(found->shrinkable, found->verdict, sim, ShrinkLimits{});
  ASSERT_TRUE(shrunk.complete);
  const LastRound& last = shrunk.progress.last_round;
  EXPECT_LE(last.passed + last.failed_otherwise, shrunk.progress.runs);
  EXPECT_EQ(describe(last).empty(), last.passed + last.failed_otherwise + last.invalid == 0);

  const CaseRunner every_smaller_case_passes = [](const casefile::Case&) { return oracle::Verdict{}; };
  const ShrinkOutcome stuck =
      shrink_failure(found->shrinkable, found->verdict, every_smaller_case_passes, ShrinkLimits{});
  EXPECT_TRUE(stuck.complete);
  EXPECT_EQ(stuck.progress.steps, 0);
  ASSERT_GT(stuck.progress.runs, 0);
  EXPECT_EQ(stuck.progress.last_round.failed_otherwise, 0);
  EXPECT_EQ(stuck.progress.last_round.passed, stuck.progress.runs);
  EXPECT_EQ(describe(stuck.progress.last_round).rfind("its " + std::to_string(stuck.progress.runs) +
                                                      " smaller candidates all pass", 0), 0u);
  LastRound mixed;
  mixed.passed = 27;
  mixed.failed_otherwise = 2;
  EXPECT_EQ(describe(mixed), "of its 29 smaller candidates, 27 pass and 2 fail otherwise");
}

TEST(Shrink, StopsWithinItsBudget) {
  const std::optional<Found> found = first_failure(Fault::stats_over_replicas, 32);
  ASSERT_TRUE(found.has_value());
  const ShrinkOutcome out = shrink_failure(found->shrinkable, found->verdict, sim, ShrinkLimits{3, 60});
  EXPECT_FALSE(out.complete);
  EXPECT_LE(out.progress.runs, 3);
  EXPECT_TRUE(fails_the_same_way(failure_signature(found->verdict), out.verdict));
  int asked = 0;
  const ShrinkOutcome stopped = shrink_failure(found->shrinkable, found->verdict, sim, ShrinkLimits{},
                                               [&] { return ++asked > 2; });
  EXPECT_TRUE(stopped.interrupted);
  EXPECT_FALSE(stopped.complete);
}

// Records the order of events and checks the corpus at each.
class Recorder final : public CampaignObserver {
 public:
  std::vector<std::string> events;
  bool original_on_disk_while_shrinking = true;
  std::atomic<bool>* stop = nullptr;  // set on the first failure found, when given

  void failure_found(const Failure& f) override {
    events.push_back("found " + std::to_string(f.index));
    EXPECT_TRUE(fs::exists(f.original_path));
    const std::string shrunk = f.original_path.substr(0, f.original_path.size() - 5) + ".shrunk.json";
    EXPECT_FALSE(fs::exists(shrunk));
    const casefile::Case on_disk = casefile::load_case_file(f.original_path, run::case_frameworks());
    EXPECT_EQ(on_disk.expect, f.original.expect);
    if (stop) stop->store(true);
  }
  void shrink_step(const Failure& f, const ShrinkOutcome&) override {
    if (events.back().rfind("shrink", 0) != 0) events.push_back("shrink " + std::to_string(f.index));
    original_on_disk_while_shrinking = original_on_disk_while_shrinking && fs::exists(f.original_path);
  }
  void failure_shrunk(const Failure& f) override {
    events.push_back("shrunk " + std::to_string(f.index));
    EXPECT_TRUE(fs::exists(f.shrunk_path));
  }
  void failure_not_shrunk(const Failure& f) override {
    events.push_back("not shrunk " + std::to_string(f.index) + " as " + std::to_string(f.same_as.value_or(-1)));
  }
};

TEST(Campaign, WritesEachFailureBeforeShrinkingAndBothReplay) {
  CampaignOptions o;
  o.seed = 4;
  o.max_cases = 300;
  o.generator.faults = {Fault::tied_copy_not_shared, Fault::no_dedup_filter};
  o.corpus_dir = fresh_dir("before-shrinking");
  o.max_failures = 2;
  Recorder recorder;
  const CampaignResult result = run_on_model(o, recorder);
  ASSERT_EQ(result.failures.size(), 2u);
  EXPECT_EQ(result.stopped_by, CampaignResult::Stop::max_failures);
  const std::string a = std::to_string(result.failures[0].index);
  const std::string b = std::to_string(result.failures[1].index);
  EXPECT_EQ(recorder.events, (std::vector<std::string>{"found " + a, "shrink " + a, "shrunk " + a,
                                                       "found " + b, "shrink " + b, "shrunk " + b}));
  EXPECT_TRUE(recorder.original_on_disk_while_shrinking);
  for (const Failure& f : result.failures) {
    EXPECT_EQ(f.original_path, o.corpus_dir + "/4-" + std::to_string(f.index) + ".json");
    EXPECT_EQ(f.shrunk_path, o.corpus_dir + "/4-" + std::to_string(f.index) + ".shrunk.json");
    expect_replays(f.original_path);
    expect_replays(f.shrunk_path);
    EXPECT_LE(f.shrunk.topology.world, f.original.topology.world);
  }
}

TEST(Campaign, ShrinksTheFirstFailureOfEachSignatureOnlyWhenAsked) {
  CampaignOptions o;
  o.seed = 4;
  o.max_cases = 300;
  o.generator.faults = {Fault::missing_pp_reduction};  // fails l2 alone, case after case
  o.corpus_dir = fresh_dir("shrink-new");
  o.max_failures = 2;
  o.shrink_repeated_signatures = false;
  Recorder recorder;
  const CampaignResult result = run_on_model(o, recorder);
  EXPECT_EQ(result.stopped_by, CampaignResult::Stop::max_failures);
  std::vector<std::string> expected;
  int shrunk = 0;
  for (std::size_t i = 0; i < result.failures.size(); ++i) {
    const Failure& f = result.failures[i];
    const auto first = result.failures.begin();
    const auto earlier = std::find_if(first, first + static_cast<long>(i), [&](const Failure& e) {
      return e.signature == f.signature && e.original.path.faults == f.original.path.faults;
    });
    const std::string n = std::to_string(f.index);
    if (earlier == first + static_cast<long>(i)) {  // a new signature: shrunk
      EXPECT_FALSE(f.same_as);
      EXPECT_TRUE(f.shrunk_done);
      expected.insert(expected.end(), {"found " + n, "shrink " + n, "shrunk " + n});
      ++shrunk;
      continue;
    }
    EXPECT_EQ(f.same_as, earlier->index);
    EXPECT_FALSE(f.shrunk_done);
    EXPECT_TRUE(f.shrunk_path.empty());
    EXPECT_FALSE(fs::exists(o.corpus_dir + "/4-" + n + ".shrunk.json"));
    expect_replays(f.original_path);
    expected.insert(expected.end(), {"found " + n, "not shrunk " + n + " as " + std::to_string(earlier->index)});
  }
  EXPECT_EQ(recorder.events, expected);
  EXPECT_EQ(shrunk, 2) << "--max-failures counts the shrunk failures only";
  EXPECT_GT(result.failures.size(), 2u) << "one fault's failures repeat a signature before two are new";
}

TEST(Campaign, SameSeedSameFailuresAndFiles) {
  CampaignOptions o;
  o.seed = 9;
  o.max_cases = 150;
  o.generator.faults = {Fault::average_rank_norms, Fault::missing_ep_reduction};
  o.max_failures = 3;
  o.corpus_dir = fresh_dir("repeat");
  CampaignObserver quiet;
  const CampaignResult first = run_on_model(o, quiet);
  ASSERT_FALSE(first.failures.empty());
  std::vector<std::string> files;
  for (const Failure& f : first.failures) {
    files.push_back(read_file(f.original_path));
    files.push_back(read_file(f.shrunk_path));
  }
  const CampaignResult second = run_on_model(o, quiet);
  ASSERT_EQ(second.failures.size(), first.failures.size());
  EXPECT_EQ(second.cases, first.cases);
  for (std::size_t i = 0; i < first.failures.size(); ++i) {
    EXPECT_EQ(second.failures[i].index, first.failures[i].index);
    EXPECT_EQ(read_file(second.failures[i].original_path), files[2 * i]);
    EXPECT_EQ(read_file(second.failures[i].shrunk_path), files[2 * i + 1]);
  }
}

// Cases run side by side (`tally fuzz --jobs`) give the campaign of one thread: the same cases,
// failures at the same case numbers, the same files, shrunk the same way.
TEST(Campaign, JobsSideBySideFindWhatOneThreadFinds) {
  CampaignOptions o;
  o.seed = 9;
  o.max_cases = 400;
  o.generator.faults = {Fault::average_rank_norms, Fault::missing_ep_reduction, Fault::tied_copy_not_shared};
  o.max_failures = 4;
  o.corpus_dir = fresh_dir("jobs");  // one folder, since the files name it
  Recorder one_recorder;
  const CampaignResult one = run_on_model(o, one_recorder);
  ASSERT_GE(one.failures.size(), 2u);
  std::vector<std::string> files;
  for (const Failure& f : one.failures) {
    files.push_back(read_file(f.original_path));
    files.push_back(read_file(f.shrunk_path));
  }
  for (unsigned jobs : {2u, 5u}) {
    CampaignOptions side_by_side = o;
    side_by_side.jobs = jobs;
    fresh_dir("jobs");
    Recorder recorder;
    const CampaignResult many = run_on_model(side_by_side, recorder);
    EXPECT_EQ(many.cases, one.cases) << jobs << " jobs";
    EXPECT_EQ(many.stopped_by, one.stopped_by);
    EXPECT_EQ(recorder.events, one_recorder.events) << "the same failures, found and shrunk in the same order";
    ASSERT_EQ(many.failures.size(), one.failures.size());
    for (std::size_t i = 0; i < one.failures.size(); ++i) {
      EXPECT_EQ(many.failures[i].index, one.failures[i].index);
      EXPECT_EQ(read_file(many.failures[i].original_path), files[2 * i]);
      EXPECT_EQ(read_file(many.failures[i].shrunk_path), files[2 * i + 1]);
    }
  }
  // A fault-free campaign of a fixed count runs exactly that many cases.
  CampaignOptions clean;
  clean.seed = 12;
  clean.max_cases = 300;
  clean.jobs = 3;
  CampaignObserver quiet;
  const CampaignResult result = run_on_model(clean, quiet);
  EXPECT_EQ(result.cases, 300);
  EXPECT_TRUE(result.failures.empty());
}

// A real framework's worker runs one case at a time: a campaign of several jobs on it is refused.
TEST(Campaign, JobsNeedATargetThatRunsCasesSideBySide) {
  CampaignOptions o;
  o.max_cases = 3;
  o.jobs = 2;
  testing::RunnerTarget framework([](const casefile::Case&) { return oracle::Verdict{}; }, 0);
  CampaignObserver quiet;
  EXPECT_THROW(run_campaign(o, framework, quiet), std::invalid_argument);
  EXPECT_TRUE(framework.executed.empty());
}

TEST(Campaign, FaultFreeCampaignPasses) {
  CampaignOptions o;
  o.seed = 12;
  o.max_cases = 400;
  o.corpus_dir = fresh_dir("fault-free");
  CampaignObserver quiet;
  const CampaignResult result = run_on_model(o, quiet);
  EXPECT_EQ(result.cases, 400);
  EXPECT_TRUE(result.failures.empty());
  EXPECT_EQ(result.stopped_by, CampaignResult::Stop::cases);
  EXPECT_FALSE(fs::exists(o.corpus_dir));  // created only for a failure
}

// An interrupt during shrinking: the shrink stops, the shrunk-so-far case is written, the
// campaign ends with what it found.
TEST(Campaign, InterruptKeepsWhatWasFound) {
  std::atomic<bool> stop{false};
  CampaignOptions o;
  o.seed = 4;
  o.max_cases = 1000;
  o.generator.faults = {Fault::stats_over_replicas};
  o.corpus_dir = fresh_dir("interrupt");
  Recorder recorder;
  recorder.stop = &stop;
  const CampaignResult result = run_on_model(o, recorder, &stop);
  EXPECT_EQ(result.stopped_by, CampaignResult::Stop::interrupted);
  ASSERT_EQ(result.failures.size(), 1u);
  EXPECT_FALSE(result.failures[0].shrink_complete);
  expect_replays(result.failures[0].original_path);
  expect_replays(result.failures[0].shrunk_path);
}

TEST(Campaign, StopsOnTime) {
  CampaignOptions o;
  o.seed = 1;
  o.max_seconds = 0.3;
  CampaignObserver quiet;
  const CampaignResult result = run_on_model(o, quiet);
  EXPECT_EQ(result.stopped_by, CampaignResult::Stop::time);
  EXPECT_GT(result.cases, 0);
  EXPECT_LT(result.seconds, 5.0);
}

// A case that never finishes its collectives is a finding too (infra-error), not a crash.
TEST(Campaign, HangsAreFailures) {
  CampaignOptions o;
  o.seed = 2;
  o.max_cases = 1000;
  o.generator.faults = {Fault::empty_rank_skips_collective};
  o.max_failures = 1;
  o.corpus_dir = fresh_dir("hang");
  CampaignObserver quiet;
  const CampaignResult result = run_on_model(o, quiet);
  ASSERT_EQ(result.failures.size(), 1u);
  const Failure& f = result.failures[0];
  EXPECT_EQ(f.signature.kind, oracle::Verdict::Kind::infra_error);
  EXPECT_EQ(casefile::load_case_file(f.shrunk_path, run::case_frameworks()).expect->outcome, casefile::Expectation::Outcome::infra_error);
  EXPECT_LE(f.shrunk.topology.world, 2);
}

// A real target's infra-error (its worker erred, died or hung) is no failure: the campaign stops
// at it, unshrunk, and saves the case with its message next to it.
TEST(Campaign, AnInfraErrorOfARealTargetStopsTheCampaignUnshrunk) {
  CampaignOptions o;
  o.seed = 4;
  o.max_cases = 50;
  o.generator.faults = {Fault::no_dedup_filter};
  o.corpus_dir = fresh_dir("infra");
  int runs = 0;
  const CaseRunner broken_at_third = [&runs](const casefile::Case& c) {
    if (++runs < 3) return oracle::Verdict{};  // passes
    oracle::Verdict v = sim(c);
    v.kind = oracle::Verdict::Kind::infra_error;
    v.infra_call = "a worker";
    v.infra_message = "the worker exited during case-3; the end of its log:\n    a line";
    return v;
  };
  CampaignObserver quiet;
  testing::RunnerTarget at_third(broken_at_third, 0);
  const CampaignResult result = run_campaign(o, at_third, quiet);
  EXPECT_EQ(runs, 3) << "nothing shrunk, nothing run after it";
  EXPECT_TRUE(result.failures.empty());
  EXPECT_EQ(result.stopped_by, CampaignResult::Stop::infra_error);
  ASSERT_TRUE(result.infra_error);
  EXPECT_EQ(result.infra_error->index, 2);
  EXPECT_EQ(casefile::load_case_file(result.infra_error->path, run::case_frameworks()).expect->outcome,
            casefile::Expectation::Outcome::infra_error);
  std::ifstream message(result.infra_error->message_path);
  std::stringstream text;
  text << message.rdbuf();
  EXPECT_EQ(text.str(), "a worker: the worker exited during case-3; the end of its log:\n    a line\n");

  // A shrink candidate that gives one stops the shrink, which keeps what it has, and the campaign.
  o.corpus_dir = fresh_dir("infra-shrinking");
  int after_failure = 0;  // runs since the first failure
  const CaseRunner broken_while_shrinking = [&after_failure](const casefile::Case& c) {
    if (after_failure > 0 && ++after_failure == 3) {
      oracle::Verdict v;
      v.kind = oracle::Verdict::Kind::infra_error;
      v.infra_call = "a worker";
      v.infra_message = "hung";
      return v;
    }
    oracle::Verdict v = sim(c);
    if (v.kind == oracle::Verdict::Kind::fail && after_failure == 0) after_failure = 1;
    return v;
  };
  testing::RunnerTarget while_shrinking(broken_while_shrinking, 0);
  const CampaignResult shrinking = run_campaign(o, while_shrinking, quiet);
  ASSERT_EQ(shrinking.failures.size(), 1u);
  EXPECT_FALSE(shrinking.failures[0].shrink_complete);
  EXPECT_EQ(shrinking.failures[0].shrink.runs, 2) << "the shrink stopped at the candidate that gave it";
  ASSERT_TRUE(shrinking.infra_error);
  EXPECT_TRUE(shrinking.infra_error->while_shrinking);
  EXPECT_EQ(shrinking.infra_error->index, shrinking.failures[0].index);
  EXPECT_NE(shrinking.infra_error->path.find(".shrinking.infra-error.json"), std::string::npos);
}

// A case the framework declines with a check of its own at set-up is no failure and no
// infrastructure error: counted by its reason, and the campaign runs its whole budget.
TEST(Campaign, CasesTheFrameworkDeclinesAreCountedByReasonAndTheCampaignGoesOn) {
  CampaignOptions o;
  o.seed = 4;
  o.max_cases = 30;
  o.corpus_dir = fresh_dir("refused");
  int runs = 0;
  const CaseRunner declines_every_third = [&runs](const casefile::Case& c) {
    if (++runs % 3 != 0) return sim(c);
    return oracle::refused_verdict("deepspeed 0.19.8", "rank " + std::to_string(runs % 2) +
                                                           ": ValueError: ZeRO offload with AutoEP+AutoTP folding is "
                                                           "not validated yet");
  };
  CampaignObserver quiet;
  testing::RunnerTarget target(declines_every_third, 0);
  const CampaignResult result = run_campaign(o, target, quiet);
  EXPECT_EQ(result.cases, 30);
  EXPECT_EQ(result.stopped_by, CampaignResult::Stop::cases);
  EXPECT_FALSE(result.infra_error);
  EXPECT_TRUE(result.failures.empty());
  ASSERT_EQ(result.refused_by_reason.size(), 1u) << "one reason, whichever rank said it first";
  EXPECT_EQ(result.refused_by_reason.begin()->first,
            "deepspeed 0.19.8: ValueError: ZeRO offload with AutoEP+AutoTP folding is not validated yet");
  EXPECT_EQ(result.refused_by_reason.begin()->second, 10);
  EXPECT_EQ(refused_by_framework(result), 10);
  EXPECT_EQ(campaign_standing(result), Standing::clean) << "a third refused is not most: the rest were checked";
  CampaignResult mostly_refused = result;
  mostly_refused.refused_by_reason.begin()->second = 16;
  EXPECT_EQ(campaign_standing(mostly_refused), Standing::no_true_count);
}

// A failure repeating a known finding is saved, not shrunk, and does not count towards
// --max-failures: a campaign against a release with known miscounts is not spent on them.
TEST(Campaign, AKnownFindingIsSavedButNotShrunkNorCounted) {
  CampaignOptions o;
  o.seed = 11;
  o.max_cases = 200;
  o.max_failures = 1;
  o.generator.faults = {Fault::no_dedup_filter};
  o.corpus_dir = fresh_dir("known");
  o.known = [](const casefile::Case&, const oracle::Verdict&) { return std::string("a-known-finding"); };
  int runs = 0;
  testing::RunnerTarget target(
      [&runs](const casefile::Case& c) {
        ++runs;
        return sim(c);
      },
      0);
  CampaignObserver quiet;
  const CampaignResult result = run_campaign(o, target, quiet);
  EXPECT_EQ(result.cases, 200) << "known failures do not stop it at --max-failures 1";
  EXPECT_EQ(runs, 200) << "nothing shrunk";
  ASSERT_GT(result.failures.size(), 1u);
  for (const Failure& f : result.failures) {
    EXPECT_EQ(f.known, "a-known-finding");
    EXPECT_FALSE(f.shrunk_done);
    EXPECT_TRUE(fs::exists(f.original_path)) << "a known failure is saved all the same";
  }
  EXPECT_EQ(new_failures(result), 0);
  EXPECT_EQ(campaign_standing(result), Standing::clean) << "known findings alone are no news";
  CampaignResult one_new = result;
  one_new.failures.back().known.clear();
  EXPECT_EQ(campaign_standing(one_new), Standing::new_failures);
}

// `--faults all` keeps what the target plants; a fault named that it cannot plant is refused,
// named with the target's reason.
TEST(Campaign, TheFaultsToPlantAreThoseTheTargetPlants) {
  run::FaultPlants plants;
  plants.planted["no-dedup-filter"] = "a stand-in's";
  plants.not_planted["zero-count-in-float32"] = "it reports no zero count";
  const std::vector<Fault> both = {Fault::no_dedup_filter, Fault::zero_count_in_float32};
  EXPECT_EQ(faults_to_plant(both, /*all=*/true, plants), std::vector<Fault>{Fault::no_dedup_filter});
  try {
    faults_to_plant(both, /*all=*/false, plants);
    FAIL() << "a fault the target cannot plant was kept";
  } catch (const std::invalid_argument& error) {
    EXPECT_EQ(std::string(error.what()), "plants no counterpart of zero-count-in-float32 (it reports no zero count)");
  }
  EXPECT_THROW(faults_to_plant({Fault::zero_count_in_float32}, /*all=*/true, plants), std::invalid_argument);
}

// The mutation score: every fault is found within the default budget.
TEST(Mutants, EveryApplicableFaultIsFoundWithinTheDefaultBudget) {
  MutantOptions o;  // budget 1000, seed 1, worlds up to 64
  const std::vector<MutantResult> results = mutants_on_model(o);
  ASSERT_EQ(results.size(), static_cast<std::size_t>(vocab::kFaultCount));
  for (const MutantResult& r : results) {
    SCOPED_TRACE(std::string(vocab::fault_info(r.fault).name));
    EXPECT_TRUE(r.not_applicable.empty());
    ASSERT_TRUE(r.found);
    EXPECT_LE(r.cases, o.budget);
    ASSERT_TRUE(r.failure.has_value());
    EXPECT_LE(r.failure->shrunk.topology.world, 8);
    EXPECT_TRUE(r.failure->shrunk.path.faults.has(r.fault));
  }
}

TEST(Mutants, ABudgetTooSmallIsReportedAsNotFound) {
  MutantOptions o;
  o.budget = 1;  // case 0 is a single rank at size 0
  o.faults = {Fault::missing_pp_reduction};
  const std::vector<MutantResult> results = mutants_on_model(o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_FALSE(results[0].found);
  EXPECT_EQ(results[0].cases, 1);
}

}  // namespace
}  // namespace tally::fuzz
