#include "comm/mpi_communicator.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace tally::comm {

namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

// CHECK for MPI calls: names the call, file:line and the library's message; a typed error.
#define TALLY_MPI_CHECK(call)                                                              \
  do {                                                                                     \
    const int tally_mpi_code = (call);                                                     \
    if (tally_mpi_code != MPI_SUCCESS)                                                     \
      throw InfraError(#call, std::string(#call) + " failed at " + __FILE__ + ":" +        \
                                  std::to_string(__LINE__) + ": " +                        \
                                  mpi_error_text(tally_mpi_code));                         \
  } while (0)

// Three significant digits, whole seconds from 100 s: what was waited, not rounded down (a
// timeout of 1.5 s waited "1.5", not "1"; of 0.001 s "0.00105", not "0").
std::string seconds_text(double seconds) {
  if (seconds >= 100.0) return std::to_string(static_cast<long long>(seconds + 0.5));
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", seconds);
  return text;
}

// The watchdog's message: what `world_rank` waited for and how long.
std::string hang_text(int world_rank, double waited, const std::string& call) {
  return "rank " + std::to_string(world_rank) + " waited " + seconds_text(waited) + " s in " +
         call + ": a member never joined (the job would hang)";
}

// Waits for a non-blocking collective with a deadline. Polls, yielding the core: under
// --oversubscribe several ranks share one core.
void wait_with_watchdog(MPI_Request& request, double timeout_seconds, int world_rank,
                        const std::string& call) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    TALLY_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_seconds) throw InfraError(call, hang_text(world_rank, waited, call));
    if (polls < 1000)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 10000 ? 50 : 500));
  }
}

}  // namespace

bool mpi_available() { return true; }

MpiSession::MpiSession(int* argc, char*** argv, MpiOptions options)
    : options_(options), owner_(std::this_thread::get_id()) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized)
    TALLY_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  else
    MPI_Query_thread(&provided);
  thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
  // Errors come back as codes and become InfraError, never an abort inside the library.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // MPI_Finalize waits for every process without a deadline: meet them here first, under the
  // watchdog. A destructor must not throw, so a missing process ends the job.
  try {
    MPI_Request request;
    TALLY_MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &request));
    wait_with_watchdog(request, options_.timeout_seconds, rank_, "the barrier before MPI_Finalize");
  } catch (const std::exception& error) {
    end_job(error.what());
  }
  MPI_Finalize();
}

void MpiSession::blocking_call(const std::string& what, const std::function<int()>& call) const {
  std::mutex mutex;
  std::condition_variable returned_signal;
  bool returned = false;
  const auto start = std::chrono::steady_clock::now();
  // wait_for overflows on durations near the largest double; 11 days stands for "no deadline".
  const std::chrono::duration<double> timeout(std::min(options_.timeout_seconds, 1e6));
  std::thread guard([&] {
    std::unique_lock<std::mutex> lock(mutex);
    if (returned_signal.wait_for(lock, timeout, [&] { return returned; })) return;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    end_job(hang_text(rank_, waited, what));
  });
  const int code = call();
  {
    std::lock_guard<std::mutex> lock(mutex);
    returned = true;
  }
  returned_signal.notify_one();
  guard.join();
  if (code != MPI_SUCCESS)
    throw InfraError(what, what + " failed: " + mpi_error_text(code));
}

void MpiSession::broadcast(std::string& bytes, int root, const std::string& what,
                           bool patient) const {
  std::int64_t length = static_cast<std::int64_t>(bytes.size());
  MPI_Request request;
  TALLY_MPI_CHECK(MPI_Ibcast(&length, 1, MPI_INT64_T, root, MPI_COMM_WORLD, &request));
  wait_with_watchdog(request, patient ? 1e300 : options_.timeout_seconds, rank_,
                     "broadcast of " + what);
  bytes.resize(static_cast<std::size_t>(length));
  if (length == 0) return;
  TALLY_MPI_CHECK(MPI_Ibcast(bytes.data(), static_cast<int>(length), MPI_CHAR, root,
                             MPI_COMM_WORLD, &request));
  wait_with_watchdog(request, options_.timeout_seconds, rank_, "broadcast of " + what);
}

std::vector<std::string> MpiSession::gather(const std::string& bytes, int root,
                                            const std::string& what) const {
  const int length = static_cast<int>(bytes.size());
  std::vector<int> lengths(rank_ == root ? size_ : 0);
  MPI_Request request;
  TALLY_MPI_CHECK(MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root,
                              MPI_COMM_WORLD, &request));
  wait_with_watchdog(request, options_.timeout_seconds, rank_, "gather of " + what);
  std::vector<int> offsets(lengths.size());
  std::string all;
  if (rank_ == root) {
    int at = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[r] = at;
      at += lengths[r];
    }
    all.resize(static_cast<std::size_t>(at));
  }
  TALLY_MPI_CHECK(MPI_Igatherv(bytes.data(), length, MPI_CHAR, all.data(), lengths.data(),
                               offsets.data(), MPI_CHAR, root, MPI_COMM_WORLD, &request));
  wait_with_watchdog(request, options_.timeout_seconds, rank_, "gather of " + what);
  std::vector<std::string> parts;
  if (rank_ == root)
    for (int r = 0; r < size_; ++r) parts.push_back(all.substr(offsets[r], lengths[r]));
  return parts;
}

void MpiSession::end_job(std::string_view what) const {
  std::string line(what);
  for (char& ch : line)
    if (ch == '\n' || ch == '\r') ch = ' ';
  std::fflush(stdout);  // what the command printed so far (std::cout writes through stdout)
  std::fprintf(stderr, "tally: rank %d: infrastructure failure: %s\n", rank_, line.c_str());
  std::fflush(stderr);
  // Another thread may call MPI only under MPI_THREAD_MULTIPLE. Without it, exiting is the way
  // out: mpirun ends the job when a process exits before MPI_Finalize.
  if (thread_multiple_ || std::this_thread::get_id() == owner_)
    MPI_Abort(MPI_COMM_WORLD, kJobEndedExitCode);
  std::_Exit(kJobEndedExitCode);  // MPI_Abort does not return
}

struct MpiCommunicator::Impl {
  const topologies::RankLayout& layout;
  const MpiSession& session;
  std::array<MPI_Comm, topologies::kFamilyCount> comms{};
  // Split already, by every process: a rank in none of a family's groups (the embedding family's
  // middle stages) holds MPI_COMM_NULL for it, and must not split it again when the others do not.
  std::array<bool, topologies::kFamilyCount> split{};
};

MpiCommunicator::MpiCommunicator(const topologies::RankLayout& layout, const MpiSession& session,
                                 std::span<const topologies::Family> families)
    : impl_(new Impl{layout, session, {}}) {
  impl_->comms.fill(MPI_COMM_NULL);
  add_families(families);
}

void MpiCommunicator::add_families(std::span<const topologies::Family> families) {
  const topologies::RankLayout& layout = impl_->layout;
  const MpiSession& session = impl_->session;
  if (layout.world() != session.size())
    throw InfraError("MpiCommunicator", "the layout has world " + std::to_string(layout.world()) +
                                            " but the job has " + std::to_string(session.size()) +
                                            " processes");
  const int rank = session.rank();
  for (topologies::Family family : families) {
    if (impl_->split[static_cast<int>(family)]) continue;
    impl_->split[static_cast<int>(family)] = true;
    const std::optional<topologies::GroupId> group = layout.group_of(family, rank);
    const int color = group ? group->index : MPI_UNDEFINED;
    const int key = group ? layout.index_in(family, rank) : 0;
    MPI_Comm& comm = impl_->comms[static_cast<int>(family)];
    session.blocking_call("MPI_Comm_split of the " +
                              std::string(topologies::family_name(family)) + " communicators",
                          [&] { return MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm); });
    if (comm != MPI_COMM_NULL) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  }
}

MpiCommunicator::~MpiCommunicator() {
  for (MPI_Comm& comm : impl_->comms)
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

namespace {

void all_reduce_with_watchdog(const MpiSession& session, MPI_Comm comm, void* data, int count,
                              MPI_Datatype type, ReduceOp op, const Group& group,
                              std::string_view label) {
  if (comm == MPI_COMM_NULL)
    throw std::logic_error("no MPI communicator was created for the " +
                           std::string(topologies::family_name(group.id.family)) + " family");
  const std::string call = "all_reduce(" + std::string(op_name(op)) + ") '" + std::string(label) +
                           "' on " + describe(group);
  MPI_Request request;
  TALLY_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, type,
                                 op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm, &request));
  wait_with_watchdog(request, session.options().timeout_seconds, session.rank(), call);
}

}  // namespace

void MpiCommunicator::all_reduce(int rank, const Group& group, std::span<double> values,
                                 ReduceOp op, std::string_view label) {
  if (rank != impl_->session.rank())
    throw std::logic_error("the mpi backend runs rank " + std::to_string(impl_->session.rank()) +
                           ", not rank " + std::to_string(rank));
  MPI_Comm comm = impl_->comms[static_cast<int>(group.id.family)];
  if (op == ReduceOp::sum) {
    all_reduce_with_watchdog(impl_->session, comm, values.data(), static_cast<int>(values.size()),
                             MPI_DOUBLE, op, group, label);
    return;
  }
  // MPI_MAX leaves NaN to the implementation: reduce_pair's max through a packed buffer.
  std::vector<double> packed(2 * values.size());
  pack_for_max(values, packed);
  all_reduce_with_watchdog(impl_->session, comm, packed.data(), static_cast<int>(packed.size()),
                           MPI_DOUBLE, op, group, label);
  unpack_max(packed, values);
}

void MpiCommunicator::all_reduce(int rank, const Group& group, std::span<std::int64_t> values,
                                 ReduceOp op, std::string_view label) {
  if (rank != impl_->session.rank())
    throw std::logic_error("the mpi backend runs rank " + std::to_string(impl_->session.rank()) +
                           ", not rank " + std::to_string(rank));
  all_reduce_with_watchdog(impl_->session, impl_->comms[static_cast<int>(group.id.family)],
                           values.data(), static_cast<int>(values.size()), MPI_INT64_T, op, group,
                           label);
}

}  // namespace tally::comm
