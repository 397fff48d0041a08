// The mpi backend gives the same verdicts as sim: launched by CTest under mpirun. Rank 0 runs
// the tests; the other ranks serve its cases.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cmath>

#include "comm/mpi_communicator.h"
#include "run/backend.h"
#include "tests/support/fault_cases.h"
#include "tests/support/verdict_compare.h"
#include "tests/support/model_gen.h"
#include "topologies/enumerate.h"

namespace tally::run {
namespace {

comm::MpiSession* g_session = nullptr;  // set once in main() for the test bodies
MpiBackend* g_backend = nullptr;

int world() { return g_session->size(); }

// The founding #6099 case at this job's world (2 or 8), with and without the fault.
TEST(MpiBackend, FoundingCaseMatchesSim) {
  if (world() != 2 && world() != 8) GTEST_SKIP() << "the founding case runs at world 2 or 8";
  casefile::Case c;
  c.topology = testing::config_of(world(), 2, 1, 2, 1);
  c.model = testing::founding_model();
  c.path = testing::ones(vocab::OptimizerModel::layerwise);
  c.path.gradients.class_mask = vocab::class_bit(topologies::ParamClass::expert_row_bias);
  SimBackend sim;
  oracle::Verdict mpi = g_backend->run(c, {});
  EXPECT_EQ(mpi.kind, oracle::Verdict::Kind::pass);
  EXPECT_EQ(mpi.stats[0].got, 4.0);
  testing::expect_same_verdict(sim.run(c, {}), mpi, true);
  c.path.faults = vocab::FaultSet::of({vocab::Fault::expert_dedup_on_dense_tp});
  mpi = g_backend->run(c, {});
  EXPECT_EQ(mpi.stats[0].got, std::sqrt(8.0));
  testing::expect_same_verdict(sim.run(c, {}), mpi, true);
}

// Random configurations of this world, random models, every optimizer model, exact and random
// gradient modes, with and without a fault: the same verdicts.
TEST(MpiBackend, RandomCasesMatchSim) {
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
  for (int i = 0; i < 24; ++i) {
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
    testing::expect_same_verdict(sim.run(c, {}), g_backend->run(c, {}), exact);
  }
}

TEST(MpiBackend, AWorldOtherThanTheJobSizeIsBadInput) {
  casefile::Case c;
  c.topology = testing::config_of(world() * 2, 1, 1, 1, 1);
  c.model = testing::dense_model();
  EXPECT_THROW(g_backend->run(c, {}), casefile::InvalidCase);
}

}  // namespace
}  // namespace tally::run

int main(int argc, char** argv) {
  tally::comm::MpiSession session(&argc, &argv, tally::comm::MpiOptions{60.0});
  if (session.rank() != 0) return tally::run::serve_mpi_cases(session);
  ::testing::InitGoogleTest(&argc, argv);
  tally::run::MpiBackend backend(session);
  tally::run::g_session = &session;
  tally::run::g_backend = &backend;
  const int code = RUN_ALL_TESTS();
  backend.finish(code);
  return code;
}
