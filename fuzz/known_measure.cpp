#include "fuzz/known_measure.h"

#include <chrono>
#include <set>
#include <tuple>

#include "fuzz/generators.h"
#include "run/model_manifests.h"
#include "run/run_case.h"
#include "run/target.h"
#include "run/target_run.h"

namespace tally::fuzz {

namespace {

using Counts = std::set<std::tuple<std::string, std::string, std::int64_t, std::int64_t>>;
Counts counts_of(const oracle::Verdict& v) {
  Counts out;
  for (const oracle::Miscount& m : v.miscounted) out.emplace(m.name, m.ledger, m.least, m.most);
  return out;
}

bool differs(const oracle::Verdict& a, const oracle::Verdict& b) {
  return a.kind != b.kind || counts_of(a) != counts_of(b);
}

std::string joined(const Explanation& e) {
  std::string out;
  for (const std::string& name : e.findings) out += (out.empty() ? "" : " + ") + name;
  return out;
}

}  // namespace

oracle::Verdict stand_in_run(const casefile::Case& c, const vocab::FaultSet& planted) {
  casefile::Case model = c;
  model.target.reset();
  model.expect.reset();
  model.path.faults = model.path.faults.with(planted);
  const run::CaseRun ran = run::run_case_with_record(model);
  if (!ran.record) return ran.verdict;
  return run::judge_target_manifests(c, run::model_manifests(model, *ran.record), oracle::kFrameworkRtol);
}

MatcherMeasure measure_known_matcher(const std::vector<KnownFinding>& known, const std::string& version, int world,
                                     std::int64_t cases, std::uint64_t seed) {
  const auto start = std::chrono::steady_clock::now();
  MatcherMeasure out;
  out.world = world;
  const run::FrameworkTarget* megatron = run::framework_target("megatron-core");
  // What a worker running tally's model says of itself: it plants every fault, and builds no
  // Megatron-FSDP and no layer-wise parameter layout (tally has no model of them).
  run::WorkerHello hello;
  hello.framework = "megatron-core";
  hello.version = version;
  hello.megatron_model_rules = true;
  for (const vocab::FaultInfo& info : vocab::fault_catalog()) hello.plants.planted[std::string(info.name)] = "tally's model";
  for (std::string_view setting : megatron->cannot_run) hello.cannot_run[std::string(setting)] = "tally's model";
  std::set<vocab::Fault> causes;
  for (const KnownFinding& k : known)
    if (k.spec.fault) causes.insert(*k.spec.fault);
  CaseGenOptions options;
  options.topology.exact_world = world;
  options.topology.avoid_megatron_corners = false;
  options.gpt_only = true;
  options.restrict_to = [&](casefile::Case c) { return megatron->within(std::move(c), hello); };
  const auto miss = [&](const std::string& line) {
    if (out.misses.size() < 20) out.misses.push_back(line);
  };
  for (std::int64_t i = 0; i < cases; ++i) {
    casefile::Case c = generate_case(options, seed, i).value();
    c.target = casefile::RealTarget{"megatron-core", version, ""};
    if (megatron->refusal(c, hello)) continue;
    const std::optional<casefile::Case> model_case = megatron->release_model_case(c, version);
    if (!model_case) continue;
    ++out.cases;
    const std::string where = "world " + std::to_string(world) + " case " + std::to_string(i) + " (seed " +
                              std::to_string(seed) + ", " + known_path(c) + ")";
    const vocab::FaultSet release_faults = model_case->path.faults;
    const oracle::Verdict release = stand_in_run(c, release_faults);
    if (release.kind == oracle::Verdict::Kind::fail) {
      ++out.release_failures;
      const Explanation e = explain(known, c, release);
      if (e.findings.empty()) {
        ++out.release_new;
        miss(where + ": the release's own failure is called new: " + e.why_new);
      }
    }
    const oracle::Verdict unplanted = stand_in_run(c, {});
    for (const vocab::FaultInfo& info : vocab::fault_catalog()) {
      // A hang is no verdict to match; a cause of a finding is that finding.
      if (causes.contains(info.fault) || info.fault == vocab::Fault::empty_rank_skips_collective) continue;
      const oracle::Verdict with_release = stand_in_run(c, release_faults.with(info.fault));
      if (with_release.kind == oracle::Verdict::Kind::fail && differs(with_release, release)) {
        PlantedCounts& n = out.in_release[info.fault];
        ++n.failures;
        const Explanation e = explain(known, c, with_release);
        if (!e.findings.empty()) {
          ++n.known;
          miss(where + ": " + std::string(info.name) + " planted in the release is called " + joined(e));
        }
      }
      const oracle::Verdict planted = stand_in_run(c, vocab::FaultSet::of({info.fault}));
      if (planted.kind != oracle::Verdict::Kind::fail || unplanted.kind == oracle::Verdict::Kind::fail) continue;
      PlantedCounts& n = out.alone[info.fault];
      ++n.failures;
      const Explanation e = explain(known, c, planted);
      if (e.findings.empty()) continue;
      if (!differs(planted, release)) {
        ++n.coincidences;
        continue;
      }
      ++n.known;
      miss(where + ": " + std::string(info.name) + " planted alone is called " + joined(e));
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace tally::fuzz
