// The model target: tally's own model of the grad-norm path on a backend (sim, mpi, nccl).
#include <memory>

#include "gradnorm/reduction.h"
#include "vocab/faults.h"
#include "run/run_case.h"
#include "run/target.h"

namespace tally::run {

namespace {

// Where generated cases take their gradients before Megatron's reduction: a sixteenth of them (and
// every case with a reduction fault: fuzz/generators.cpp), drawn from the case's own gradient seed so
// a campaign stays reproducible from its seed. Such a case costs about 1.6 cases after it (every
// rank reduces every element it holds: bench/RESULTS.md, issue 49), so only at worlds and sizes
// where dealing each element to every rank of its groups stays small.
constexpr int kReductionMaxWorld = 64;
constexpr std::int64_t kReductionMaxElements = std::int64_t{1} << 14;

casefile::Case within_model(casefile::Case c) {
  vocab::GradientSpec& gradients = c.path.gradients;
  if (gradients.before_reduction || (gradients.generator.seed / 160) % 16 != 1) return c;
  if (c.topology.world > kReductionMaxWorld || gradnorm::reduction_refusal(c.topology)) return c;
  // A custom layout may be large (the big-zeros scenario); the generator's GPT models are small.
  std::int64_t elements = 0;
  for (const topologies::CustomParam& p : c.model.params) {
    std::int64_t n = 1;
    for (std::int64_t d : p.shape) n *= d;
    elements += n;
  }
  if (elements > kReductionMaxElements) return c;
  gradients.before_reduction = true;
  return c;
}

class ModelTarget final : public Target {
 public:
  explicit ModelTarget(Backend& backend) : backend_(backend) {
    abilities_.name = "model";
    abilities_.version = std::string(tally_version());
    abilities_.world = backend.world();
    for (const vocab::FaultInfo& info : vocab::fault_catalog()) {
      const std::string name(info.name);
      // On sim a hang is a verdict; on mpi and nccl the watchdog ends the whole job (exit 3).
      if (info.fault == vocab::Fault::empty_rank_skips_collective && backend.world() > 0)
        abilities_.plants.not_planted[name] =
            "on a process-per-rank backend the hang it causes ends the job (exit 3): run it on sim, or see the "
            "hang tests";
      else
        abilities_.plants.planted[name] = "the rule switched in tally's model of the path";
    }
  }

  std::string_view name() const override { return "model"; }
  bool framework() const override { return false; }
  const TargetAbilities& open(int /*world*/) override { return abilities_; }
  std::optional<std::string> refusal_before_open(const casefile::Case&) const override { return std::nullopt; }
  // A case of another world than an mpi or nccl job's is no case of this job: NotRunnableHere,
  // before anything is saved.
  std::optional<std::string> refusal(const casefile::Case& c) override {
    if (std::optional<std::string> why = backend_.misfit(c)) throw NotRunnableHere(*why);
    if (c.path.gradients.before_reduction) return gradnorm::reduction_refusal(c.topology);
    return std::nullopt;
  }
  // On sim a hang is a verdict; on a process-per-rank backend the watchdog ends the whole job.
  bool hang_ends_the_job() const override { return backend_.world() > 0; }
  bool runs_cases_side_by_side() const override { return backend_.runs_cases_side_by_side(); }
  casefile::Case within(casefile::Case c) override { return within_model(std::move(c)); }
  casefile::Case from_flags(casefile::Case c) const override { return c; }
  std::vector<std::pair<std::string, casefile::Case>> sweep_variants(const casefile::Case& base) const override {
    std::vector<std::pair<std::string, casefile::Case>> out = optimizer_variants(base);
    // DDP's all-reduce and the distributed optimizer's, on gradients that enter before them.
    if (gradnorm::reduction_refusal(base.topology)) return out;
    for (auto& variant : unreduced_variants(base)) out.push_back(std::move(variant));
    return out;
  }

  // The mpi and nccl backends bring back only the verdict to this process, not the path's
  // result on every rank that the manifests are made from.
  std::optional<std::string> manifests_refusal() const override {
    if (backend_.name() == "sim") return std::nullopt;
    return "needs --backend sim (the " + std::string(backend_.name()) +
           " backend returns only the verdict, not each rank's decisions)";
  }

  TargetRun execute(const casefile::Case& c, bool keep_record) override {
    TargetRun out;
    if (keep_record && !manifests_refusal()) {
      CaseRun run = run_case_with_record(c);
      out.verdict = std::move(run.verdict);
      out.record = std::move(run.record);
    } else {
      out.verdict = backend_.run(c, {});
    }
    return out;
  }

  std::optional<casefile::RealTarget> release_of(const casefile::Case&) override { return std::nullopt; }
  std::optional<std::string> evidence_of(const casefile::Case&) const override { return std::nullopt; }

 private:
  Backend& backend_;
  TargetAbilities abilities_;
};

}  // namespace

std::unique_ptr<Target> model_target(Backend& backend) { return std::make_unique<ModelTarget>(backend); }

}  // namespace tally::run
