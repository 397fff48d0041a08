// A rank record as bytes and back: what the mpi and nccl backends gather on rank 0.
#include "run/record_wire.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "run/run_case.h"
#include "tests/support/fault_cases.h"

namespace tally::run {
namespace {

// The founding case, clipped on some params and left as stored on others (clip-per-child-norm:
// the dense child's own norm is under max_norm).
record::RunRecord clipped_run(double max_norm, bool per_child) {
  casefile::Case c;
  c.topology = testing::config_of(4, 2, 1, 2, 1);
  c.model = testing::founding_model();
  c.path = testing::ones(vocab::OptimizerModel::plain);
  c.path.gradients.class_mask = vocab::class_bit(topologies::ParamClass::expert_row_bias);
  c.path.max_norm = max_norm;
  if (per_child) c.path.faults = vocab::FaultSet::of({vocab::Fault::clip_per_child_norm});
  return *run_case_with_record(c).record;
}

void expect_round_trip(const record::RunRecord& run) {
  std::vector<std::vector<int>> groups;
  record::GroupTable table(groups);
  record::LocalRecordPool locals;
  for (const record::RankRecord& rank : run.ranks) {
    const record::RankRecord back = decode_rank_record(encode_rank_record(rank, run.groups), table, locals);
    EXPECT_EQ(back.rank, rank.rank);
    EXPECT_EQ(*back.local, *rank.local);
    EXPECT_EQ(back.reported, rank.reported);
    ASSERT_EQ(back.children.size(), rank.children.size());
    for (std::size_t c = 0; c < rank.children.size(); ++c) {
      EXPECT_EQ(groups[back.children[c].stats_group], run.groups[rank.children[c].stats_group]);
      EXPECT_EQ(back.children[c].clip, rank.children[c].clip);
      EXPECT_EQ(back.children[c].norm, rank.children[c].norm);
    }
    EXPECT_EQ(groups[back.tp_group], run.groups[rank.tp_group]);
    EXPECT_EQ(groups[back.expert_tp_group], run.groups[rank.expert_tp_group]);
    ASSERT_EQ(back.gtp_group < 0, rank.gtp_group < 0);
    if (rank.gtp_group >= 0) {
      EXPECT_EQ(groups[back.gtp_group], run.groups[rank.gtp_group]);
      EXPECT_EQ(groups[back.expert_gtp_group], run.groups[rank.expert_gtp_group]);
    }
    ASSERT_EQ(back.clipped == nullptr, rank.clipped == nullptr);
    if (!rank.clipped) continue;
    ASSERT_EQ(back.clipped->size(), rank.clipped->size());
    for (std::size_t i = 0; i < rank.clipped->size(); ++i) {
      const record::ClippedParam &a = (*back.clipped)[i], &b = (*rank.clipped)[i];
      EXPECT_EQ(a.coefficient, b.coefficient);
      EXPECT_EQ(a.size, b.size);
      EXPECT_EQ(a.data == nullptr, b.data == nullptr);
      if (a.data) {
        EXPECT_TRUE(std::equal(a.values().begin(), a.values().end(), b.values().begin()));
      }
    }
  }
  // Ranks that held and decided alike share their decoded local record again.
  EXPECT_LE(locals.size(), run.ranks.size());
}

TEST(RecordWire, ClippedLeftAsStoredAndUnclippedRecordsRoundTrip) {
  expect_round_trip(clipped_run(1.0, false));    // clipped
  expect_round_trip(clipped_run(1e6, false));    // every gradient left as stored
  expect_round_trip(clipped_run(0.0, false));    // no clipped gradients recorded
  expect_round_trip(clipped_run(3.0, true));     // some clipped, some not
}

// With generalized TP a rank's GTP groups travel too: the diagnosis reads them.
TEST(RecordWire, GtpGroupsRoundTrip) {
  casefile::Case c;
  c.topology = testing::with_gtp(testing::config_of(4, 2, 1, 1, 1), 2, 1);
  c.model = testing::founding_model();
  c.path = testing::ones(vocab::OptimizerModel::plain);
  const record::RunRecord run = *run_case_with_record(c).record;
  ASSERT_GE(run.ranks[0].gtp_group, 0);
  expect_round_trip(run);
}

TEST(RecordWire, TruncatedOrForeignBytesAreRefused) {
  const record::RunRecord run = clipped_run(1.0, false);
  const std::string bytes = encode_rank_record(run.ranks[0], run.groups);
  std::vector<std::vector<int>> groups;
  record::GroupTable table(groups);
  record::LocalRecordPool locals;
  for (std::size_t cut : {std::size_t{0}, std::size_t{3}, bytes.size() / 2, bytes.size() - 1})
    EXPECT_THROW(decode_rank_record(bytes.substr(0, cut), table, locals), std::invalid_argument) << cut;
  EXPECT_THROW(decode_rank_record(bytes + "x", table, locals), std::invalid_argument);
  EXPECT_THROW(decode_rank_record("not a record at all", table, locals), std::invalid_argument);
}

}  // namespace
}  // namespace tally::run
