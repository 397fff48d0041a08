// The mpi and nccl backends' case protocol (built with TALLY_HAVE_MPI only). Rank 0 broadcasts
// "run\n<case file text>" or "done\n<exit code>"; every process runs its ranks of the path
// through its RankEngine; rank 0 gathers the encoded rank records and judges.
#include <algorithm>
#include <exception>
#include <map>

#include "comm/mpi_communicator.h"
#include "run/backend.h"
#include "casefile/case_file.h"
#include "run/target.h"
#include "run/record_wire.h"
#include "run/run_case.h"
#include "kernels/local_stats_cuda.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"

namespace tally::run {

// The layout of the last configuration: a campaign's cases often share it, and the engine's
// communicators for it are created once (a collective over every process).
struct MpiConfigCache {
  topologies::ParallelConfig config;
  std::unique_ptr<topologies::RankLayout> layout;
};

namespace {

// One MPI communicator set per configuration, the CPU kernels.
class MpiEngine final : public RankEngine {
 public:
  explicit MpiEngine(const comm::MpiSession& session) : session_(session) {}
  std::string_view name() const override { return "mpi"; }
  int ranks_per_process() const override { return 1; }
  comm::Communicator& prepare(const topologies::RankLayout& layout, bool new_layout,
                              std::span<const topologies::Family> families) override {
    if (new_layout || !communicator_) {
      communicator_.reset();
      communicator_ = std::make_unique<comm::MpiCommunicator>(layout, session_, families);
    } else {
      communicator_->add_families(families);
    }
    return *communicator_;
  }
  kernels::LocalStatsFn local_stats() const override { return kernels::local_stats_cpu; }
  kernels::ClipScaleFn clip_scale() const override { return kernels::clip_scale_cpu; }

 private:
  const comm::MpiSession& session_;
  std::unique_ptr<comm::MpiCommunicator> communicator_;
};

// Each process's k records travel as one string: "<bytes>\n<encoded record>" per rank.
std::string frame(const record::RunRecord& run) {
  std::string out;
  for (const record::RankRecord& rank : run.ranks) {
    const std::string bytes = encode_rank_record(rank, run.groups);
    out += std::to_string(bytes.size()) + "\n" + bytes;
  }
  return out;
}

std::vector<std::string_view> unframe(std::string_view all) {
  std::vector<std::string_view> parts;
  while (!all.empty()) {
    const std::size_t newline = all.find('\n');
    if (newline == std::string_view::npos) throw std::invalid_argument("a truncated rank record");
    const std::size_t length = std::stoull(std::string(all.substr(0, newline)));
    if (newline + 1 + length > all.size()) throw std::invalid_argument("a truncated rank record");
    parts.push_back(all.substr(newline + 1, length));
    all.remove_prefix(newline + 1 + length);
  }
  return parts;
}

// The line of a failure that ends the job: an InfraError names what waited or failed; any
// other exception in the middle of the case protocol is a bug, named as one.
std::string failure_text(const std::exception& error) {
  if (dynamic_cast<const comm::InfraError*>(&error)) return error.what();
  return std::string("unexpected error while running a case: ") + error.what();
}

// Runs this process's ranks of `c`. The caller ends the job on any exception: the other
// processes may be blocked in collectives that will never complete.
gradnorm::PathResult run_own_ranks(const comm::MpiSession& session, RankEngine& engine,
                                   const casefile::Case& c, std::unique_ptr<MpiConfigCache>& cached) {
  const topologies::LogicalModel model(c.model, c.topology);
  // Only the stats groups this case reduces over: every process derives the same list.
  const std::vector<topologies::Family> families = gradnorm::families_reduced_over(
      gradnorm::plan_optimizer(c.path.optimizer, model, c.path.faults), c.path);
  const bool new_layout = !cached || cached->config != c.topology;
  if (new_layout) {
    cached.reset();
    auto fresh = std::make_unique<MpiConfigCache>();
    fresh->config = c.topology;
    fresh->layout = std::make_unique<topologies::RankLayout>(c.topology);
    cached = std::move(fresh);
  }
  comm::Communicator& communicator = engine.prepare(*cached->layout, new_layout, families);
  const int k = engine.ranks_per_process();
  std::vector<int> ranks(static_cast<std::size_t>(k));
  for (int i = 0; i < k; ++i) ranks[i] = session.rank() * k + i;
  return gradnorm::run_path(model, *cached->layout, c.path, communicator, ranks,
                            engine.local_stats(), engine.clip_scale());
}

}  // namespace

std::unique_ptr<RankEngine> make_mpi_engine(const comm::MpiSession& session) {
  return std::make_unique<MpiEngine>(session);
}

MpiBackend::MpiBackend(const comm::MpiSession& session)
    : MpiBackend(session, make_mpi_engine(session)) {}
MpiBackend::MpiBackend(const comm::MpiSession& session, std::unique_ptr<RankEngine> engine)
    : session_(session), engine_(std::move(engine)) {}
MpiBackend::~MpiBackend() = default;

std::string_view MpiBackend::name() const { return engine_->name(); }

int MpiBackend::world() const { return session_.size() * engine_->ranks_per_process(); }

std::optional<std::string> MpiBackend::misfit(const casefile::Case& c) const {
  const int k = engine_->ranks_per_process();
  if (c.topology.world == session_.size() * k) return std::nullopt;
  if (k == 1)
    return "the case has world " + std::to_string(c.topology.world) + " but the " + std::string(name()) +
           " job has " + std::to_string(session_.size()) + " processes (mpirun -np must equal the case's world)";
  return "the case has world " + std::to_string(c.topology.world) + " but the " + std::string(name()) +
         " job runs " + std::to_string(session_.size()) + " processes x " + std::to_string(k) +
         " ranks per GPU = " + std::to_string(session_.size() * k) +
         " ranks (mpirun -np G with --ranks-per-gpu k must give G * k = world)";
}

oracle::Verdict MpiBackend::run(const casefile::Case& c, const oracle::JudgeOptions& judge) {
  if (std::optional<std::string> error = casefile::check_case(c)) throw casefile::InvalidCase(*error);
  if (std::optional<std::string> why = misfit(c)) throw NotRunnableHere(*why);
  std::string message = "run\n" + casefile::case_to_text(c);
  gradnorm::PathResult result;
  std::vector<std::string> parts;
  // From the broadcast to the gather the other processes follow this case: a failure here,
  // thrown on to the command, would leave them blocked and the command would go on to the
  // next case or to finish(). So it ends the job.
  try {
    session_.broadcast(message, 0, "a case");
    result = run_own_ranks(session_, *engine_, c, cached_);
    parts = session_.gather(frame(result.record), 0, "rank records");
  } catch (const std::exception& error) {
    session_.end_job(failure_text(error));
  }
  // The whole run's record: this process's run-wide part, every process's ranks.
  record::RunRecord& run = result.record;
  run.ranks.clear();
  run.groups.clear();
  record::GroupTable groups(run.groups);
  record::LocalRecordPool locals;
  for (const std::string& part : parts)
    for (std::string_view bytes : unframe(part))
      run.ranks.push_back(decode_rank_record(bytes, groups, locals));
  run.producer = model_target_producer(c.path);
  const topologies::LogicalModel model(c.model, c.topology);
  return judge_model_run(c, model, *cached_->layout, result.plan, run, judge);
}

void MpiBackend::finish(int exit_code) {
  std::string message = "done\n" + std::to_string(exit_code);
  try {
    session_.broadcast(message, 0, "the end of the command");
  } catch (const std::exception& error) {
    session_.end_job(failure_text(error));
  }
}

int serve_mpi_cases(const comm::MpiSession& session) {
  const std::unique_ptr<RankEngine> engine = make_mpi_engine(session);
  return serve_mpi_cases(session, *engine);
}

int serve_mpi_cases(const comm::MpiSession& session, RankEngine& engine) {
  std::unique_ptr<MpiConfigCache> cached;
  // Every failure ends the job: rank 0 and the other processes wait for this one's part.
  try {
    while (true) {
      std::string message;
      session.broadcast(message, 0, "the next case from rank 0", /*patient=*/true);
      const std::size_t newline = message.find('\n');
      const std::string verb = message.substr(0, newline);
      const std::string body = newline == std::string::npos ? "" : message.substr(newline + 1);
      if (verb == "done") return std::stoi(body);
      const casefile::Case c = casefile::case_from_text(body, "the case from rank 0", case_frameworks());
      const gradnorm::PathResult result = run_own_ranks(session, engine, c, cached);
      session.gather(frame(result.record), 0, "rank records");
    }
  } catch (const std::exception& error) {
    session.end_job(failure_text(error));
  }
}

}  // namespace tally::run
