// A target for tests: each case is run by a function (a stand-in for a framework that errs, hangs
// or miscounts in a way the test chooses), opened with the abilities the test gives it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "run/target.h"

namespace tally::testing {

class RunnerTarget final : public run::Target {
 public:
  using Runner = std::function<oracle::Verdict(const casefile::Case&)>;

  // A real framework (megatron-core "0.0-stand-in", every catalog fault planted: a name a case
  // file may hold) of `world` whose runs are `run`.
  RunnerTarget(Runner run, int world) : run_(std::move(run)) {
    abilities_.name = "megatron-core";
    abilities_.version = "0.0-stand-in";
    abilities_.world = world;
    abilities_.framework = true;
    for (const vocab::FaultInfo& info : vocab::fault_catalog())
      abilities_.plants.planted[std::string(info.name)] = "the test's";
  }

  std::string_view name() const override { return abilities_.name; }
  bool framework() const override { return abilities_.framework; }
  const run::TargetAbilities& open(int) override {
    ++opened;
    return abilities_;
  }
  std::optional<std::string> refusal_before_open(const casefile::Case& c) const override {
    return refuses_before_open ? refuses_before_open(c) : std::nullopt;
  }
  std::optional<std::string> refusal(const casefile::Case& c) override {
    return refuses ? refuses(c) : std::nullopt;
  }
  casefile::Case within(casefile::Case c) override { return c; }
  casefile::Case from_flags(casefile::Case c) const override { return c; }
  std::vector<std::pair<std::string, casefile::Case>> sweep_variants(const casefile::Case& base) const override {
    return run::optimizer_variants(base);
  }
  bool hang_ends_the_job() const override { return hang_ends_job; }
  std::optional<std::string> manifests_refusal() const override { return no_manifests; }
  run::TargetRun execute(const casefile::Case& c, bool) override {
    executed.push_back(c);
    run::TargetRun out;
    out.verdict = run_(c);
    out.how = "run by the stand-in";
    return out;
  }
  std::optional<casefile::RealTarget> release_of(const casefile::Case&) override {
    ++releases_asked;
    return casefile::RealTarget{abilities_.name, abilities_.version, ""};
  }
  std::optional<std::string> evidence_of(const casefile::Case&) const override { return evidence; }

  std::function<std::optional<std::string>(const casefile::Case&)> refuses_before_open, refuses;
  bool hang_ends_job = false;
  std::optional<std::string> no_manifests;  // manifests_refusal's answer
  int opened = 0;
  std::vector<casefile::Case> executed;
  int releases_asked = 0;               // release_of's calls
  std::optional<std::string> evidence;  // evidence_of's answer: a folder the test made, or none

 private:
  Runner run_;
  run::TargetAbilities abilities_;
};

}  // namespace tally::testing
