// A target for sweep tests: tally's model on a backend, every call forwarded to it, for a test to
// override the one it watches or breaks (what a lane executed, a release it claims, a worker that
// stops answering).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "run/backend.h"
#include "run/target.h"

namespace tally::testing {

class ModelLane : public run::Target {
 public:
  explicit ModelLane(run::Backend& backend) : model_(run::model_target(backend)) {}
  std::string_view name() const override { return model_->name(); }
  bool framework() const override { return false; }
  const run::TargetAbilities& open(int world) override { return model_->open(world); }
  std::optional<std::string> refusal_before_open(const casefile::Case& c) const override { return model_->refusal_before_open(c); }
  std::optional<std::string> refusal(const casefile::Case& c) override { return model_->refusal(c); }
  casefile::Case within(casefile::Case c) override { return model_->within(std::move(c)); }
  casefile::Case from_flags(casefile::Case c) const override { return model_->from_flags(std::move(c)); }
  std::vector<std::pair<std::string, casefile::Case>> sweep_variants(const casefile::Case& base) const override {
    return model_->sweep_variants(base);
  }
  std::optional<std::string> manifests_refusal() const override { return model_->manifests_refusal(); }
  run::TargetRun execute(const casefile::Case& c, bool keep_record) override { return model_->execute(c, keep_record); }
  std::optional<casefile::RealTarget> release_of(const casefile::Case&) override { return std::nullopt; }
  std::optional<std::string> evidence_of(const casefile::Case&) const override { return std::nullopt; }

 private:
  std::unique_ptr<run::Target> model_;
};

}  // namespace tally::testing
