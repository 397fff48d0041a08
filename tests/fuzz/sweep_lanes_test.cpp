// The lanes of a sweep: every case heard once, a layout's cases on one lane in order, a stop heard
// by every lane, an error that names its case.
#include "fuzz/sweep_lanes.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

#include "casefile/case_file.h"
#include "run/backend.h"
#include "tests/support/model_lane.h"

namespace tally::fuzz {
namespace {

// tally's model, remembering which cases it executed (by their topology, which is their layout's)
// and throwing TargetUnavailable at its case `fail_after` (0: its first).
class RecordingLane : public testing::ModelLane {
 public:
  RecordingLane(run::Backend& backend, std::int64_t fail_after = -1) : ModelLane(backend), fail_after_(fail_after) {}
  const run::TargetAbilities& open(int world) override {
    ++opened;
    return ModelLane::open(world);
  }
  run::TargetRun execute(const casefile::Case& c, bool keep_record) override {
    if (fail_after_ >= 0 && static_cast<std::int64_t>(layouts.size()) >= fail_after_)
      throw run::TargetUnavailable("the lane's worker is gone (as the test asks)");
    if (opened == 0) ran_unopened = true;
    layouts.push_back(casefile::case_to_json(c)["topology"].dump());
    return ModelLane::execute(c, keep_record);
  }
  std::vector<std::string> layouts;  // each executed case's topology, in order
  int opened = 0;
  bool ran_unopened = false;

 private:
  std::int64_t fail_after_;
};

std::vector<const SweepCase*> pointers(const SweepPlan& plan) {
  std::vector<const SweepCase*> out;
  for (const SweepCase& sc : plan.cases) out.push_back(&sc);
  return out;
}

TEST(SweepLanes, CasesByLayoutCutsTheSweepWhereTheLayoutChanges) {
  run::SimBackend backend;
  RecordingLane lane(backend);
  SweepOptions options;
  options.world = 4;
  const SweepPlan plan = plan_sweep(options, lane);
  const auto layouts = cases_by_layout(pointers(plan));
  ASSERT_EQ(layouts.size(), plan.layouts.layouts.size());
  std::size_t cases = 0;
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    for (const SweepCase* sc : layouts[l]) EXPECT_EQ(sc->layout, static_cast<int>(l));
    cases += layouts[l].size();
  }
  EXPECT_EQ(cases, plan.cases.size());
}

TEST(SweepLanes, EveryCaseIsHeardOnceAndALayoutRunsWholeOnOneLane) {
  run::SimBackend backend;
  std::vector<std::unique_ptr<RecordingLane>> owned;
  std::vector<run::Target*> lanes;
  for (int i = 0; i < 3; ++i) {
    owned.push_back(std::make_unique<RecordingLane>(backend));
    lanes.push_back(owned.back().get());
  }
  SweepOptions options;
  options.world = 4;
  const SweepPlan plan = plan_sweep(options, *owned.front());
  std::map<std::int64_t, SweepResult> heard;
  const LanesEnd end = run_sweep_lanes(
      lanes, 4, pointers(plan), {},
      [&](std::size_t, const SweepCase& sc, const SweepResult& r) {
        EXPECT_TRUE(heard.emplace(sc.index, r).second) << sc.id << " heard twice";
        return true;
      },
      [] { return false; });
  EXPECT_FALSE(end.stopped);
  EXPECT_FALSE(end.error);
  ASSERT_EQ(heard.size(), plan.cases.size());
  const std::unique_ptr<run::Target> alone_target = run::model_target(backend);
  for (const SweepCase& sc : plan.cases) {
    SweepResult alone = run_sweep_case(sc, *alone_target, {});
    EXPECT_EQ(heard[sc.index].outcome, alone.outcome) << sc.id;
    EXPECT_EQ(heard[sc.index].detail, alone.detail) << sc.id;
  }
  // Each layout's cases ran on one lane, one after another.
  std::map<std::string, int> layout_of;  // a case's topology -> its layout
  for (const SweepCase& sc : plan.cases) layout_of[casefile::case_to_json(sc.c)["topology"].dump()] = sc.layout;
  std::map<int, int> lane_of;  // layout -> the lane that ran it
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(owned[i]->ran_unopened) << "lane " << i << " is opened before its cases";
    EXPECT_GT(owned[i]->layouts.size(), 0u) << "lane " << i << " ran no case";
    std::set<int> left;  // layouts this lane has finished
    int current = -1;
    for (const std::string& topology : owned[i]->layouts) {
      const int layout = layout_of.at(topology);
      const auto [it, fresh] = lane_of.emplace(layout, i);
      EXPECT_EQ(it->second, i) << "layout " << layout << " ran on lanes " << it->second << " and " << i;
      if (layout != current) {
        EXPECT_FALSE(left.contains(layout)) << "lane " << i << " came back to layout " << layout;
        if (current >= 0) left.insert(current);
        current = layout;
      }
    }
  }
  EXPECT_EQ(lane_of.size(), plan.layouts.layouts.size());
}

TEST(SweepLanes, AStopIsHeardByEveryLaneAndAnErrorNamesItsCase) {
  run::SimBackend backend;
  RecordingLane first(backend), second(backend);
  std::vector<run::Target*> lanes{&first, &second};
  SweepOptions options;
  options.world = 2;
  const SweepPlan plan = plan_sweep(options, first);
  int heard = 0;
  LanesEnd end = run_sweep_lanes(
      lanes, 2, pointers(plan), {}, [&](std::size_t, const SweepCase&, const SweepResult&) { return ++heard < 5; },
      [] { return false; });
  EXPECT_TRUE(end.stopped);
  EXPECT_GE(heard, 5);
  EXPECT_LE(heard, 6) << "each lane ends its case, then stops";

  RecordingLane failing(backend, 3);
  const std::vector<run::Target*> one{&failing};
  end = run_sweep_lanes(one, 2, pointers(plan), {}, [](std::size_t, const SweepCase&, const SweepResult&) { return true; },
                        [] { return false; });
  ASSERT_TRUE(end.error);
  EXPECT_EQ(end.error_at, plan.cases[3].id);
  EXPECT_THROW(std::rethrow_exception(end.error), run::TargetUnavailable);
  EXPECT_EQ(failing.layouts.size(), 3u);
}

TEST(SweepLanes, AnErrorOfOnResultInALanesThreadIsReturnedNotTheEndOfTheProcess) {
  run::SimBackend backend;
  RecordingLane first(backend), second(backend);
  std::vector<run::Target*> lanes{&first, &second};
  SweepOptions options;
  options.world = 2;
  const SweepPlan plan = plan_sweep(options, first);
  int heard = 0;
  const LanesEnd end = run_sweep_lanes(
      lanes, 2, pointers(plan), {},
      [&](std::size_t, const SweepCase&, const SweepResult&) -> bool {
        if (++heard == 3) throw std::runtime_error("cannot write the state (as the test asks)");
        return true;
      },
      [] { return false; });
  ASSERT_TRUE(end.error);
  EXPECT_THROW(std::rethrow_exception(end.error), std::runtime_error);
  EXPECT_FALSE(end.error_at.empty());
  EXPECT_LE(heard, 4) << "each lane ends its case, then stops";
}

TEST(SweepLanes, EachCaseIsHeardWithTheLaneThatRanIt) {
  run::SimBackend backend;
  RecordingLane first(backend), second(backend);
  std::vector<run::Target*> lanes{&first, &second};
  SweepOptions options;
  options.world = 4;
  const SweepPlan plan = plan_sweep(options, first);
  std::size_t by_lane[2] = {0, 0};
  const LanesEnd end = run_sweep_lanes(
      lanes, 4, pointers(plan), {},
      [&](std::size_t lane, const SweepCase&, const SweepResult& r) {
        if (r.outcome != SweepResult::Outcome::refused) ++by_lane[lane];
        return true;
      },
      [] { return false; });
  EXPECT_FALSE(end.error);
  EXPECT_EQ(by_lane[0], first.layouts.size());
  EXPECT_EQ(by_lane[1], second.layouts.size());
}

}  // namespace
}  // namespace tally::fuzz
