// The ledger of hand-built run records: each element once per norm group and zero count, over
// the stats groups, element by element.
#include "oracle/ledger.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

namespace tally::oracle {
namespace {

record::Box box_1d(std::int64_t offset, std::int64_t extent) {
  record::Box b;
  b.offset[0] = offset;
  b.extent.ndim = 1;
  b.extent.size[0] = extent;
  return b;
}

record::Piece piece(int param, std::int64_t begin, std::int64_t end, int counted_in) {
  record::Piece p;
  p.param = param;
  p.range = {begin, end};
  p.counted_in = counted_in;
  p.in_zero_count = counted_in >= 0;
  return p;
}

// One tensor over world = boxes.size() ranks, one child reducing over all of them; rank r holds
// boxes[r] and owns pieces[r] of it.
record::RunRecord boxes_run(const record::Tensor& tensor, const std::vector<record::Box>& boxes,
                            const std::vector<std::vector<record::Piece>>& pieces) {
  record::RunRecord run;
  run.world = static_cast<int>(boxes.size());
  run.tensors = {tensor};
  run.children = {"child"};
  run.groups = {{}};
  for (int r = 0; r < run.world; ++r) {
    run.groups[0].push_back(r);
    auto local = std::make_shared<record::LocalRecord>();
    local->params = {{0, boxes[static_cast<std::size_t>(r)], {}, std::nullopt}};
    local->pieces = pieces[static_cast<std::size_t>(r)];
    record::RankRecord rank;
    rank.rank = r;
    rank.local = local;
    rank.children = {{0, -1, -1, std::nullopt, std::nullopt}};
    run.ranks.push_back(rank);
  }
  return run;
}

// World 2, one tensor "w" of 8 elements held whole by both ranks, one child reducing over both.
// `pieces[r]` are what rank r's optimizer owns of it.
record::RunRecord replicated_run(const std::vector<std::vector<record::Piece>>& pieces) {
  record::Tensor w;
  w.name = "w";
  w.shape.ndim = 1;
  w.shape.size[0] = 8;
  w.kind = "replicated";
  return boxes_run(w, {box_1d(0, 8), box_1d(0, 8)}, pieces);
}

TEST(Ledger, EachElementOnceOverTheStatsGroupPasses) {
  const LedgerResult result = count_ledgers(replicated_run({{piece(0, 0, 8, 0)}, {piece(0, 0, 8, -1)}}));
  EXPECT_TRUE(result.wrong.empty());
  EXPECT_FALSE(result.has_statistics);
}

TEST(Ledger, ATensorKeptOnBothReplicasIsCountedTwiceOnEveryRank) {
  const LedgerResult result = count_ledgers(replicated_run({{piece(0, 0, 8, 0)}, {piece(0, 0, 8, 0)}}));
  ASSERT_EQ(result.wrong.size(), 1u);
  EXPECT_EQ(result.wrong[0].tensor, 0);
  EXPECT_EQ(result.wrong[0].ledger, 0);
  EXPECT_EQ(result.wrong[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(result.wrong[0].counted, 16);
  EXPECT_EQ(result.wrong[0].least, 2);
  EXPECT_EQ(result.wrong[0].most, 2);
}

TEST(Ledger, ElementsCountedTwiceAndNeverAreSeenThoughTheTotalIsRight) {
  // Rank 0 keeps [0, 5), rank 1 keeps [4, 7): element 4 twice, 7 never, 8 counts in all.
  const LedgerResult result =
      count_ledgers(replicated_run({{piece(0, 0, 5, 0)}, {piece(0, 4, 7, 0)}}));
  ASSERT_EQ(result.wrong.size(), 1u);
  EXPECT_EQ(result.wrong[0].counted, 8);
  EXPECT_EQ(result.wrong[0].least, 0);
  EXPECT_EQ(result.wrong[0].most, 2);
}

TEST(Ledger, AStatsGroupOfOneRankSeesOnlyItsOwnPieces) {
  record::RunRecord run = replicated_run({{piece(0, 0, 4, 0)}, {piece(0, 4, 8, 0)}});
  run.groups = {{0}, {1}};
  run.ranks[1].children[0].stats_group = 1;
  const LedgerResult result = count_ledgers(run);
  ASSERT_EQ(result.wrong.size(), 1u);
  EXPECT_EQ(result.wrong[0].counted, 4);  // rank 0 sees its half only
  EXPECT_EQ(result.wrong[0].ranks, (std::vector<int>{0, 1}));
}

// Ranks that count differently form classes judged in no particular order: the headline count
// is always the lowest wrong rank's.
TEST(Ledger, TheHeadlineCountIsTheLowestWrongRanks) {
  record::RunRecord run = replicated_run({{piece(0, 0, 2, 0)}, {piece(0, 0, 8, 0)}});
  run.world = 4;
  run.groups = {{0}, {1}, {2}, {3}};
  run.ranks.push_back(run.ranks[0]);
  run.ranks.push_back(run.ranks[0]);
  const std::int64_t kept[] = {6, 8, 4, 2};  // rank r keeps [0, kept[r])
  for (int r = 0; r < 4; ++r) {
    auto local = std::make_shared<record::LocalRecord>(*run.ranks[static_cast<std::size_t>(r)].local);
    local->pieces = {piece(0, 0, kept[r], 0)};
    run.ranks[static_cast<std::size_t>(r)].rank = r;
    run.ranks[static_cast<std::size_t>(r)].local = local;
    run.ranks[static_cast<std::size_t>(r)].children[0].stats_group = r;
  }
  const LedgerResult result = count_ledgers(run);
  ASSERT_EQ(result.wrong.size(), 1u);
  EXPECT_EQ(result.wrong[0].ranks, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(result.wrong[0].counted_by_rank, (std::vector<std::int64_t>{6, 4, 2}));
  EXPECT_EQ(result.wrong[0].counted, 6);
}

TEST(Ledger, ATensorOfAnotherNormGroupMustStayOutOfTheMainNorm) {
  record::RunRecord run = replicated_run({{piece(0, 0, 8, 0)}, {}});
  run.norm_groups.push_back({"mtp", true});
  run.tensors[0].norm_group = 1;
  LedgerResult result = count_ledgers(run);
  ASSERT_EQ(result.wrong.size(), 1u);
  EXPECT_EQ(result.wrong[0].ledger, 0);  // counted in the main norm, where it does not belong
  EXPECT_EQ(expected_times(run, 0, 0), 0);
  // Counted in its own group, once: right.
  run = replicated_run({{piece(0, 0, 8, 1)}, {}});
  run.norm_groups.push_back({"mtp", true});
  run.tensors[0].norm_group = 1;
  EXPECT_TRUE(count_ledgers(run).wrong.empty());
  // A group the record does not count (a real run reporting only the main norm) is not judged.
  run = replicated_run({{piece(0, 0, 8, -1)}, {}});
  run.ranks[0].local = std::make_shared<record::LocalRecord>(record::LocalRecord{
      run.ranks[0].local->params, {[] { record::Piece p = piece(0, 0, 8, -1); p.in_zero_count = true; return p; }()}});
  run.norm_groups.push_back({"mtp", false});
  run.tensors[0].norm_group = 1;
  EXPECT_TRUE(count_ledgers(run).wrong.empty());
}

TEST(Ledger, TheZeroCountIsALedgerToo) {
  record::RunRecord run = replicated_run({{piece(0, 0, 8, 0)}, {piece(0, 0, 8, -1)}});
  auto local = std::make_shared<record::LocalRecord>(*run.ranks[1].local);
  local->pieces[0].in_zero_count = true;  // the TP replica in the zero count
  run.ranks[1].local = local;
  const LedgerResult result = count_ledgers(run);
  ASSERT_EQ(result.wrong.size(), 1u);
  EXPECT_EQ(result.wrong[0].ledger, zero_count_ledger(run));
  EXPECT_EQ(result.wrong[0].counted, 16);
}

TEST(Ledger, StatisticsGiveEachRanksImpliedNorm) {
  std::vector<std::vector<record::Piece>> pieces = {{piece(0, 0, 8, 0)}, {piece(0, 0, 8, -1)}};
  for (auto& rank : pieces) rank[0].stats = record::GradStats{8.0, 1.0, 0};
  const LedgerResult result = count_ledgers(replicated_run(pieces));
  ASSERT_TRUE(result.has_statistics);
  EXPECT_EQ(result.implied_norm, (std::vector<double>{std::sqrt(8.0), std::sqrt(8.0)}));
  EXPECT_EQ(result.implied_zeros, (std::vector<std::int64_t>{0, 0}));
}

TEST(Ledger, StridedPiecesOfATwoDimensionalBoxCountEachElementOnce) {
  // A 3 x 8 tensor, two ranks holding the column halves [0:3, 0:4] and [0:3, 4:8]; each box's
  // row-major range is split between two owners at different points.
  record::Tensor t;
  t.name = "proj.weight";
  t.shape.ndim = 2;
  t.shape.size[0] = 3;
  t.shape.size[1] = 8;
  const std::int64_t split[2] = {5, 7};
  std::vector<record::Box> boxes;
  std::vector<std::vector<record::Piece>> pieces;
  for (int r = 0; r < 4; ++r) {
    const int half = r % 2;
    record::Box box;
    box.offset[1] = 4 * half;
    box.extent.ndim = 2;
    box.extent.size[0] = 3;
    box.extent.size[1] = 4;
    boxes.push_back(box);
    pieces.push_back({r < 2 ? piece(0, 0, split[half], 0) : piece(0, split[half], 12, 0)});
  }
  record::RunRecord run = boxes_run(t, boxes, pieces);
  EXPECT_TRUE(count_ledgers(run).wrong.empty());
  // Rank 0 one element longer: that element twice.
  auto longer = std::make_shared<record::LocalRecord>(*run.ranks[0].local);
  longer->pieces[0].range.end = 6;
  run.ranks[0].local = longer;
  const LedgerResult result = count_ledgers(run);
  ASSERT_EQ(result.wrong.size(), 1u);
  EXPECT_EQ(result.wrong[0].counted, 25);
  EXPECT_EQ(result.wrong[0].most, 2);
}

// Whole column boxes of a 6 x 8 x 4 row-parallel weight on two TP ranks (one stats group): the
// leading dim, spanned whole by every piece, is folded, and the counts weigh each atom by it.
// Dropping one rank's piece leaves half the tensor uncounted, exactly as element by element; a
// miscount inside the folded dim (one rank double-counting a rows' worth) is still found.
TEST(Ledger, FoldedLeadingDimsCountAsElementByElement) {
  record::Tensor t;
  t.name = "linear_proj.weight";
  t.shape.ndim = 3;
  t.shape.size[0] = 6;
  t.shape.size[1] = 8;
  t.shape.size[2] = 4;
  auto column = [](int half) {
    record::Box box;
    box.offset[1] = 4 * half;
    box.extent.ndim = 3;
    box.extent.size[0] = 6;
    box.extent.size[1] = 4;
    box.extent.size[2] = 4;
    return box;
  };
  const record::RunRecord run = boxes_run(t, {column(0), column(1)}, {{piece(0, 0, 96, 0)}, {piece(0, 0, 96, 0)}});
  EXPECT_TRUE(count_ledgers(run).wrong.empty());

  record::RunRecord dropped = run;
  auto none = std::make_shared<record::LocalRecord>(*run.ranks[1].local);
  none->pieces[0].counted_in = -1;
  none->pieces[0].in_zero_count = false;
  dropped.ranks[1].local = none;
  const LedgerResult half = count_ledgers(dropped);
  ASSERT_EQ(half.wrong.size(), 1u);
  EXPECT_EQ(half.wrong[0].counted, 96);
  EXPECT_EQ(half.wrong[0].least, 0);
  EXPECT_EQ(half.wrong[0].most, 1);

  // Rank 1 owns its box twice over a range, not whole: no fold for the tensor, and its first
  // 16 elements (one row of its box) are counted twice.
  record::RunRecord twice = run;
  auto both = std::make_shared<record::LocalRecord>(*run.ranks[1].local);
  both->pieces.push_back(piece(0, 0, 16, 0));
  twice.ranks[1].local = both;
  const LedgerResult extra = count_ledgers(twice);
  ASSERT_EQ(extra.wrong.size(), 1u);
  EXPECT_EQ(extra.wrong[0].counted, 192 + 16);
  EXPECT_EQ(extra.wrong[0].least, 1);
  EXPECT_EQ(extra.wrong[0].most, 2);
}

TEST(Ledger, TooManyIntervalsIsAnErrorNamingTheRank) {
  try {
    count_ledgers(replicated_run({{piece(0, 0, 8, 0)}, {piece(0, 0, 8, -1)}}), 1);
    FAIL() << "no error";
  } catch (const RecordTooLarge& error) {
    EXPECT_NE(std::string(error.what()).find("the pieces of rank 1"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace tally::oracle
