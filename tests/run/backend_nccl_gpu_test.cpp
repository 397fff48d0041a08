// The nccl backend gives the same verdicts as sim: launched under mpirun by ci/gpu-test, one
// process per GPU, with TALLY_RANKS_PER_GPU=k virtual ranks each (world G * k). Rank 0 runs the
// tests; the other processes serve its cases.
//
// Without a usable CUDA device every test skips with the reason (no MPI is started then),
// unless TALLY_REQUIRE_GPU=1 (ci/gpu-test sets it), which turns the skip into a failure.
// The hang case (a rank that skips its collective ends the job with exit 3, naming the call)
// ends the job, so it is a command-line check in ci/gpu-test, not a test here.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <string>

#include "comm/mpi_communicator.h"
#include "run/backend.h"
#include "kernels/local_stats_cuda.h"
#include "tests/support/fault_cases.h"
#include "tests/support/verdict_compare.h"
#include "tests/support/model_gen.h"
#include "topologies/enumerate.h"

namespace tally::run {
namespace {

comm::MpiSession* g_session = nullptr;  // set once in main() when a GPU is there
MpiBackend* g_backend = nullptr;
int g_ranks_per_gpu = 1;
std::string g_no_gpu;  // why the tests skip

class NcclBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (g_backend) return;
    const char* require = std::getenv("TALLY_REQUIRE_GPU");
    if (require != nullptr && std::string(require) == "1")
      FAIL() << "TALLY_REQUIRE_GPU=1 but the nccl backend cannot run: " << g_no_gpu;
    GTEST_SKIP() << g_no_gpu;
  }
  static int world() { return g_session->size() * g_ranks_per_gpu; }
};

// The founding #6099 case (TP 2, EP 2, ETP 1, expert biases, layer-wise, only expert-row-bias
// gradients) at this job's world: 2 (two GPUs) or 8 (two GPUs, four ranks each).
TEST_F(NcclBackend, FoundingCaseMatchesSim) {
  if (world() != 2 && world() != 8) GTEST_SKIP() << "the founding case runs at world 2 or 8";
  casefile::Case c;
  c.topology = testing::config_of(world(), 2, 1, 2, 1);
  c.model = testing::founding_model();
  c.path = testing::ones(vocab::OptimizerModel::layerwise);
  c.path.gradients.class_mask = vocab::class_bit(topologies::ParamClass::expert_row_bias);
  SimBackend sim;
  oracle::Verdict nccl = g_backend->run(c, {});
  EXPECT_EQ(nccl.kind, oracle::Verdict::Kind::pass);
  EXPECT_EQ(nccl.stats[0].got, 4.0);
  testing::expect_same_verdict(sim.run(c, {}), nccl, true);
  c.path.faults = vocab::FaultSet::of({vocab::Fault::expert_dedup_on_dense_tp});
  nccl = g_backend->run(c, {});
  EXPECT_EQ(nccl.kind, oracle::Verdict::Kind::fail);
  EXPECT_EQ(nccl.stats[0].got, std::sqrt(8.0));
  testing::expect_same_verdict(sim.run(c, {}), nccl, true);
}

// Random configurations of this world, random models, every optimizer model, exact and random
// gradient modes, with and without a fault: the same verdicts, bit for bit in exact modes.
TEST_F(NcclBackend, RandomCasesMatchSim) {
  std::vector<topologies::ParallelConfig> configs;
  topologies::EnumerateFilter filter;
  topologies::for_each_config(world(), filter, [&](const topologies::ParallelConfig& c) {
    if (testing::megatron_assumptions_hold(c)) configs.push_back(c);
  });
  ASSERT_FALSE(configs.empty());
  SimBackend sim;
  const std::vector<vocab::Fault> faults = {
      vocab::Fault::expert_dedup_on_dense_tp, vocab::Fault::no_dedup_filter,
      vocab::Fault::missing_pp_reduction, vocab::Fault::stats_over_replicas,
      vocab::Fault::tied_copy_not_shared, vocab::Fault::distopt_overlapping_shards};
  const char* quick = std::getenv("TALLY_GPU_TEST_QUICK");
  const int count = quick && std::string(quick) == "1" ? 6 : 24;
  for (int i = 0; i < count; ++i) {
    casefile::Case c;
    c.topology = configs[(static_cast<std::size_t>(i) * 7919u) % configs.size()];
    c.model = testing::model_spec_for(c.topology)(rc::Random(1000 + i), 30).value();
    c.path.optimizer = static_cast<vocab::OptimizerModel>(i % 4);
    const bool exact = i % 3 != 2;
    c.path.gradients.generator.mode =
        exact ? kernels::GradientMode::dyadic : kernels::GradientMode::normal;
    c.path.gradients.generator.seed = static_cast<std::uint64_t>(i);
    c.path.max_norm = 1.0;
    if (i % 2 == 1) c.path.faults = vocab::FaultSet::of({faults[(i / 2) % faults.size()]});
    SCOPED_TRACE("case " + std::to_string(i) + ": " + topologies::describe(c.topology));
    const oracle::Verdict nccl = g_backend->run(c, {});
    testing::expect_same_verdict(sim.run(c, {}), nccl, exact);
    // Same case, same bits (the determinism contract of comm/nccl_communicator.h).
    if (i % 4 == 0) testing::expect_same_verdict(nccl, g_backend->run(c, {}), true);
  }
}

TEST_F(NcclBackend, AWorldOtherThanTheJobIsNotRunnableHere) {
  casefile::Case c;
  c.topology = testing::config_of(world() * 2, 1, 1, 1, 1);
  c.model = testing::dense_model();
  EXPECT_THROW(g_backend->run(c, {}), NotRunnableHere);
}

}  // namespace
}  // namespace tally::run

int main(int argc, char** argv) {
  if (const char* k = std::getenv("TALLY_RANKS_PER_GPU")) tally::run::g_ranks_per_gpu = std::atoi(k);
  std::string why;
  if (!tally::run::nccl_engine_available(&why)) {
    tally::run::g_no_gpu = why;
  } else if (!tally::kernels::cuda_device_available(&why)) {
    tally::run::g_no_gpu = "no CUDA device: " + why;
  }
  if (!tally::run::g_no_gpu.empty()) {
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
  }
  tally::comm::MpiSession session(&argc, &argv, tally::comm::MpiOptions{60.0});
  std::unique_ptr<tally::run::RankEngine> engine =
      tally::run::make_nccl_engine(session, tally::run::g_ranks_per_gpu);
  if (session.rank() != 0) return tally::run::serve_mpi_cases(session, *engine);
  ::testing::InitGoogleTest(&argc, argv);
  tally::run::MpiBackend backend(session, std::move(engine));
  tally::run::g_session = &session;
  tally::run::g_backend = &backend;
  const int code = RUN_ALL_TESTS();
  backend.finish(code);
  return code;
}
