// The MPI program of stalled_process_mpi_test.cpp, run under mpirun -np 2: one process stops
// itself (SIGSTOP) at a chosen point, as a hung or descheduled rank would, and the test checks
// how the job ends.
//
//   stall_helper cli STALL_RANK TALLY_ARGS...
//     MPI_Init; process STALL_RANK stops; every process then runs `tally TALLY_ARGS...` as the
//     tally binary does (cli::run_tally), so the other process meets a peer that never arrives.
//   stall_helper engine STALL_RANK TIMEOUT CASE_FILE
//     Rank 0 runs CASE_FILE through an MpiBackend as a command does (an error it throws is the
//     command's exit code 3, then finish()); rank 1 serves. Process STALL_RANK stops when its
//     engine is about to create the case's communicators, after the case was broadcast (-1:
//     none stops). TIMEOUT is the watchdog's, in seconds, with no lower bound.
#include <mpi.h>

#include <csignal>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "casefile/case_file.h"
#include "cli/commands.h"
#include "comm/mpi_communicator.h"
#include "run/backend.h"
#include "run/target.h"

namespace {

// The mpi engine, stopping this process first when `stall` says so.
class StallingEngine final : public tally::run::RankEngine {
 public:
  StallingEngine(std::unique_ptr<tally::run::RankEngine> inner, bool stall)
      : inner_(std::move(inner)), stall_(stall) {}
  std::string_view name() const override { return inner_->name(); }
  int ranks_per_process() const override { return inner_->ranks_per_process(); }
  tally::comm::Communicator& prepare(const tally::topologies::RankLayout& layout, bool new_layout,
                                     std::span<const tally::topologies::Family> families) override {
    if (stall_) std::raise(SIGSTOP);
    return inner_->prepare(layout, new_layout, families);
  }
  tally::kernels::LocalStatsFn local_stats() const override { return inner_->local_stats(); }
  tally::kernels::ClipScaleFn clip_scale() const override { return inner_->clip_scale(); }

 private:
  std::unique_ptr<tally::run::RankEngine> inner_;
  bool stall_;
};

int run_cli(int stall_rank, int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == stall_rank) std::raise(SIGSTOP);
  std::vector<const char*> args = {"tally"};
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  return tally::cli::run_tally(static_cast<int>(args.size()), args.data(), std::cout, std::cerr);
}

int run_engine(int stall_rank, double timeout, const std::string& case_file) {
  tally::comm::MpiSession session(nullptr, nullptr, tally::comm::MpiOptions{timeout});
  auto engine = std::make_unique<StallingEngine>(tally::run::make_mpi_engine(session),
                                                 session.rank() == stall_rank);
  if (session.rank() != 0) return tally::run::serve_mpi_cases(session, *engine);
  const tally::casefile::Case c = tally::casefile::load_case_file(case_file, tally::run::case_frameworks());
  tally::run::MpiBackend backend(session, std::move(engine));
  int code = 0;
  try {
    backend.run(c, {});
  } catch (const std::exception& error) {  // what the commands do (cli/fuzz_command.cpp)
    std::cerr << "tally: error: " << error.what() << '\n';
    code = 3;
  }
  backend.finish(code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "usage: stall_helper cli STALL_RANK TALLY_ARGS... | engine STALL_RANK TIMEOUT CASE_FILE";
  if (argc >= 3 && std::string(argv[1]) == "cli") return run_cli(std::stoi(argv[2]), argc - 3, argv + 3);
  if (argc == 5 && std::string(argv[1]) == "engine")
    return run_engine(std::stoi(argv[2]), std::stod(argv[3]), argv[4]);
  std::cerr << usage << '\n';
  return 2;
}
