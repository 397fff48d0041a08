#include "run/model_manifests.h"
#include "run/run_case.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "casefile/case.h"
#include "casefile/case_file.h"
#include "run/target.h"
#include "vocab/gradients.h"
#include "kernels/gradient_generator.h"
#include "tests/support/fault_cases.h"

namespace tally::run {
namespace {

using vocab::Fault;
using topologies::ParamClass;

casefile::Case case_of(const testing::FaultCase& f, bool with_fault) {
  casefile::Case c;
  c.topology = f.config;
  c.model = f.model;
  c.path = f.options;
  if (with_fault) c.path.faults = vocab::FaultSet::of({f.fault});
  return c;
}

// The case and what the path did on it.
struct Ran {
  casefile::Case c;
  CaseRun run;
  manifest::RunManifests manifests;
};

Ran run(const casefile::Case& c) {
  Ran r{c, run_case_with_record(c), {}};
  if (r.run.record) r.manifests = model_manifests(c, *r.run.record);
  return r;
}

casefile::Case founding_case(int world, bool with_fault) {
  casefile::Case c;
  c.topology = testing::config_of(world, 2, 1, 2, 1);
  c.model = testing::founding_model();
  c.path = testing::ones(vocab::OptimizerModel::layerwise);
  c.path.gradients.class_mask = vocab::class_bit(ParamClass::expert_row_bias);
  c.path.max_norm = 1.0;
  if (with_fault) c.path.faults = vocab::FaultSet::of({Fault::expert_dedup_on_dense_tp});
  return c;
}

// Calls visit(logical row-major index) for every element of the row-major range [begin, end)
// of a box.
template <typename Visit>
void for_each_element(const manifest::ModelParam& p, std::int64_t begin, std::int64_t end, Visit visit) {
  const std::size_t dims = p.logical_shape.size();
  for (std::int64_t n = begin; n < end; ++n) {
    std::int64_t rest = n, logical = 0, stride = 1;
    for (std::size_t d = dims; d-- > 0;) {
      logical += (p.offsets[d] + rest % p.extents[d]) * stride;
      rest /= p.extents[d];
      stride *= p.logical_shape[d];
    }
    visit(logical);
  }
}

std::int64_t volume(const std::vector<std::int64_t>& extents) {
  std::int64_t n = 1;
  for (std::int64_t e : extents) n *= e;
  return n;
}

// The statistics straight from the generator, element by element.
manifest::GradStats generated_stats(const manifest::ModelParam& p, std::int64_t begin, std::int64_t end,
                          const kernels::GeneratorSpec& gen, int logical_id) {
  manifest::GradStats s;
  for_each_element(p, begin, end, [&](std::int64_t element) {
    const double g = kernels::gradient_value(gen, static_cast<std::uint64_t>(logical_id),
                                             static_cast<std::uint64_t>(element));
    s.sum_squares += g * g;
    s.abs_max = std::max(s.abs_max, std::abs(g));
    s.zeros += g == 0.0;
  });
  return s;
}

// Every structural property a manifest of tally's model must have, on any case.
void expect_structure(const Ran& r) {
  const topologies::LogicalModel model(r.c.model, r.c.topology);
  const std::vector<kernels::GeneratorSpec> generators = vocab::param_generators(r.c.path.gradients, model);
  const topologies::RankLayout layout(r.c.topology);
  const record::RunRecord& run = *r.run.record;
  ASSERT_EQ(static_cast<int>(r.manifests.ranks.size()), layout.world());
  std::map<std::string, int> id_of;
  for (const topologies::LogicalParam& p : model.params()) id_of[p.name] = p.id;

  // logical name -> distinct boxes (offsets, extents)
  std::map<std::string, std::set<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>>>
      boxes;
  for (int rank = 0; rank < layout.world(); ++rank) {
    const manifest::RankManifest& m = r.manifests.ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(m.rank, rank);
    EXPECT_EQ(m.world, layout.world());
    EXPECT_EQ(m.parallel.tp, r.c.topology.tp);
    EXPECT_EQ(m.parallel.ep, r.c.topology.ep);
    EXPECT_EQ(m.parallel.etp, r.c.topology.etp);
    EXPECT_EQ(m.parallel.tp * m.parallel.cp * m.parallel.pp * m.parallel.dp, layout.world());
    ASSERT_TRUE(m.groups.count("tp"));
    ASSERT_TRUE(m.groups.count("expt_tp"));
    for (const auto& [name, id] : m.groups) {
      const std::vector<int>& ranks = r.manifests.group(id);
      EXPECT_TRUE(std::is_sorted(ranks.begin(), ranks.end())) << name;
      EXPECT_TRUE(std::binary_search(ranks.begin(), ranks.end(), rank)) << name;
    }
    EXPECT_EQ(r.manifests.group(m.groups.at("tp")), std::vector<int>(layout.group_ranks(topologies::Family::tp, rank).begin(),
                                                  layout.group_ranks(topologies::Family::tp, rank).end()));

    const std::vector<topologies::LocalParam> local = topologies::local_params(model, layout, rank);
    ASSERT_EQ(m.params.size(), local.size());
    for (std::size_t k = 0; k < m.params.size(); ++k) {
      const manifest::ModelParam& p = m.params[k];
      ASSERT_TRUE(id_of.count(p.logical_name)) << p.logical_name;
      const topologies::LogicalParam& logical = model.param(id_of[p.logical_name]);
      EXPECT_EQ(logical.id, local[k].logical_id);
      EXPECT_EQ(static_cast<int>(p.logical_shape.size()), logical.shape.rank);
      boxes[p.logical_name].insert({p.offsets, p.extents});
      const kernels::GeneratorSpec gen = generators[static_cast<std::size_t>(logical.id)];
      const manifest::GradStats want = generated_stats(p, 0, volume(p.extents), gen, logical.id);
      EXPECT_EQ(p.stats.zeros, want.zeros) << p.name;
      EXPECT_EQ(p.stats.abs_max, want.abs_max) << p.name;
      EXPECT_NEAR(p.stats.sum_squares, want.sum_squares, 1e-12 * (1 + want.sum_squares)) << p.name;
    }

    const record::RankRecord& outcome = run.ranks[rank];
    ASSERT_EQ(m.optimizers.size(), run.children.size());
    for (std::size_t c = 0; c < m.optimizers.size(); ++c) {
      const manifest::OptimizerRecord& o = m.optimizers[c];
      const std::vector<int>& stats_group = r.manifests.group(o.stats_group);
      EXPECT_TRUE(std::binary_search(stats_group.begin(), stats_group.end(), rank));
      EXPECT_EQ(stats_group, run.groups[outcome.children[c].stats_group]);
      EXPECT_EQ(o.clip.has_value(), r.c.path.max_norm > 0);
      if (o.clip) {
        EXPECT_EQ(o.clip->coefficient, outcome.children[c].clip->coefficient);
      }
      for (const manifest::MainParam& piece : o.main_params) {
        ASSERT_GE(piece.param, 0);
        ASSERT_LT(piece.param, static_cast<int>(m.params.size()));
        const manifest::ModelParam& p = m.params[piece.param];
        EXPECT_LE(0, piece.begin);
        EXPECT_LE(piece.begin, piece.end);
        EXPECT_LE(piece.end, volume(p.extents));
        EXPECT_TRUE(piece.kept_zeros || !piece.kept);
        const topologies::LogicalParam& logical = model.param(id_of[p.logical_name]);
        const kernels::GeneratorSpec gen = generators[static_cast<std::size_t>(logical.id)];
        const manifest::GradStats want = generated_stats(p, piece.begin, piece.end, gen, logical.id);
        EXPECT_EQ(piece.stats.zeros, want.zeros);
        EXPECT_EQ(piece.stats.abs_max, want.abs_max);
        EXPECT_NEAR(piece.stats.sum_squares, want.sum_squares, 1e-12 * (1 + want.sum_squares));
      }
    }
    EXPECT_EQ(m.reported.norm, outcome.reported.norm);
    EXPECT_EQ(m.reported.inf_norm, outcome.reported.inf_norm);
    EXPECT_EQ(m.reported.zeros, outcome.reported.zeros);
  }

  // The boxes of each logical param are disjoint and cover it: the TP (or ETP) shards.
  for (const topologies::LogicalParam& logical : model.params()) {
    SCOPED_TRACE(logical.name);
    ASSERT_TRUE(boxes.count(logical.name)) << "no rank holds it";
    std::int64_t held = 0;
    const auto& distinct = boxes[logical.name];
    for (const auto& [offsets, extents] : distinct) held += volume(extents);
    EXPECT_EQ(held, logical.numel);
    for (auto a = distinct.begin(); a != distinct.end(); ++a)
      for (auto b = std::next(a); b != distinct.end(); ++b) {
        bool overlap = true;
        for (std::size_t d = 0; d < a->first.size(); ++d)
          overlap = overlap && a->first[d] < b->first[d] + b->second[d] &&
                    b->first[d] < a->first[d] + a->second[d];
        EXPECT_FALSE(overlap);
      }
  }
}

// How many times each logical param's elements are counted on `rank`, from the kept pieces of
// the members of each optimizer's stats group (the manifest's ledger).
std::map<std::string, std::int64_t> ledger(const manifest::RunManifests& manifests, int rank) {
  std::map<std::string, std::int64_t> counted;
  const manifest::RankManifest& m = manifests.ranks[rank];
  for (std::size_t c = 0; c < m.optimizers.size(); ++c)
    for (int member : manifests.group(m.optimizers[c].stats_group))
      for (const manifest::MainParam& piece : manifests.ranks[member].optimizers[c].main_params)
        if (piece.kept)
          counted[manifests.ranks[member].params[piece.param].logical_name] += piece.end - piece.begin;
  return counted;
}

TEST(ModelManifests, FoundingCaseHasEveryRankGroupAndBox) {
  for (int world : {2, 4, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    expect_structure(run(founding_case(world, false)));
    expect_structure(run(founding_case(world, true)));
  }
}

TEST(ModelManifests, FoundingCaseKeepsEachElementOnceWithoutTheFault) {
  const Ran r = run(founding_case(4, false));
  const topologies::LogicalModel model(r.c.model, r.c.topology);
  for (int rank = 0; rank < 4; ++rank) {
    const std::map<std::string, std::int64_t> counted = ledger(r.manifests, rank);
    for (const topologies::LogicalParam& p : model.params())
      EXPECT_EQ(counted.count(p.name) ? counted.at(p.name) : 0, p.numel) << p.name << " rank " << rank;
    // Layer-wise: one child over the world, with both TP groups.
    ASSERT_EQ(r.manifests.ranks[rank].optimizers.size(), 1u);
    const manifest::OptimizerRecord& o = r.manifests.ranks[rank].optimizers[0];
    EXPECT_EQ(r.manifests.group(o.stats_group), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(o.tp_group, r.manifests.ranks[rank].groups.at("tp"));
    EXPECT_EQ(o.expert_tp_group, r.manifests.ranks[rank].groups.at("expt_tp"));
    EXPECT_EQ(*r.manifests.ranks[rank].reported.norm, 4.0);
  }
}

TEST(ModelManifests, FoundingFaultFallsBackToTheDenseTpGroupAndDropsEpRankOnesBias) {
  const Ran r = run(founding_case(2, true));
  const std::string bias = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.bias";
  for (int rank = 0; rank < 2; ++rank) {
    const manifest::OptimizerRecord& o = r.manifests.ranks[rank].optimizers[0];
    EXPECT_FALSE(o.expert_tp_group.has_value());
    ASSERT_TRUE(o.tp_group.has_value());
    EXPECT_EQ(r.manifests.group(*o.tp_group), (std::vector<int>{0, 1}));
    EXPECT_EQ(ledger(r.manifests, rank)[bias], 0);
    EXPECT_EQ(*r.manifests.ranks[rank].reported.norm, std::sqrt(8.0));
    ASSERT_TRUE(o.clip.has_value());
    EXPECT_EQ(o.clip->max_norm, 1.0);
  }
  // Rank 1 (EP rank 1, dense TP rank 1) holds the bias and its filter dropped it.
  const manifest::RankManifest& m = r.manifests.ranks[1];
  bool seen = false;
  for (const manifest::MainParam& piece : m.optimizers[0].main_params) {
    if (m.params[piece.param].logical_name != bias) continue;
    seen = true;
    EXPECT_FALSE(piece.kept);
    EXPECT_FALSE(piece.kept_zeros);
    EXPECT_FALSE(piece.attributes.allreduce);
    EXPECT_EQ(piece.stats.sum_squares, 8.0);
  }
  EXPECT_TRUE(seen);
}

TEST(ModelManifests, ClassesOutsideTheMaskHaveZeroGradients) {
  const Ran r = run(founding_case(2, false));
  for (const manifest::RankManifest& m : r.manifests.ranks)
    for (const manifest::ModelParam& p : m.params) {
      const bool bias = p.logical_name.find("experts") != std::string::npos &&
                        p.logical_name.find("linear_fc2.bias") != std::string::npos;
      EXPECT_EQ(p.stats.sum_squares, bias ? static_cast<double>(volume(p.extents)) : 0.0) << p.name;
      EXPECT_EQ(p.stats.zeros, bias ? 0 : volume(p.extents)) << p.name;
    }
}

TEST(ModelManifests, EveryFaultCaseIsStructurallySound) {
  for (const testing::FaultCase& f : testing::fault_cases()) {
    for (bool with_fault : {false, true}) {
      SCOPED_TRACE(std::string(vocab::fault_info(f.fault).name) + (with_fault ? "" : " (off)"));
      const casefile::Case c = case_of(f, with_fault);
      const Ran r = run(c);
      if (!r.run.record) {
        EXPECT_EQ(f.fault, Fault::empty_rank_skips_collective);  // the hang: no manifests
        EXPECT_TRUE(with_fault);
        continue;
      }
      expect_structure(r);
    }
  }
}

TEST(ModelManifests, ExpertNormDroppedKeepsTheExpertPiecesOnlyInTheZeroCount) {
  for (const testing::FaultCase& f : testing::fault_cases()) {
    if (f.fault != Fault::expert_norm_dropped) continue;
    const Ran r = run(case_of(f, true));
    const topologies::LogicalModel model(r.c.model, r.c.topology);
    const gradnorm::OptimizerPlan plan = gradnorm::plan_optimizer(r.c.path.optimizer, model, r.c.path.faults);
    int expert_pieces = 0;
    for (const manifest::RankManifest& m : r.manifests.ranks)
      for (std::size_t c = 0; c < m.optimizers.size(); ++c)
        for (const manifest::MainParam& piece : m.optimizers[c].main_params) {
          EXPECT_TRUE(piece.kept_zeros);
          EXPECT_EQ(piece.kept, !plan.children[c].expert);
          expert_pieces += plan.children[c].expert;
        }
    EXPECT_GT(expert_pieces, 0);
  }
}

TEST(ModelManifests, DistributedOptimizerPiecesPartitionEachBoxOverDataParallelRanks) {
  casefile::Case c;
  c.topology = testing::config_of(4, 1, 1, 1, 1);
  c.model = testing::dense_model(1);
  c.path = testing::ones(vocab::OptimizerModel::distributed);
  c.path.bucket_elements = 64;
  const Ran r = run(c);
  expect_structure(r);
  const topologies::LogicalModel model(c.model, c.topology);
  for (int rank = 0; rank < 4; ++rank) {
    const std::map<std::string, std::int64_t> counted = ledger(r.manifests, rank);
    for (const topologies::LogicalParam& p : model.params())
      EXPECT_EQ(counted.count(p.name) ? counted.at(p.name) : 0, p.numel) << p.name;
  }
  // Some param is split between ranks (a range smaller than its box).
  bool split = false;
  for (const manifest::RankManifest& m : r.manifests.ranks)
    for (const manifest::MainParam& piece : m.optimizers[0].main_params)
      split = split || piece.end - piece.begin < volume(m.params[piece.param].extents);
  EXPECT_TRUE(split);
}

TEST(ModelManifests, TiedCopyNamesTheEmbeddingAndIsSharedOnTheModel) {
  for (bool with_fault : {false, true}) {
    casefile::Case c;
    c.topology = testing::config_of(2, 1, 2, 1, 1);
    c.model = testing::dense_model(2);
    c.path = testing::ones(vocab::OptimizerModel::plain);
    if (with_fault) c.path.faults = vocab::FaultSet::of({Fault::tied_copy_not_shared});
    const Ran r = run(c);
    const manifest::RankManifest& last = r.manifests.ranks[1];
    const manifest::ModelParam& copy = last.params.list().back();
    EXPECT_EQ(copy.name, "output_layer.weight");
    EXPECT_EQ(copy.logical_name, "embedding.word_embeddings.weight");
    EXPECT_TRUE(copy.attributes.shared);
    const manifest::MainParam& piece = last.optimizers[0].main_params.back();
    EXPECT_EQ(piece.param, static_cast<int>(last.params.size()) - 1);
    EXPECT_EQ(piece.attributes.shared, !with_fault);
    EXPECT_EQ(piece.kept, with_fault);
  }
}

TEST(ModelManifests, SeedsGiveSoundManifests) {
  for (const char* name : {"founding-6099-world8.fail.json", "missing-ep-reduction.fail.json",
                           "distopt-overlapping-shards.fail.json", "stats-over-replicas.fail.json"}) {
    SCOPED_TRACE(name);
    expect_structure(run(casefile::load_case_file(std::string(TALLY_SOURCE_DIR) + "/seeds/" + name, run::case_frameworks())));
  }
}

TEST(ModelManifests, ARecordWithoutEveryRankIsRefused) {
  const casefile::Case c = founding_case(2, false);
  CaseRun ran = run_case_with_record(c);
  ran.record->ranks.pop_back();
  EXPECT_THROW(model_manifests(c, *ran.record), std::invalid_argument);
}

TEST(ModelManifests, GroupNamesAreMegatronsAndPlainWords) {
  for (topologies::Family family : topologies::kAllFamilies) {
    const std::string_view name = group_name(family);
    EXPECT_FALSE(name.empty());
    for (char ch : name) EXPECT_TRUE((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_') << name;
  }
  EXPECT_EQ(group_name(topologies::Family::tp_pp), "mp");
  EXPECT_EQ(group_name(topologies::Family::expt_ep), "ep");
  EXPECT_EQ(group_name(topologies::Family::expt_tp_ep_pp), "tp_ep_pp");
}

}  // namespace
}  // namespace tally::run
