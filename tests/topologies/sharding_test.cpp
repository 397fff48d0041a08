#include "topologies/sharding.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <set>

#include "tests/support/model_gen.h"
#include "topologies/enumerate.h"
#include "tests/support/configs.h"

namespace tally::topologies {
namespace {

// Calls visit(flat index) for every element of `slice` of a tensor of `shape`.
template <typename Visit>
void for_each_element(const Shape& shape, const Slice& slice, Visit visit) {
  std::array<std::int64_t, kMaxDims> at{};
  for (int d = 0; d < slice.rank; ++d) at[d] = slice.offset[d];
  if (slice.numel() == 0) return;
  while (true) {
    std::int64_t flat = 0;
    for (int d = 0; d < shape.rank; ++d) flat = flat * shape.dims[d] + at[d];
    visit(flat);
    int d = slice.rank - 1;
    for (; d >= 0; --d) {
      if (++at[d] < slice.offset[d] + slice.extent[d]) break;
      at[d] = slice.offset[d];
    }
    if (d < 0) return;
  }
}

// Per logical param and element: how many ranks of each replica hold it, and how many ranks
// of each replica Megatron-LM's duplicate filter counts it on. Replicas are the DP x CP copies
// (dense) or the EDP copies (experts).
struct Ledger {
  std::vector<std::vector<int>> held, counted;  // [param][replica * numel + element]
  std::vector<std::vector<int>> counted_total;  // [param][element], over all replicas
  std::vector<int> shared_copies;               // [param]: shared copies seen on any rank
};

Ledger tally_all_ranks(const LogicalModel& model, const RankLayout& layout) {
  const int dense_replicas = layout.dp() * layout.config().cp;
  const int expert_replicas = layout.edp();
  Ledger ledger;
  for (const LogicalParam& p : model.params()) {
    const int replicas = is_expert_class(p.param_class) ? expert_replicas : dense_replicas;
    ledger.held.emplace_back(static_cast<std::size_t>(replicas * p.numel), 0);
    ledger.counted.emplace_back(static_cast<std::size_t>(replicas * p.numel), 0);
    ledger.counted_total.emplace_back(static_cast<std::size_t>(p.numel), 0);
  }
  ledger.shared_copies.assign(model.size(), 0);
  std::vector<LocalParam> locals;
  for (int rank = 0; rank < layout.world(); ++rank) {
    local_params(model, layout, rank, locals);
    const Coordinates at = layout.coordinates(rank);
    for (const LocalParam& local : locals) {
      const LogicalParam& p = model.param(local.logical_id);
      if (local.shared) {
        ++ledger.shared_copies[p.id];
        continue;
      }
      const int replica = is_expert_class(p.param_class) ? at.edp : at.cp * layout.dp() + at.dp;
      // Megatron-LM's filter: the TP duplicate test, then (0.19) the GTP duplicate test.
      const bool counted = (local.tensor_model_parallel ||
                            layout.index_in(replication_family(local), rank) == 0) &&
                           (local.gtp_weight_remat ||
                            layout.index_in(gtp_replication_family(local), rank) == 0);
      for_each_element(p.shape, local.slice, [&](std::int64_t e) {
        ++ledger.held[p.id][replica * p.numel + e];
        if (counted) {
          ++ledger.counted[p.id][replica * p.numel + e];
          ++ledger.counted_total[p.id][e];
        }
      });
    }
  }
  return ledger;
}

// The union over all ranks of each logical param's shards covers every element exactly once
// per replica (tp or etp times for params replicated over TP or ETP), and Megatron-LM's
// duplicate filter, fed the attributes the sharding sets, counts it once per replica.
void check_exact_cover(const ParallelConfig& config, const ModelSpec& spec) {
  const LogicalModel model(spec, config);
  const RankLayout layout(config);
  const Ledger ledger = tally_all_ranks(model, layout);
  const bool expert_pgs = expert_topology(model.placement());
  bool gtp_groups_match = true;
  for (int rank = 0; rank < config.world; ++rank) {
    const std::span<const int> a = layout.group_ranks(Family::gtp, rank);
    const std::span<const int> b = layout.group_ranks(Family::expt_gtp, rank);
    gtp_groups_match = gtp_groups_match && std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  for (const LogicalParam& p : model.params()) {
    const bool expert = is_expert_class(p.param_class);
    // Replicated over TP (ETP) unless split over it, and over GTP (EGTP) unless split over it.
    const int copies = (partition_dim(p.param_class) >= 0 ? 1 : expert ? config.etp : config.tp) *
                       (gtp_sharded(p.param_class) ? 1 : expert ? config.egtp : config.gtp);
    for (std::size_t i = 0; i < ledger.held[p.id].size(); ++i)
      RC_ASSERT(ledger.held[p.id][i] == copies);
    // With EP 1, ETP == TP and EGTP == GTP experts are filtered as dense params; the dense TP
    // rank then picks the copy, so only the total over replicas is fixed. Where the expert GTP
    // groups are not the GTP groups (Megatron's own corner, order-dependent) not even that.
    const bool dense_gtp_picks = !expert || expert_pgs || gtp_groups_match;
    if (!expert || expert_pgs || (partition_dim(p.param_class) >= 0 && gtp_groups_match))
      for (int c : ledger.counted[p.id]) RC_ASSERT(c == 1);
    const int replicas = expert ? layout.edp() : layout.dp() * config.cp;
    if (dense_gtp_picks)
      for (int c : ledger.counted_total[p.id]) RC_ASSERT(c == replicas);
    // Shared copies: one per last-stage rank, of the word embedding only, when pp > 1 (none on
    // a rank whose GTP shard of it is padding only).
    const bool copied = p.id == model.last_stage_copy_of();
    int holders = 0;
    for (int rank = 0; copied && rank < config.world; ++rank) {
      const Coordinates at = layout.coordinates(rank);
      const bool padding_only =
          config.gtp > 1 && gtp_rows(p.shape[0] / config.tp, at.gtp, config.gtp).count == 0;
      holders += at.pp == config.pp - 1 && !padding_only;
    }
    RC_ASSERT(ledger.shared_copies[p.id] == holders);
  }
  RC_ASSERT((model.last_stage_copy() != SharedCopy::none) ==
            (config.pp > 1 && (model.tied_embedding() >= 0 ||
                               (spec.kind == ModelKind::gpt && spec.mtp_num_layers > 0))));
}

RC_GTEST_PROP(Sharding, EveryElementOncePerReplica, ()) {
  const auto [config, spec] = *testing::valid_case(4);
  RC_TAG(config.world > 8, spec.kind == ModelKind::gpt, spec.num_experts > 0);
  check_exact_cover(config, spec);
}

RC_GTEST_PROP(Sharding, ShardsAreContiguousBlocksOfTheRightCoordinate, ()) {
  const auto [config, spec] = *testing::valid_case(3);
  const LogicalModel model(spec, config);
  const RankLayout layout(config);
  const int rank = *rc::gen::inRange(0, config.world);
  const Coordinates at = layout.coordinates(rank);
  const int per_rank = spec.num_experts / config.ep;
  for (const LocalParam& local : local_params(model, layout, rank)) {
    const LogicalParam& p = model.param(local.logical_id);
    const bool expert = is_expert_class(p.param_class);
    RC_ASSERT((local.shared ? at.pp == config.pp - 1 : p.stage == at.pp));
    RC_ASSERT(local.vpp_chunk == (local.shared ? config.vpp - 1 : p.chunk));
    const int dim = local.partition_dim;
    const int index = expert ? at.etp : at.tp;
    const int parts = expert ? config.etp : config.tp;
    const int gtp_index = expert ? at.egtp : at.gtp;
    const int gtp_parts = expert ? config.egtp : config.gtp;
    RC_ASSERT(local.gtp_weight_remat == (gtp_parts > 1 && gtp_sharded(p.param_class)));
    for (int d = 0; d < p.shape.rank; ++d) {
      std::int64_t offset = 0, extent = p.shape[d];
      if (d == dim) {
        RC_ASSERT(p.shape[d] % parts == 0);
        extent = p.shape[d] / parts;
        offset = index * extent;
      }
      if (d == 0 && local.gtp_weight_remat) {
        // GTP rank g of G: rows [g * b, (g + 1) * b) of the TP shard's rows padded to a multiple
        // of 16 * G (b = padded / G), the padding cut off.
        const std::int64_t block = (extent + 16 * gtp_parts - 1) / (16 * gtp_parts) * 16;
        const std::int64_t begin = std::min(extent, gtp_index * block);
        offset += begin;
        extent = std::min(extent - begin, block);
      }
      RC_ASSERT(local.slice.offset[d] == offset);
      RC_ASSERT(local.slice.extent[d] == extent);
    }
    // Experts live on EP rank expert / (E / ep), numbered from 0 there.
    if (expert) {
      RC_ASSERT(p.expert / per_rank == at.ep);
      RC_ASSERT(local.local_expert == p.expert - at.ep * per_rank);
    } else {
      RC_ASSERT(local.local_expert == -1);
    }
    RC_ASSERT(local.grad_norm_group == (local.shared ? GradNormGroup::main : p.grad_norm_group));
  }
}

// The attributes Megatron-LM sets, class by class.
RC_GTEST_PROP(Sharding, AttributesFollowTheClassTable, ()) {
  const auto [config, spec] = *testing::valid_case(3);
  const LogicalModel model(spec, config);
  const RankLayout layout(config);
  const bool expert_pgs = config.ep > 1 || config.etp != config.tp || config.egtp != config.gtp;
  for (const LocalParam& local : local_params(model, layout, *rc::gen::inRange(0, config.world))) {
    if (local.shared) {
      RC_ASSERT(local.tensor_model_parallel);
      RC_ASSERT(local.partition_dim == 0);
      RC_ASSERT(local.allreduce);
      RC_ASSERT(replication_family(local) == Family::tp);
      continue;
    }
    const ParamClass c = model.param(local.logical_id).param_class;
    const bool sharded = c != ParamClass::replicated && c != ParamClass::expert_row_bias;
    RC_ASSERT(local.tensor_model_parallel == sharded);
    RC_ASSERT(local.partition_dim ==
              (sharded ? (c == ParamClass::row || c == ParamClass::expert_row ? 1 : 0) : -1));
    RC_ASSERT(local.allreduce == !(is_expert_class(c) && expert_pgs));
    RC_ASSERT(replication_family(local) == (local.allreduce ? Family::tp : Family::expt_tp));
    RC_ASSERT(gtp_replication_family(local) == (local.allreduce ? Family::gtp : Family::expt_gtp));
  }
}

// megatron-core 0.19's padding: a TP shard's rows are padded to a multiple of 16 * G and split
// in equal blocks, so the last GTP ranks hold fewer real rows, or none; the blocks cover every
// row once.
TEST(Sharding, GtpRowsPadToSixteenTimesTheGroupAndCoverEveryRowOnce) {
  EXPECT_EQ(gtp_rows(64, 0, 2).begin, 0);
  EXPECT_EQ(gtp_rows(64, 1, 2).begin, 32);
  EXPECT_EQ(gtp_rows(64, 1, 2).count, 32);
  EXPECT_EQ(gtp_rows(48, 0, 2).count, 32);  // padded to 64: 32 rows each
  EXPECT_EQ(gtp_rows(48, 1, 2).count, 16);
  EXPECT_EQ(gtp_rows(8, 0, 2).count, 8);  // padded to 32: rank 1 holds only padding
  EXPECT_EQ(gtp_rows(8, 1, 2).count, 0);
  for (std::int64_t rows : {1, 7, 16, 33, 96, 100})
    for (int size : {1, 2, 3, 4}) {
      std::int64_t next = 0;
      for (int g = 0; g < size; ++g) {
        const GtpRows r = gtp_rows(rows, g, size);
        EXPECT_EQ(r.begin, next) << rows << " rows, rank " << g << " of " << size;
        next = r.begin + r.count;
      }
      EXPECT_EQ(next, rows);
    }
}

TEST(Sharding, SingleRankHoldsEveryTensorWhole) {
  ModelSpec spec;
  spec.num_experts = 4;
  spec.mtp_num_layers = 1;
  spec.moe_layer_freq = 2;
  const LogicalModel model(spec);
  const RankLayout layout(testing::config(1, 1, 1, 1, 1, 1));
  const std::vector<LocalParam> locals = local_params(model, layout, 0);
  ASSERT_EQ(static_cast<int>(locals.size()), model.size());  // tied, pp 1: no copy
  for (int i = 0; i < model.size(); ++i) {
    const LogicalParam& p = model.param(i);
    EXPECT_EQ(locals[i].logical_id, i);
    EXPECT_EQ(locals[i].slice.numel(), p.numel) << p.name;
    EXPECT_FALSE(locals[i].shared);
    EXPECT_TRUE(locals[i].allreduce) << p.name;  // ep 1, etp == tp: experts are dense
    EXPECT_EQ(local_name(model, locals[i]), p.name);
  }
}

RC_GTEST_PROP(Sharding, TrivialParallelismKeepsEveryTensorWhole, ()) {
  // tp = ep = pp = 1 (cp and dp free): every shard is the whole tensor.
  const int cp = *rc::gen::inRange(1, 3), dp = *rc::gen::inRange(1, 3);
  const ParallelConfig config = testing::config(cp * dp, 1, cp, 1, 1, 1);
  const ModelSpec spec = *testing::model_spec_for(config);
  const LogicalModel model(spec, config);
  const RankLayout layout(config);
  for (int rank = 0; rank < config.world; ++rank) {
    const std::vector<LocalParam> locals = local_params(model, layout, rank);
    RC_ASSERT(static_cast<int>(locals.size()) == model.size());
    for (const LocalParam& local : locals)
      RC_ASSERT(local.slice.numel() == model.param(local.logical_id).numel);
  }
}

// Tied embeddings: pp 1 holds one parameter, counted once; pp > 1 adds a shared copy of the
// first stage's shard on every last-stage rank.
TEST(Sharding, TiedEmbeddingWithOneStageIsOneParameter) {
  const ParallelConfig config = testing::config(2, 2, 1, 1, 1, 2);
  const LogicalModel model(ModelSpec{}, config);
  EXPECT_EQ(model.last_stage_copy(), SharedCopy::none);
  EXPECT_EQ(model.tied_embedding(), 0);
  const RankLayout layout(config);
  for (int rank = 0; rank < 2; ++rank)
    for (const LocalParam& local : local_params(model, layout, rank)) {
      EXPECT_FALSE(local.shared);
      EXPECT_NE(local_name(model, local), "output_layer.weight");
    }
}

TEST(Sharding, TiedEmbeddingWithStagesHasASharedCopyOnTheLastStage) {
  const ParallelConfig config = testing::config(8, 2, 1, 4, 1, 2);
  ModelSpec spec;
  spec.num_layers = 4;
  const LogicalModel model(spec, config);
  ASSERT_EQ(model.last_stage_copy(), SharedCopy::output_layer);
  const RankLayout layout(config);
  for (int rank = 0; rank < config.world; ++rank) {
    const Coordinates at = layout.coordinates(rank);
    const std::vector<LocalParam> locals = local_params(model, layout, rank);
    int copies = 0;
    for (const LocalParam& local : locals) {
      if (!local.shared) continue;
      ++copies;
      EXPECT_EQ(local.copy, SharedCopy::output_layer);
      EXPECT_EQ(local.logical_id, 0);
      EXPECT_EQ(local_name(model, local), "output_layer.weight");
      EXPECT_EQ(local.slice.offset[0], at.tp * 32);
      EXPECT_EQ(local.slice.extent[0], 32);
      EXPECT_EQ(local.slice.extent[1], 16);
      EXPECT_EQ(&local, &locals.back());  // the output layer comes last
    }
    EXPECT_EQ(copies, at.pp == 3 ? 1 : 0) << "rank " << rank;
  }
}

TEST(Sharding, UntiedOutputLayerIsItsOwnParameter) {
  const ParallelConfig config = testing::config(4, 2, 1, 2, 1, 2);
  ModelSpec spec;
  spec.untie_embeddings_and_output_weights = true;
  const LogicalModel model(spec, config);
  EXPECT_EQ(model.last_stage_copy(), SharedCopy::none);
  EXPECT_EQ(model.tied_embedding(), -1);
  const LogicalParam& output = model.param(model.size() - 1);
  EXPECT_EQ(output.name, "output_layer.weight");
  EXPECT_EQ(output.param_class, ParamClass::column);
  EXPECT_EQ(output.stage, 1);
}

TEST(Sharding, MtpStageHoldsASharedEmbeddingCopy) {
  const ParallelConfig config = testing::config(2, 1, 1, 2, 1, 1, 2);
  ModelSpec spec;
  spec.num_layers = 4;
  spec.mtp_num_layers = 1;
  spec.mtp_detach_heads = true;
  const LogicalModel model(spec, config);
  ASSERT_EQ(model.last_stage_copy(), SharedCopy::mtp_embedding);
  const RankLayout layout(config);
  const std::vector<LocalParam> last = local_params(model, layout, 1);
  // The copy opens the last chunk, before that chunk's decoder layer.
  auto copy = std::find_if(last.begin(), last.end(), [](const LocalParam& p) { return p.shared; });
  ASSERT_NE(copy, last.end());
  EXPECT_EQ(local_name(model, *copy), "embedding.word_embeddings.weight");
  EXPECT_EQ(copy->vpp_chunk, 1);
  EXPECT_EQ(copy->grad_norm_group, GradNormGroup::main);
  EXPECT_EQ(model.param((copy + 1)->logical_id).name, "decoder.layers.3.input_layernorm.weight");
  for (const LocalParam& local : last) {
    if (model.param(local.logical_id).name.starts_with("mtp.")) {
      EXPECT_EQ(local.grad_norm_group, GradNormGroup::mtp);
    }
  }
}

// #6099's topology: TP 2, EP 2, ETP 1, two experts with biases. The expert FC2 bias is whole
// on every ETP rank, not tensor_model_parallel, allreduce false, deduplicated over ETP.
TEST(Sharding, ExpertFc2BiasIsReplicatedWithinEtp) {
  const ParallelConfig config = testing::config(8, 2, 1, 1, 2, 1);
  ModelSpec spec;
  spec.num_layers = 1;
  spec.hidden_size = 8;
  spec.num_attention_heads = 2;
  spec.num_experts = 2;
  const LogicalModel model(spec, config);
  const RankLayout layout(config);
  int bias_holders = 0;
  for (int rank = 0; rank < config.world; ++rank)
    for (const LocalParam& local : local_params(model, layout, rank)) {
      const LogicalParam& p = model.param(local.logical_id);
      if (p.param_class != ParamClass::expert_row_bias) continue;
      ++bias_holders;
      EXPECT_FALSE(local.tensor_model_parallel);
      EXPECT_EQ(local.partition_dim, -1);
      EXPECT_FALSE(local.allreduce);
      EXPECT_EQ(local.slice.numel(), 8);
      EXPECT_EQ(replication_family(local), Family::expt_tp);
      EXPECT_EQ(p.expert, layout.coordinates(rank).ep);
      EXPECT_EQ(local_name(model, local), "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.bias");
    }
  EXPECT_EQ(bias_holders, 8);  // one expert per rank
  // Selective-gradient invariant: sqrt(#logical FC2 biases x hidden) = sqrt(2 * 8).
  std::int64_t fc2_bias_elements = 0;
  for (const LogicalParam& p : model.params())
    if (p.param_class == ParamClass::expert_row_bias) fc2_bias_elements += p.numel;
  EXPECT_EQ(fc2_bias_elements, 16);
}

TEST(Sharding, ExpertsAreDenseWithoutExpertTopology) {
  // EP 1 and ETP == TP: Megatron-LM leaves allreduce true on expert params.
  const ParallelConfig config = testing::config(4, 2, 1, 1, 1, 2);
  ModelSpec spec;
  spec.num_experts = 2;
  spec.add_bias_linear = false;
  const LogicalModel model(spec, config);
  EXPECT_FALSE(expert_topology(model.placement()));
  for (const LocalParam& local : local_params(model, RankLayout(config), 1))
    EXPECT_TRUE(local.allreduce);
}

// Every order Megatron-LM accepts for world 16, TP 2, EP 4, ETP 1, PP 2: each rank holds
// exactly the experts of its EP coordinate.
TEST(Sharding, ExpertsOnTheirEpRankInEveryOrder) {
  ModelSpec spec;
  spec.num_layers = 2;
  spec.num_experts = 8;
  int orders = 0;
  for (const AxisOrder& order : full_orders()) {
    const ParallelConfig config = testing::config(16, 2, 1, 2, 4, 1, 1, order_string(order));
    if (check_config(config)) continue;
    ++orders;
    const LogicalModel model(spec, config);
    const RankLayout layout(config);
    for (int rank = 0; rank < config.world; ++rank) {
      const Coordinates at = layout.coordinates(rank);
      std::set<int> experts;
      for (const LocalParam& local : local_params(model, layout, rank)) {
        const int e = model.param(local.logical_id).expert;
        if (e >= 0) experts.insert(e);
      }
      EXPECT_EQ(experts, (std::set<int>{2 * at.ep, 2 * at.ep + 1})) << config.order << " rank " << rank;
    }
  }
  EXPECT_GT(orders, 10);
}

TEST(Sharding, RejectsALayoutOfOtherSizes) {
  const LogicalModel model(ModelSpec{}, testing::config(2, 2, 1, 1, 1, 2));
  EXPECT_THROW(local_params(model, RankLayout(testing::config(4, 4, 1, 1, 1, 4)), 0), std::invalid_argument);
  EXPECT_THROW(local_params(model, RankLayout(testing::config(2, 2, 1, 1, 1, 2)), 2), std::out_of_range);
}

// Later code shards worlds of 16,384 ranks with a 16-layer MoE model in well under 10 s.
}  // namespace
}  // namespace tally::topologies
