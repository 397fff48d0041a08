// End-to-end cases per second of the nccl backend against sim, on the same world G*k cases in
// one run (built on mpi_throughput_bench's case mix).
// Usage: mpirun -np G nccl_throughput_bench [k [cases]]
// Two mixes: cases that all share one configuration, and cases that change configuration every
// time (NCCL communicators are keyed by process set, so with 2 GPUs no configuration creates a
// new one after the first). Each case: broadcast of the case, every rank's path with the CUDA
// local statistics and one NCCL phase, gather of the results, judging on rank 0.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "run/backend.h"
#include "topologies/enumerate.h"

namespace {

using tally::casefile::Case;

Case make_case(const tally::topologies::ParallelConfig& config, int i) {
  Case c;
  c.topology = config;
  tally::topologies::ModelSpec& m = c.model;
  m.num_layers = config.pp * 2;
  m.num_attention_heads = config.tp * 2;
  m.hidden_size = m.num_attention_heads * 8;
  m.vocab_size = 32 * config.tp;
  m.ffn_hidden_size = 4 * m.hidden_size;
  m.num_experts = config.ep * 2;
  m.moe_ffn_hidden_size = 16 * config.etp;
  m.add_bias_linear = config.etp == 1;
  c.path.optimizer = static_cast<tally::vocab::OptimizerModel>(i % 4);
  c.path.gradients.generator.mode = tally::kernels::GradientMode::dyadic;
  c.path.gradients.generator.seed = static_cast<std::uint64_t>(i);
  c.path.max_norm = 1.0;
  return c;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  tally::comm::MpiSession session(&argc, &argv, tally::comm::MpiOptions{120.0});
  const int k = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
  std::unique_ptr<tally::run::RankEngine> engine = tally::run::make_nccl_engine(session, k);
  if (session.rank() != 0) return tally::run::serve_mpi_cases(session, *engine);
  const int cases = argc > 2 ? std::max(1, std::atoi(argv[2])) : 200;
  const int world = session.size() * k;

  std::vector<tally::topologies::ParallelConfig> configs;
  tally::topologies::EnumerateFilter filter;
  std::string error;
  filter.order = tally::topologies::parse_order("tp-cp-ep-dp-pp", &error);
  tally::topologies::for_each_config(world, filter, [&](const tally::topologies::ParallelConfig& c) {
    if (c.cp == 1) configs.push_back(c);
  });
  std::vector<Case> same, varied;
  for (int i = 0; i < cases; ++i) {
    same.push_back(make_case(configs[configs.size() / 2], i));
    varied.push_back(make_case(configs[static_cast<std::size_t>(i) % configs.size()], i));
  }

  tally::run::MpiBackend mpi(session, std::move(engine));
  tally::run::SimBackend sim;
  std::printf("%d GPUs x %d ranks per GPU = world %d, %d cases per mix, %zu configurations in the "
              "varied mix\n", session.size(), k, world, cases, configs.size());
  std::printf("%-22s %12s %12s %8s\n", "mix", "sim cases/s", "nccl cases/s", "nccl/sim");
  for (const auto* mix : {&same, &varied}) {
    auto start = std::chrono::steady_clock::now();
    for (const Case& c : *mix) sim.run(c, {});
    const double sim_s = seconds_since(start);
    start = std::chrono::steady_clock::now();
    int not_passed = 0;
    for (const Case& c : *mix) not_passed += mpi.run(c, {}).kind != tally::oracle::Verdict::Kind::pass;
    if (not_passed) std::printf("(%d cases of this mix did not pass)\n", not_passed);
    const double mpi_s = seconds_since(start);
    std::printf("%-22s %12.0f %12.0f %8.1f\n",
                mix == &same ? "one configuration" : "new configuration each", cases / sim_s,
                cases / mpi_s, mpi_s / sim_s);
  }
  mpi.finish(0);
  return 0;
}
