// Statistics a run's manifests can hold (manifest/statistics.h): each possible for its element
// count, and pieces of the same logical elements agreeing, on one rank and across ranks. A run
// that breaks a rule is rejected with one line naming the pieces and the rule, never judged. The
// edits of issue 18 are made to a real Megatron-core run (the PP 2 fixture, which passes as it is).
#include "manifest/statistics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include "manifest/manifest_json.h"
#include "tests/manifest/hand_built_runs.h"

namespace tally::manifest {
namespace {

using namespace hand_built;

const std::string kFixtures =
    std::string(TALLY_SOURCE_DIR) + "/tests/fixtures/manifests/megatron-core-0.16.1";

// The PP 2 run: rank 0 is the first stage. Its params[1], the position embedding (64 elements,
// 3 of them zero), is held by no other rank and owned whole by optimizers[0].main_params[1].
RunManifests pp2_run() { return load_run(kFixtures + "/chained-adam-tp1-pp2-hashed"); }
constexpr int kPositionEmbedding = 1;

MainParam& position_embedding_piece(RunManifests& run) {
  for (MainParam& p : run.ranks[0].optimizers[0].main_params)
    if (p.param == kPositionEmbedding) return p;
  throw std::logic_error("the fixture changed: no piece of params[1] on rank 0");
}

// Passes when `run` is rejected with one line holding every fragment.
void expect_rejected(const RunManifests& run, const std::vector<std::string>& fragments) {
  const std::string message = check_error(run);
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& fragment : fragments)
    EXPECT_NE(message.find(fragment), std::string::npos) << "missing \"" << fragment << "\" in\n" << message;
}

TEST(ManifestStatistics, EveryFixtureRunIsConsistent) {
  int runs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kFixtures)) {
    if (!entry.is_directory()) continue;
    ++runs;
    EXPECT_EQ(check_error(load_run(entry.path().string())), "no error") << entry.path();
  }
  EXPECT_EQ(runs, 8);
}

TEST(ManifestStatistics, PieceFixtureAsAssumed) {
  RunManifests run = pp2_run();
  const ModelParam& p = run.ranks[0].params[kPositionEmbedding];
  EXPECT_EQ(p.logical_name, "embedding.position_embeddings.weight");
  EXPECT_EQ(p.stats, (GradStats{22.828125, 1.0, 3}));
  EXPECT_EQ(position_embedding_piece(run).stats, p.stats);
  EXPECT_EQ(position_embedding_piece(run).end, 64);
}

// Issue 18: doubled in the param (the truth) but not in the piece (the ledger) was an l2 FAIL.
TEST(ManifestStatistics, ParamDisagreeingWithThePieceOfItsWholeBoxIsRejected) {
  RunManifests run = pp2_run();
  run.ranks[0].params.edit()[kPositionEmbedding].stats.sum_squares *= 2;
  expect_rejected(run, {"rank-0.json: optimizers[0].main_params[1] (embedding.position_embeddings.weight, "
                        "elements [0,64) of box offsets [0,0] extents [8,8]) and rank-0.json params[1] "
                        "(embedding.position_embeddings.weight, box offsets [0,0] extents [8,8]) cover "
                        "the same elements but disagree: sum_squares 22.828125 here, 45.65625 there",
                        "pieces of the same elements must have equal statistics"});
}

// Issue 18: the reverse edit was an l2-ledger FAIL.
TEST(ManifestStatistics, PieceDisagreeingWithItsParamIsRejected) {
  RunManifests run = pp2_run();
  position_embedding_piece(run).stats.sum_squares *= 2;
  expect_rejected(run, {"rank-0.json: optimizers[0].main_params[1] (embedding.position_embeddings.weight",
                        "sum_squares 45.65625 here, 22.828125 there"});
}

// Issue 18: judged as a zeros FAIL.
TEST(ManifestStatistics, AllZeroWithSquaresIsImpossible) {
  RunManifests run = pp2_run();
  run.ranks[0].params.edit()[kPositionEmbedding].stats.zeros = 64;
  position_embedding_piece(run).stats.zeros = 64;
  expect_rejected(run, {"rank-0.json: params[1] (embedding.position_embeddings.weight, box offsets [0,0] "
                        "extents [8,8]): impossible statistics: all 64 elements zero, but sum_squares "
                        "22.828125 and abs_max 1"});
}

// Issue 18: a PASS that printed "zeros 187 (ledger implies 190)".
TEST(ManifestStatistics, PieceWithAnotherZeroCountThanItsParamIsRejected) {
  RunManifests run = pp2_run();
  position_embedding_piece(run).stats.zeros += 3;
  expect_rejected(run, {"disagree: zeros 6 here, 3 there"});
}

// Issue 18: accepted.
TEST(ManifestStatistics, AbsMaxSquaredAboveTheSumOfSquaresIsImpossible) {
  RunManifests run = pp2_run();
  for (GradStats* s : {&run.ranks[0].params.edit()[kPositionEmbedding].stats, &position_embedding_piece(run).stats})
    s->abs_max = 5.0;
  expect_rejected(run, {"rank-0.json: params[1] (embedding.position_embeddings.weight",
                        "abs_max 5 squared is 25, more than sum_squares 22.828125"});
}

TEST(ManifestStatistics, RoundingOfTheLargestSquareIsAllowed) {
  RunManifests run = founding_run(false);
  for (RankManifest& m : run.ranks) {
    m.params.edit()[0].stats = {1.0, 1.0 + 1e-12, 7};  // one element of 8 nonzero
    m.optimizers[0].main_params[0].stats = m.params[0].stats;
  }
  EXPECT_EQ(check_error(run), "no error");
}

TEST(ImpossibleStatistics, EachRuleNamesItsValues) {
  EXPECT_EQ(impossible_statistics({8.0, 1.0, 0}, 8), "");
  EXPECT_EQ(impossible_statistics({0.0, 0.0, 8}, 8), "");
  EXPECT_EQ(impossible_statistics({2.0, 1.0, 6}, 8), "");
  EXPECT_EQ(impossible_statistics({1.0, 1.0, 9}, 8), "zeros 9 in 8 elements");
  EXPECT_EQ(impossible_statistics({1.0, 1.0, -1}, 8), "zeros -1 (a count is >= 0)");
  EXPECT_EQ(impossible_statistics({-1.0, 1.0, 0}, 8), "sum_squares -1 (a sum of squares is >= 0)");
  EXPECT_EQ(impossible_statistics({1.0, -1.0, 0}, 8), "abs_max -1 (a magnitude is >= 0)");
  EXPECT_EQ(impossible_statistics({std::nan(""), 1.0, 0}, 8), "sum_squares nan (expected a finite number)");
  EXPECT_EQ(impossible_statistics({1.0, std::numeric_limits<double>::infinity(), 0}, 8),
            "abs_max inf (expected a finite number)");
  EXPECT_EQ(impossible_statistics({1.0, 0.0, 8}, 8),
            "all 8 elements zero, but sum_squares 1 and abs_max 0");
  EXPECT_EQ(impossible_statistics({0.0, 0.0, 7}, 8),
            "1 of 8 elements nonzero, but abs_max 0 (a nonzero element has a magnitude > 0)");
  EXPECT_EQ(impossible_statistics({4.0, 3.0, 0}, 8),
            "abs_max 3 squared is 9, more than sum_squares 4 (the largest square is one of the squares summed)");
  EXPECT_EQ(impossible_statistics({9.0, 1.0, 0}, 8),
            "sum_squares 9, more than 8 nonzero elements times abs_max 1 squared (8)");
}

// Data-parallel replicas hold the same box and, without a distributed optimizer, own the same
// piece: their statistics must be equal.
TEST(ManifestStatistics, ReplicasOfOnePieceMustAgree) {
  RunManifests run = distributed_run(6, 6);
  for (RankManifest& m : run.ranks) m.optimizers[0].main_params[0] = whole(0, m.params[0], m.rank < 2);
  ASSERT_EQ(check_error(run), "no error");
  run.ranks[2].optimizers[0].main_params[0].stats.abs_max = 2.0;
  expect_rejected(run, {"rank-2.json: optimizers[0].main_params[0] (proj.weight, elements [0,12) of box "
                        "offsets [0,0] extents [3,4]) and rank-2.json params[0]"});
  run = distributed_run(6, 6);
  for (RankManifest& m : run.ranks) m.optimizers[0].main_params[0].begin = 0;  // every rank owns [0, 6)
  for (RankManifest& m : run.ranks) m.optimizers[0].main_params[0].end = 6;
  for (RankManifest& m : run.ranks) m.optimizers[0].main_params[0].stats = ones(6);
  run.ranks[2].optimizers[0].main_params[0].stats.zeros = 1;
  run.ranks[2].optimizers[0].main_params[0].stats.sum_squares = 5;
  expect_rejected(run, {"rank-2.json: optimizers[0].main_params[0] (proj.weight, elements [0,6) of box "
                        "offsets [0,0] extents [3,4]) and rank-0.json optimizers[0].main_params[0] "
                        "(proj.weight, elements [0,6) of box offsets [0,0] extents [3,4]) cover the same "
                        "elements but disagree: sum_squares 5 here, 6 there; zeros 1 here, 0 there"});
}

TEST(ManifestStatistics, ReplicatedParamsMustAgree) {
  RunManifests run = founding_run(false);
  run.ranks[1].params.edit()[0].stats.sum_squares = 7.99999999;  // beyond the rounding of two sums
  expect_rejected(run, {"rank-1.json: params[0] (norm.weight, box offsets [0] extents [8]) and rank-0.json "
                        "params[0] (norm.weight, box offsets [0] extents [8]) cover the same elements but "
                        "disagree: sum_squares 7.9999999900000001 here, 8 there"});
  run.ranks[1].params.edit()[0].stats.sum_squares = 7.999999999999;  // within it
  EXPECT_EQ(check_error(run), "no error");
}

// A distributed optimizer splits a box into disjoint ranges: their zero counts add up to the
// box's, their sums of squares too (within rounding).
TEST(ManifestStatistics, DisjointRangesOfOneBoxAddUp) {
  RunManifests run = distributed_run(5, 7);
  ASSERT_EQ(check_error(run), "no error");
  run.ranks[2].optimizers[0].main_params[0].stats = {6.0, 1.0, 1};  // [5,12): 1 zero of 7; the box says 0
  expect_rejected(run, {"rank-2.json: optimizers[0].main_params[0] (proj.weight, elements [5,12) of box "
                        "offsets [0,0] extents [3,4])",
                        "zeros 1, more than the whole box's 0"});
  run = distributed_run(5, 7);
  for (RankManifest& m : run.ranks)
    if (m.rank % 2 == 0) m.params.edit()[0].stats = {11.0, 1.0, 1};  // the box holds 1 zero: [0,5) or [5,12)
  expect_rejected(run, {"rank-2.json: optimizers[0].main_params[0] (proj.weight, elements [5,12) of box "
                        "offsets [0,0] extents [3,4]): zeros 0 and sum_squares 7, but rank-0.json params[0] "
                        "(proj.weight, box offsets [0,0] extents [3,4]) and rank-0.json optimizers[0]."
                        "main_params[0] (proj.weight, elements [0,5) of box offsets [0,0] extents [3,4]) "
                        "leave zeros 1 and sum_squares 6 for these elements",
                        "the statistics of a box's parts add up to the box's"});
}

// Ranges that overlap across ranks are consistent when every part they imply is possible.
TEST(ManifestStatistics, OverlappingRangesImplyPossibleParts) {
  RunManifests run = distributed_run(5, 5);
  run.ranks[0].optimizers[0].main_params[0].end = 7;  // rank 0 owns [0,7), rank 2 owns [5,12)
  run.ranks[0].optimizers[0].main_params[0].stats = ones(7);
  ASSERT_EQ(check_error(run), "no error");
  // The box holds 1 zero, but neither [0,7) nor [5,12) does: [5,7) would hold -1.
  for (RankManifest& m : run.ranks)
    if (m.rank % 2 == 0) m.params.edit()[0].stats = {11.0, 1.0, 1};
  expect_rejected(run, {"rank-0.json: params[0] (proj.weight, box offsets [0,0] extents [3,4]), rank-0.json "
                        "optimizers[0].main_params[0] (proj.weight, elements [0,7) of box offsets [0,0] "
                        "extents [3,4]) and rank-2.json optimizers[0].main_params[0] (proj.weight, elements "
                        "[5,12) of box offsets [0,0] extents [3,4]) leave zeros -1 and sum_squares 3 for "
                        "elements [5,7) of their box",
                        "every part of a box holds 0 to all of its elements' zeros"});
}

TEST(ManifestStatistics, RangeHoldingMoreThanItsBoxIsImpossible) {
  RunManifests run = distributed_run(5, 7);
  run.ranks[0].optimizers[0].main_params[0].stats = {5.0, 2.0, 0};
  expect_rejected(run, {"rank-0.json: optimizers[0].main_params[0] (proj.weight, elements [0,5)",
                        "abs_max 2, more than the whole box's 1"});
  run = distributed_run(5, 7);
  for (RankManifest& m : run.ranks)
    if (m.rank % 2 == 0) m.params.edit()[0].stats = {4.0, 1.0, 8};  // 8 zeros of 12
  run.ranks[0].optimizers[0].main_params[0].stats = {4.0, 1.0, 0};  // none in [0,5): 8 left for 7
  expect_rejected(run, {"rank-0.json: optimizers[0].main_params[0]",
                        "zeros 0, but the box's 8 zeros leave at least 1 in these 5 elements"});
}

}  // namespace
}  // namespace tally::manifest
