#include "fuzz/sweep_lanes.h"

#include <algorithm>
#include <mutex>
#include <thread>

namespace tally::fuzz {

std::vector<std::vector<const SweepCase*>> cases_by_layout(const std::vector<const SweepCase*>& cases) {
  std::vector<std::vector<const SweepCase*>> out;
  for (const SweepCase* sc : cases) {
    if (out.empty() || out.back().front()->layout != sc->layout) out.emplace_back();
    out.back().push_back(sc);
  }
  return out;
}

std::exception_ptr open_sweep_lanes(std::span<run::Target* const> lanes, int world) {
  std::vector<run::Target*> distinct;
  for (run::Target* lane : lanes)
    if (std::find(distinct.begin(), distinct.end(), lane) == distinct.end()) distinct.push_back(lane);
  std::vector<std::exception_ptr> errors(distinct.size());
  {
    std::vector<std::jthread> opening;
    for (std::size_t i = 0; i < distinct.size(); ++i)
      opening.emplace_back([&, i] {
        try {
          distinct[i]->open(world);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
  }
  for (const std::exception_ptr& error : errors)
    if (error) return error;
  return nullptr;
}

LanesEnd run_sweep_lanes(std::span<run::Target* const> lanes, int world, const std::vector<const SweepCase*>& cases,
                         const SweepRunOptions& options,
                         const std::function<bool(std::size_t lane, const SweepCase&, const SweepResult&)>& on_result,
                         const std::function<bool()>& interrupted) {
  LanesEnd end;
  if (lanes.empty()) return end;
  if (std::exception_ptr error = open_sweep_lanes(lanes, world)) {
    end.error = error;
    return end;
  }
  const std::vector<std::vector<const SweepCase*>> layouts = cases_by_layout(cases);
  std::mutex lock;
  std::size_t next_layout = 0;
  bool stop = false;
  // The first error of a case or of `on_result`; every lane stops after its current case.
  const auto fail = [&](const std::string& at) {
    if (!end.error) {
      end.error = std::current_exception();
      end.error_at = at;
    }
    stop = true;
  };
  auto lane_loop = [&](std::size_t lane, run::Target& target) {
    for (;;) {
      const std::vector<const SweepCase*>* layout = nullptr;
      {
        std::lock_guard held(lock);
        if (stop || next_layout == layouts.size()) return;
        layout = &layouts[next_layout++];
      }
      for (const SweepCase* sc : *layout) {
        {
          std::lock_guard held(lock);
          if (stop) return;
          if (interrupted()) {
            end.stopped = stop = true;
            return;
          }
        }
        SweepResult r;
        try {
          r = run_sweep_case(*sc, target, options);
        } catch (...) {
          std::lock_guard held(lock);
          fail(sc->id);
          return;
        }
        std::lock_guard held(lock);
        try {
          if (!on_result(lane, *sc, r)) end.stopped = stop = true;
        } catch (...) {  // saving the state, say: in a lane's thread it would end the process
          fail(sc->id);
          return;
        }
      }
    }
  };
  if (lanes.size() == 1) {
    lane_loop(0, *lanes.front());
    return end;
  }
  {
    std::vector<std::jthread> running;
    for (std::size_t lane = 0; lane < lanes.size(); ++lane)
      running.emplace_back([&lane_loop, lane, target = lanes[lane]] { lane_loop(lane, *target); });
  }
  return end;
}

}  // namespace tally::fuzz
