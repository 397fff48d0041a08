// Latency of one grad-norm stats reduction (the path's three collectives of one unit: the sums,
// the maxima, the zero count and ledger) per group family, on the nccl backend, and on the mpi
// backend for comparison where k = 1.
// Usage: mpirun -np G nccl_latency_bench [k [iterations [blocking]]]   (world = G * k)
// `blocking`: blocking NCCL communicators instead of the backend's non-blocking ones.
// Prints per configuration and family: the group size, how many processes (GPUs) it spans
// (1: reduced on the GPU's process without NCCL), and the median and p90 microseconds of one
// phase (all_reduce of every local rank + end_phase) over `iterations` phases after a warm-up.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "topologies/rank_layout.h"

namespace {

using namespace tally;
using topologies::Family;

struct Timing {
  double median_us = 0, p90_us = 0;
};

// One unit's payload: 6 sums (squares, MTP squares, sqrt, zeros as float, 2 p-sums), 2 maxima,
// 1 + 64 counts (zero count and a 64-param ledger).
struct Payload {
  std::vector<double> sums = std::vector<double>(6, 1.0);
  std::vector<double> maxima = std::vector<double>(2, 1.0);
  std::vector<std::int64_t> counts = std::vector<std::int64_t>(65, 1);
};

Timing time_phases(comm::Communicator& communicator, const topologies::RankLayout& layout,
                   Family family, std::span<const int> ranks, int iterations) {
  std::vector<Payload> payloads(ranks.size());
  std::vector<double> samples;
  for (int it = -iterations / 10 - 5; it < iterations; ++it) {
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const comm::Group group = comm::group_of(layout, family, ranks[i]);
      Payload& p = payloads[i];
      std::fill(p.sums.begin(), p.sums.end(), 1.0);
      std::fill(p.maxima.begin(), p.maxima.end(), 1.0);
      std::fill(p.counts.begin(), p.counts.end(), 1);
      communicator.all_reduce(ranks[i], group, p.sums, comm::ReduceOp::sum, "sums");
      communicator.all_reduce(ranks[i], group, p.maxima, comm::ReduceOp::max, "maxima");
      communicator.all_reduce(ranks[i], group, p.counts, comm::ReduceOp::sum, "counts");
    }
    communicator.end_phase();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (it >= 0) samples.push_back(us);
    const double expected = static_cast<double>(layout.ranks(*layout.group_of(family, ranks[0])).size());
    if (payloads[0].sums[0] != expected || payloads[0].counts[64] != static_cast<std::int64_t>(expected)) {
      std::fprintf(stderr, "nccl_latency_bench: wrong sum %g (expected %g)\n", payloads[0].sums[0],
                   expected);
      std::exit(1);
    }
  }
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples[samples.size() * 9 / 10]};
}

int spans(const topologies::RankLayout& layout, Family family, int rank, int k) {
  std::set<int> procs;
  for (int r : layout.group_ranks(family, rank)) procs.insert(r / k);
  return static_cast<int>(procs.size());
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv, comm::MpiOptions{120.0});
  const int k = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
  const int iterations = argc > 2 ? std::max(10, std::atoi(argv[2])) : 2000;
  const int world = session.size() * k;
  const bool blocking = argc > 3 && std::string(argv[3]) == "blocking";
  comm::NcclCommunicator nccl(session, comm::NcclOptions{k, 0.0, blocking});
  const std::vector<int> ranks(nccl.local_ranks().begin(), nccl.local_ranks().end());

  // Configurations whose groups span the GPUs in different ways.
  std::vector<topologies::ParallelConfig> configs;
  auto add = [&](int tp, int pp, int ep, int etp) {
    topologies::ParallelConfig c;
    c.world = world;
    c.tp = tp;
    c.pp = pp;
    c.ep = ep;
    c.etp = etp;
    if (!topologies::check_config(c)) configs.push_back(c);
  };
  add(std::min(world, 2), 1, std::min(world, 2), 1);  // TP 2, EP 2, ETP 1 (the founding shape)
  add(1, 1, 1, 1);                                    // pure DP
  add(1, std::min(world, 2), 1, 1);                   // PP 2
  const Family families[] = {Family::tp,    Family::dp_cp, Family::expt_dp,       Family::tp_pp,
                             Family::pp,    Family::expt_tp_ep_pp, Family::world};
  if (session.rank() == 0) {
    std::printf("nccl_latency_bench: %d processes (GPUs) x %d ranks per GPU = world %d, %d phases "
                "each; one phase = 3 all-reduces (6 + 2 doubles, 65 int64) per local rank + "
                "end_phase; %s NCCL communicators\n",
                session.size(), k, world, iterations, blocking ? "blocking" : "non-blocking");
    std::printf("%-34s %-14s %5s %5s %12s %12s %12s\n", "configuration", "family", "size", "GPUs",
                "nccl med us", "nccl p90 us", "mpi med us");
  }
  for (const topologies::ParallelConfig& config : configs) {
    const topologies::RankLayout layout(config);
    for (Family family : families) {
      const Family one[] = {family};
      nccl.configure(layout, one);
      const Timing t = time_phases(nccl, layout, family, ranks, iterations);
      Timing m{-1, -1};
      if (k == 1) {
        comm::MpiCommunicator mpi(layout, session, one);
        m = time_phases(mpi, layout, family, ranks, iterations);
      }
      if (session.rank() == 0) {
        std::printf("%-34s %-14s %5zu %5d %12.1f %12.1f ", topologies::describe(config).c_str(),
                    std::string(topologies::family_name(family)).c_str(),
                    layout.group_ranks(family, 0).size(), spans(layout, family, 0, k), t.median_us,
                    t.p90_us);
        if (m.median_us >= 0)
          std::printf("%12.1f\n", m.median_us);
        else
          std::printf("%12s\n", "-");
      }
    }
  }
  const comm::NcclStats stats = nccl.stats();
  if (session.rank() == 0)
    std::printf("NCCL communicators created: %d; NCCL all-reduces issued: %lld; collectives done "
                "without NCCL: %lld\n",
                stats.communicators, static_cast<long long>(stats.nccl_all_reduces),
                static_cast<long long>(stats.local_only));
  return 0;
}
