// The nccl backend (built with TALLY_HAVE_NCCL only): see comm/nccl_communicator.h.
#include "comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/mpi_communicator.h"

namespace tally::comm {

namespace {

std::string where(const char* file, int line, int rank) {
  return std::string(" at ") + file + ":" + std::to_string(line) + " on MPI rank " +
         std::to_string(rank);
}

// CHECK macros in the nccl-tests style: the call, file:line, the process's MPI rank and the
// library's message, thrown as InfraError (an infrastructure failure, exit code 3).
#define TALLY_CUDA_CHECK(rank, call)                                                      \
  do {                                                                                    \
    const cudaError_t tally_cuda_error = (call);                                          \
    if (tally_cuda_error != cudaSuccess)                                                  \
      throw InfraError(#call, std::string(#call) + " failed" +                            \
                                  where(__FILE__, __LINE__, (rank)) + ": " +              \
                                  cudaGetErrorString(tally_cuda_error));                  \
  } while (0)

// ncclInProgress is success for a non-blocking communicator: the caller polls.
#define TALLY_NCCL_CHECK(rank, call)                                                      \
  do {                                                                                    \
    const ncclResult_t tally_nccl_result = (call);                                        \
    if (tally_nccl_result != ncclSuccess && tally_nccl_result != ncclInProgress)          \
      throw InfraError(#call, std::string(#call) + " failed" +                            \
                                  where(__FILE__, __LINE__, (rank)) + ": " +              \
                                  ncclGetErrorString(tally_nccl_result) + nccl_last_error()); \
  } while (0)

std::string nccl_last_error() {
  const char* last = ncclGetLastError(nullptr);
  return last && *last ? std::string(" (") + last + ")" : std::string();
}

std::uint64_t key_of(const topologies::GroupId& id) {
  return (static_cast<std::uint64_t>(id.family) << 32) | static_cast<std::uint32_t>(id.index);
}

enum class ElementType : std::uint8_t { f64, i64 };


// The local members' contributions reduced in group order, into `out` (8-byte words).
template <typename T>
void reduce_local(const std::vector<void*>& buffers, std::size_t length, ReduceOp op,
                  std::uint64_t* out) {
  T* result = reinterpret_cast<T*>(out);
  std::memcpy(result, buffers[0], length * sizeof(T));
  for (std::size_t m = 1; m < buffers.size(); ++m) {
    const T* values = static_cast<const T*>(buffers[m]);
    for (std::size_t i = 0; i < length; ++i) result[i] = reduce_pair(result[i], values[i], op);
  }
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Three significant digits, whole seconds from 100 s: what was waited, not rounded down.
std::string seconds_text(double seconds) {
  if (seconds >= 100.0) return std::to_string(static_cast<long long>(seconds + 0.5));
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", seconds);
  return text;
}

// Spins briefly, then backs off: several processes may share cores.
void back_off(int polls) {
  if (polls < 2000)
    sched_yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 20000 ? 20 : 200));
}

}  // namespace

bool nccl_available() { return true; }

struct NcclCommunicator::Impl {
  struct Pending {
    ReduceOp op;
    ElementType type;
    std::size_t length;
    std::string label;
    std::vector<void*> buffers;  // by local member index; null until that member arrives
    int arrived = 0;
  };
  struct GroupState {
    std::vector<int> local_members;          // indices in the group's rank list, group order
    std::vector<std::int64_t> calls_by_local;  // by local member
    std::int64_t first_pending = 0;
    std::deque<Pending> pending;
    bool all_local = false;
  };
  // A completed local partial that needs the other processes.
  struct CrossOp {
    topologies::GroupId group;
    std::int64_t sequence;
    ReduceOp op;
    ElementType type;
    std::size_t length;  // words reduced: twice the values of a packed max (pack_for_max)
    std::size_t word;    // offset of the partial in `partials`
    std::string label;
    std::vector<void*> buffers;
    bool packed_max = false;  // a max of doubles, reduced packed: unpack into the buffers
  };

  const MpiSession& session;
  NcclOptions options;
  int proc = 0;
  int procs = 1;
  int k = 1;
  int device = 0;
  std::vector<int> local;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  ncclComm_t world = nullptr;
  // Process set -> communicator (null where this process is not a member; the key is known on
  // every process so all of them agree on which sets already exist).
  std::map<std::vector<int>, ncclComm_t> comms;
  const topologies::RankLayout* layout = nullptr;
  std::unordered_map<std::uint64_t, GroupState> groups;
  std::vector<CrossOp> cross;
  std::vector<std::uint64_t> partials;
  void* host = nullptr;  // pinned staging
  void* dev = nullptr;
  std::size_t capacity_words = 0;
  NcclStats stats;

  Impl(const MpiSession& s, NcclOptions o) : session(s), options(o) {}

  std::vector<int> process_set(std::span<const int> ranks) const {
    std::vector<int> set;
    for (int r : ranks) set.push_back(r / k);
    std::sort(set.begin(), set.end());
    set.erase(std::unique(set.begin(), set.end()), set.end());
    return set;
  }

  std::string op_call(const CrossOp& op) const {
    return "ncclAllReduce(" + std::string(op_name(op.op)) + ") '" + op.label + "' on " +
           describe(Group{op.group, layout->ranks(op.group)});
  }

  // Waits until no communicator in `wait` is in progress; an async error or the timeout is
  // InfraError naming `call` (the communicators are aborted first on a timeout).
  void wait_comms(const std::vector<ncclComm_t>& wait, const std::string& call,
                  Clock::time_point start) {
    for (int polls = 0;; ++polls) {
      bool busy = false;
      for (ncclComm_t comm : wait) {
        ncclResult_t state = ncclSuccess;
        TALLY_NCCL_CHECK(proc, ncclCommGetAsyncError(comm, &state));
        if (state == ncclInProgress) {
          busy = true;
        } else if (state != ncclSuccess) {
          throw InfraError(call, call + " failed on MPI rank " + std::to_string(proc) + ": " +
                                     ncclGetErrorString(state) + nccl_last_error());
        }
      }
      if (!busy) return;
      check_deadline(wait, call, start);
      back_off(polls);
    }
  }

  void check_deadline(const std::vector<ncclComm_t>& involved, const std::string& call,
                      Clock::time_point start) {
    const double waited = seconds_since(start);
    if (waited <= options.timeout_seconds) return;
    for (ncclComm_t comm : involved) ncclCommAbort(comm);
    // Aborted communicators are gone: forget them (the job ends with exit 3 anyway).
    for (auto& [set, comm] : comms)
      if (std::find(involved.begin(), involved.end(), comm) != involved.end()) comm = nullptr;
    if (std::find(involved.begin(), involved.end(), world) != involved.end()) world = nullptr;
    throw InfraError(call, "MPI rank " + std::to_string(proc) + " (GPU " + std::to_string(device) +
                               ") waited " + seconds_text(waited) + " s in " +
                               call + ": a member never joined (the job would hang); "
                               "ncclCommAbort called");
  }

  void ensure_capacity(std::size_t words) {
    if (words <= capacity_words) return;
    std::size_t grown = std::max<std::size_t>(words, 2 * capacity_words);
    grown = std::max<std::size_t>(grown, 512);
    if (host) TALLY_CUDA_CHECK(proc, cudaFreeHost(host));
    if (dev) TALLY_CUDA_CHECK(proc, cudaFree(dev));
    host = dev = nullptr;
    capacity_words = 0;
    TALLY_CUDA_CHECK(proc, cudaMallocHost(&host, grown * 8));
    TALLY_CUDA_CHECK(proc, cudaMalloc(&dev, grown * 8));
    capacity_words = grown;
  }

  void contribute(int rank, const Group& group, void* data, std::size_t length, ElementType type,
                  ReduceOp op, std::string_view label);
  void end_phase();
};

NcclCommunicator::NcclCommunicator(const MpiSession& session, NcclOptions options)
    : impl_(new Impl(session, options)) {
  Impl& s = *impl_;
  if (options.ranks_per_gpu < 1)
    throw std::invalid_argument("ranks per GPU must be at least 1");
  if (s.options.timeout_seconds <= 0) s.options.timeout_seconds = session.options().timeout_seconds / 2;
  s.proc = session.rank();
  s.procs = session.size();
  s.k = options.ranks_per_gpu;
  s.local.resize(static_cast<std::size_t>(s.k));
  std::iota(s.local.begin(), s.local.end(), s.proc * s.k);
  int devices = 0;
  TALLY_CUDA_CHECK(s.proc, cudaGetDeviceCount(&devices));
  if (devices < 1)
    throw InfraError("cudaGetDeviceCount", "MPI rank " + std::to_string(s.proc) + " sees no CUDA device");
  s.device = s.proc % devices;
  TALLY_CUDA_CHECK(s.proc, cudaSetDevice(s.device));
  TALLY_CUDA_CHECK(s.proc, cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  TALLY_CUDA_CHECK(s.proc, cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));

  // The world communicator: the unique id from MPI rank 0, every process joins.
  ncclUniqueId id{};
  std::string bytes;
  if (s.proc == 0) {
    TALLY_NCCL_CHECK(s.proc, ncclGetUniqueId(&id));
    bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  session.broadcast(bytes, 0, "the NCCL unique id");
  if (bytes.size() != sizeof id)
    throw InfraError("broadcast of the NCCL unique id", "the NCCL unique id arrived with " +
                                                            std::to_string(bytes.size()) + " bytes");
  std::memcpy(&id, bytes.data(), sizeof id);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = s.options.blocking ? 1 : 0;
  const auto start = Clock::now();
  TALLY_NCCL_CHECK(s.proc, ncclCommInitRankConfig(&s.world, s.procs, id, s.proc, &config));
  s.wait_comms({s.world}, "ncclCommInitRankConfig (the world communicator)", start);
  std::vector<int> all(static_cast<std::size_t>(s.procs));
  std::iota(all.begin(), all.end(), 0);
  s.comms[all] = s.world;
  s.stats.communicators = 1;
}

NcclCommunicator::~NcclCommunicator() {
  Impl& s = *impl_;
  // Every process destroys the same communicators in the same (key) order; the world last.
  for (auto& [set, comm] : s.comms)
    if (comm && comm != s.world) ncclCommDestroy(comm);
  if (s.world) ncclCommDestroy(s.world);
  if (s.host) cudaFreeHost(s.host);
  if (s.dev) cudaFree(s.dev);
  if (s.done) cudaEventDestroy(s.done);
  if (s.stream) cudaStreamDestroy(s.stream);
}

void NcclCommunicator::configure(const topologies::RankLayout& layout,
                                 std::span<const topologies::Family> families) {
  Impl& s = *impl_;
  if (layout.world() != s.procs * s.k)
    throw InfraError("NcclCommunicator::configure",
                     "the layout has world " + std::to_string(layout.world()) + " but the job runs " +
                         std::to_string(s.procs) + " processes x " + std::to_string(s.k) +
                         " ranks per GPU");
  s.groups.clear();
  s.cross.clear();
  s.partials.clear();
  s.layout = &layout;
  // Process sets not seen yet, in the same order on every process.
  std::vector<std::vector<int>> fresh;
  for (topologies::Family family : families) {
    for (int g = 0; g < layout.group_count(family); ++g) {
      std::vector<int> set = s.process_set(layout.ranks({family, g}));
      if (set.size() < 2 || s.comms.count(set)) continue;
      if (std::find(fresh.begin(), fresh.end(), set) == fresh.end()) fresh.push_back(std::move(set));
    }
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = s.options.blocking ? 1 : 0;
  for (const std::vector<int>& set : fresh) {
    const bool member = std::binary_search(set.begin(), set.end(), s.proc);
    ncclComm_t comm = nullptr;
    const auto start = Clock::now();
    TALLY_NCCL_CHECK(s.proc, ncclCommSplit(s.world, member ? 0 : NCCL_SPLIT_NOCOLOR, s.proc,
                                           &comm, &config));
    std::vector<ncclComm_t> wait{s.world};
    if (comm) wait.push_back(comm);
    s.wait_comms(wait, "ncclCommSplit", start);
    s.comms[set] = comm;
    if (comm) ++s.stats.communicators;
  }
}

std::span<const int> NcclCommunicator::local_ranks() const { return impl_->local; }
int NcclCommunicator::device() const { return impl_->device; }
int NcclCommunicator::ranks_per_gpu() const { return impl_->k; }
NcclStats NcclCommunicator::stats() const { return impl_->stats; }

void NcclCommunicator::all_reduce(int rank, const Group& group, std::span<double> values,
                                  ReduceOp op, std::string_view label) {
  impl_->contribute(rank, group, values.data(), values.size(), ElementType::f64, op, label);
}

void NcclCommunicator::all_reduce(int rank, const Group& group, std::span<std::int64_t> values,
                                  ReduceOp op, std::string_view label) {
  impl_->contribute(rank, group, values.data(), values.size(), ElementType::i64, op, label);
}

void NcclCommunicator::Impl::contribute(int rank, const Group& group, void* data,
                                        std::size_t length, ElementType type, ReduceOp op,
                                        std::string_view label) {
  if (!layout) throw std::logic_error("NcclCommunicator: all_reduce before configure()");
  if (rank / k != proc)
    throw std::logic_error("the nccl backend's MPI rank " + std::to_string(proc) + " runs ranks " +
                           std::to_string(proc * k) + ".." + std::to_string(proc * k + k - 1) +
                           ", not rank " + std::to_string(rank));
  const int member = layout->index_in(group.id.family, rank);
  if (member < 0 || member >= static_cast<int>(group.ranks.size()) || group.ranks[member] != rank)
    throw std::logic_error("rank " + std::to_string(rank) + " is not a member of " +
                           describe(group));
  GroupState& state = groups[key_of(group.id)];
  if (state.local_members.empty()) {
    for (int m = 0; m < static_cast<int>(group.ranks.size()); ++m)
      if (group.ranks[m] / k == proc) state.local_members.push_back(m);
    state.all_local = state.local_members.size() == group.ranks.size();
    state.calls_by_local.assign(state.local_members.size(), 0);
  }
  const int local_member = static_cast<int>(
      std::lower_bound(state.local_members.begin(), state.local_members.end(), member) -
      state.local_members.begin());
  const std::int64_t sequence = state.calls_by_local[local_member]++;
  while (state.first_pending + static_cast<std::int64_t>(state.pending.size()) <= sequence)
    state.pending.push_back(Pending{op, type, length, std::string(label),
                                    std::vector<void*>(state.local_members.size(), nullptr), 0});
  Pending& collective = state.pending[static_cast<std::size_t>(sequence - state.first_pending)];
  if (collective.op != op || collective.type != type || collective.length != length)
    throw mismatched_collective(rank, group, op, length, label, collective.op,
                                collective.length, collective.label);
  collective.buffers[local_member] = data;
  if (++collective.arrived < static_cast<int>(state.local_members.size())) return;

  // Every local member arrived: the local partial, in group order.
  const std::size_t word = partials.size();
  partials.resize(word + length);
  if (type == ElementType::f64)
    reduce_local<double>(collective.buffers, length, op, partials.data() + word);
  else
    reduce_local<std::int64_t>(collective.buffers, length, op, partials.data() + word);
  if (state.all_local) {
    for (void* buffer : collective.buffers) std::memcpy(buffer, partials.data() + word, length * 8);
    partials.resize(word);
    ++stats.local_only;
  } else if (type == ElementType::f64 && op == ReduceOp::max) {
    // ncclMax leaves NaN to NCCL: reduce_pair's max through a packed buffer.
    std::vector<double> values(length);
    std::memcpy(values.data(), partials.data() + word, length * 8);
    partials.resize(word + 2 * length);
    pack_for_max(values, {reinterpret_cast<double*>(partials.data() + word), 2 * length});
    cross.push_back(CrossOp{group.id, sequence, op, type, 2 * length, word, collective.label,
                            std::move(collective.buffers), true});
  } else {
    cross.push_back(CrossOp{group.id, sequence, op, type, length, word, collective.label,
                            std::move(collective.buffers)});
  }
  collective.arrived = -1;  // done locally
  while (!state.pending.empty() && state.pending.front().arrived < 0) {
    state.pending.pop_front();
    ++state.first_pending;
  }
}

void NcclCommunicator::end_phase() { impl_->end_phase(); }

void NcclCommunicator::Impl::end_phase() {
  // A collective some local member never joined: the job would hang (as sim reports it).
  for (auto& [key, state] : groups) {
    for (const Pending& collective : state.pending) {
      if (collective.arrived < 0) continue;
      const topologies::GroupId id{static_cast<topologies::Family>(key >> 32),
                                   static_cast<int>(key & 0xffffffffu)};
      const Group group{id, layout->ranks(id)};
      std::string missing;
      int missing_count = 0;
      for (std::size_t m = 0; m < collective.buffers.size(); ++m) {
        if (collective.buffers[m]) continue;
        if (++missing_count <= 8)
          missing += (missing.empty() ? "" : ",") + std::to_string(group.ranks[state.local_members[m]]);
      }
      if (missing_count > 8) missing += ",... (" + std::to_string(missing_count) + " ranks)";
      const std::string call = "all_reduce(" + std::string(op_name(collective.op)) + ") '" +
                               collective.label + "' on " + describe(group);
      groups.clear();
      cross.clear();
      partials.clear();
      throw InfraError(call, call + " never completed: rank(s) " + missing + " (on MPI rank " +
                                 std::to_string(proc) + ") did not join (the job would hang)");
    }
  }
  groups.clear();
  if (cross.empty()) {
    partials.clear();
    return;
  }

  // One canonical global order: family, group index, sequence.
  std::sort(cross.begin(), cross.end(), [](const CrossOp& a, const CrossOp& b) {
    if (a.group.family != b.group.family) return a.group.family < b.group.family;
    if (a.group.index != b.group.index) return a.group.index < b.group.index;
    return a.sequence < b.sequence;
  });
  std::vector<ncclComm_t> op_comm(cross.size());
  std::vector<ncclComm_t> involved;
  for (std::size_t i = 0; i < cross.size(); ++i) {
    const auto found = comms.find(process_set(layout->ranks(cross[i].group)));
    if (found == comms.end() || !found->second)
      throw std::logic_error("no NCCL communicator for " + op_call(cross[i]) +
                             ": configure() was not called with the " +
                             std::string(topologies::family_name(cross[i].group.family)) +
                             " family");
    op_comm[i] = found->second;
    if (std::find(involved.begin(), involved.end(), op_comm[i]) == involved.end())
      involved.push_back(op_comm[i]);
  }
  std::size_t words = 0;
  for (const CrossOp& op : cross) words += op.length;
  ensure_capacity(words);
  auto* staged = static_cast<std::uint64_t*>(host);
  std::size_t at = 0;
  for (const CrossOp& op : cross) {
    std::memcpy(staged + at, partials.data() + op.word, op.length * 8);
    at += op.length;
  }
  std::string call = op_call(cross.front());
  if (cross.size() > 1)
    call += " (and " + std::to_string(cross.size() - 1) + " more in one ncclGroupStart/End)";
  const auto start = Clock::now();
  TALLY_CUDA_CHECK(proc, cudaMemcpyAsync(dev, host, words * 8, cudaMemcpyHostToDevice, stream));
  TALLY_NCCL_CHECK(proc, ncclGroupStart());
  at = 0;
  auto* device_words = static_cast<std::uint64_t*>(dev);
  for (std::size_t i = 0; i < cross.size(); ++i) {
    const CrossOp& op = cross[i];
    TALLY_NCCL_CHECK(proc, ncclAllReduce(device_words + at, device_words + at, op.length,
                                         op.type == ElementType::f64 ? ncclFloat64 : ncclInt64,
                                         op.op == ReduceOp::sum ? ncclSum : ncclMax, op_comm[i],
                                         stream));
    at += op.length;
  }
  TALLY_NCCL_CHECK(proc, ncclGroupEnd());
  wait_comms(involved, call, start);
  TALLY_CUDA_CHECK(proc, cudaMemcpyAsync(host, dev, words * 8, cudaMemcpyDeviceToHost, stream));
  TALLY_CUDA_CHECK(proc, cudaEventRecord(done, stream));
  for (int polls = 0;; ++polls) {
    const cudaError_t state = cudaEventQuery(done);
    if (state == cudaSuccess) break;
    if (state != cudaErrorNotReady) TALLY_CUDA_CHECK(proc, state);
    if (polls % 64 == 63) {
      for (ncclComm_t comm : involved) {
        ncclResult_t async = ncclSuccess;
        TALLY_NCCL_CHECK(proc, ncclCommGetAsyncError(comm, &async));
        if (async != ncclSuccess && async != ncclInProgress)
          throw InfraError(call, call + " failed on MPI rank " + std::to_string(proc) + ": " +
                                     ncclGetErrorString(async) + nccl_last_error());
      }
      check_deadline(involved, call, start);
    }
    back_off(polls);
  }
  at = 0;
  for (const CrossOp& op : cross) {
    for (void* buffer : op.buffers) {
      if (op.packed_max)
        unpack_max({reinterpret_cast<const double*>(staged + at), op.length},
                   {static_cast<double*>(buffer), op.length / 2});
      else
        std::memcpy(buffer, staged + at, op.length * 8);
    }
    at += op.length;
  }
  stats.nccl_all_reduces += static_cast<std::int64_t>(cross.size());
  ++stats.phases;
  cross.clear();
  partials.clear();
}

}  // namespace tally::comm
