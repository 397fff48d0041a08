#include "fuzz/generators.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

#include "gradnorm/reduction.h"
#include "topologies/enumerate.h"
#include "topologies/rank_layout.h"
#include "topologies/logical_model.h"

namespace tally::fuzz {

namespace {

using topologies::ModelSpec;
using topologies::ParallelConfig;
using topologies::ParamClass;

// ---- Picks: an index that shrinks towards 0 (the simplest choice), or one that never shrinks.

// An index in [0, weights.size()) drawn with the given weights; shrinks to each smaller index.
rc::Gen<int> weighted_index(std::vector<int> weights) {
  return rc::Gen<int>([weights](const rc::Random& random, int) {
    std::uint64_t total = 0;
    for (int w : weights) total += static_cast<std::uint64_t>(w);
    std::uint64_t draw = rc::Random(random).next() % total;
    int index = 0;
    while (draw >= static_cast<std::uint64_t>(weights[index])) draw -= weights[index++];
    // Every smaller index, smallest first: the lists are short, and halving towards 0 would
    // skip some (from 3 it tries only 0 and 2).
    return rc::shrinkable::shrinkRecur(index, [](int x) { return rc::seq::range(0, x); });
  });
}

// An index in [0, n), uniform (a raw pick taken modulo a size); shrinks towards 0 by halving.
rc::Gen<int> uniform_index(int n) {
  return rc::Gen<int>([n](const rc::Random& random, int) {
    const int index = static_cast<int>(rc::Random(random).next() % static_cast<std::uint64_t>(n));
    return rc::shrinkable::shrinkRecur(index, [](int x) { return rc::shrink::towards(x, 0); });
  });
}

// An index in [0, n), uniform; never shrinks (a choice that shrinking must not change).
rc::Gen<int> fixed_index(int n) {
  return rc::Gen<int>([n](const rc::Random& random, int) {
    return rc::shrinkable::just(
        static_cast<int>(rc::Random(random).next() % static_cast<std::uint64_t>(n)));
  });
}

// A 64-bit value that never shrinks (a gradient seed: no value is simpler than another).
rc::Gen<std::uint64_t> fixed_u64() {
  return rc::Gen<std::uint64_t>([](const rc::Random& random, int) {
    return rc::shrinkable::just(static_cast<std::uint64_t>(rc::Random(random).next()));
  });
}

// True with probability percent/100; shrinks towards false.
bool flag(int percent) { return *weighted_index({100 - percent, percent}) == 1; }

// 1 + an index drawn with the weights: a multiplier that shrinks towards 1.
int multiplier(std::vector<int> weights) { return 1 + *weighted_index(std::move(weights)); }

// ---- Configurations.

// Axis sizes, ascending; an axis picks an index into this list.
constexpr int kSizes[] = {1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 256, 512, 1024};
constexpr int kSizeCount = static_cast<int>(std::size(kSizes));

// The largest listed size not above `picked` and `bound`.
int clamp_size(int picked_index, std::int64_t bound) {
  int value = 1;
  for (int i = 0; i <= picked_index && i < kSizeCount; ++i)
    if (kSizes[i] <= bound) value = kSizes[i];
  return value;
}

// The largest divisor of n not above `bound`.
int largest_divisor_at_most(int n, std::int64_t bound) {
  int best = 1;
  for (int d = 1; d <= n && d <= bound; ++d)
    if (n % d == 0) best = d;
  return best;
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The stride of `axis` in one grid (the product of the sizes before it in the grid's order).
std::int64_t axis_stride(const ParallelConfig& c, topologies::Axis axis, bool expert) {
  std::int64_t stride = 1;
  for (topologies::Axis at : topologies::grid_order(c, expert)) {
    if (at == axis) return stride;
    switch (at) {
      case topologies::Axis::cp: stride *= expert ? 1 : c.cp; break;
      case topologies::Axis::ep: stride *= expert ? c.ep : 1; break;
      case topologies::Axis::dp: stride *= expert ? topologies::edp(c) : topologies::dp(c); break;
      case topologies::Axis::pp: stride *= c.pp; break;
      case topologies::Axis::tp: stride *= expert ? c.etp : c.tp; break;
      case topologies::Axis::gtp: stride *= expert ? c.egtp : c.gtp; break;
    }
  }
  return stride;
}

// The world bound at a RapidCheck size: max_world^(size/100), at least 1.
std::int64_t world_bound(const TopologyGenOptions& o, int size) {
  if (!o.grow_with_size) return o.max_world;
  const double s = std::clamp(size, 0, 100) / 100.0;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(std::pow(o.max_world, s) + 1e-9)));
}

ParallelConfig pick_config(const TopologyGenOptions& o, int size) {
  static const std::vector<topologies::AxisOrder> orders = topologies::full_orders();
  const std::int64_t axis_bound = o.max_axis > 0 ? o.max_axis : o.max_world;
  std::int64_t budget = o.exact_world > 0 ? o.exact_world : world_bound(o, size);
  auto axis = [&](std::vector<int> weights) {
    const int value = clamp_size(*weighted_index(std::move(weights)), std::min(budget, axis_bound));
    budget /= value;
    return value;
  };
  ParallelConfig c;
  //               1   2  3   4  6   8 16 32 64 ...
  c.pp = axis({40, 30, 5, 14, 1, 6, 2, 1, 1});
  c.tp = axis({30, 30, 4, 16, 2, 10, 4, 2, 1, 1});
  c.cp = axis({60, 25, 3, 8, 1, 3});
  int dp = axis({25, 30, 6, 18, 2, 10, 5, 2, 1, 1, 1, 1, 1});
  if (o.exact_world > 0) {
    // The same picks, each moved to a divisor of what the world leaves: shrinking still leads
    // every axis toward 1, and dp takes the rest.
    const int w = o.exact_world;
    c.pp = largest_divisor_at_most(w, c.pp);
    c.tp = largest_divisor_at_most(w / c.pp, c.tp);
    c.cp = largest_divisor_at_most(w / (c.pp * c.tp), c.cp);
    dp = w / (c.pp * c.tp * c.cp);
  }
  c.world = c.tp * c.cp * c.pp * dp;
  const int expert_ranks = c.tp * c.cp * dp;  // etp * ep * edp

  // etp: the dense tp (Megatron-LM's default), 1, or another divisor of the expert ranks.
  const int etp_kind = *weighted_index({45, 35, 20});
  const int etp_other = *uniform_index(64);
  const std::vector<int> etp_choices = divisors(expert_ranks);
  c.etp = etp_kind == 0 ? c.tp : etp_kind == 1 ? 1 : etp_choices[etp_other % etp_choices.size()];
  const int ep_pick = *weighted_index({35, 35, 3, 15, 1, 8, 3, 1, 1});
  c.ep = largest_divisor_at_most(expert_ranks / c.etp, kSizes[ep_pick]);

  const int vpp_pick = multiplier({70, 25, 5});
  c.vpp = c.pp > 1 ? std::min(vpp_pick, std::max(1, o.max_vpp)) : 1;

  // Order: the default half of the time, else any of the 119 others; one Megatron-LM rejects
  // for these sizes (or a corner) gives way to the nearest valid one below it in the list, and
  // the default order (index 0) is valid for every configuration.
  std::vector<int> order_weights(orders.size(), 1);
  order_weights[0] = static_cast<int>(orders.size()) - 1;
  int order_index = *weighted_index(order_weights);
  for (;; --order_index) {
    c.order = topologies::order_string(orders[static_cast<std::size_t>(order_index)]);
    c.dist_opt_instances = 1;
    if (order_index == 0) break;
    if (topologies::check_config(c)) continue;
    if (o.avoid_megatron_corners && !megatron_layout_assumptions_hold(c)) continue;
    break;
  }

  // Several distributed-optimizer instances only in the default order.
  const std::vector<int> instance_choices =
      divisors(std::gcd(dp * c.cp, topologies::edp(c)));
  std::vector<int> instance_weights(instance_choices.size(), 10);
  instance_weights[0] = 70;
  const int instance_index = *weighted_index(instance_weights);
  if (order_index == 0) c.dist_opt_instances = instance_choices[static_cast<std::size_t>(instance_index)];

  // Generalized TP (megatron-core 0.19), picked last so the picks above keep their meaning: GTP
  // takes a divisor of the dense DP degree and EGTP one of the expert DP degree, so the world
  // stays. A choice Megatron-LM rejects (several instances, pp groups that differ) or a corner
  // gives way to no GTP, which is valid wherever the rest is.
  const int gtp_pick = *weighted_index({60, 28, 4, 8});
  const int egtp_pick = *weighted_index({50, 30, 5, 15});
  const int gtp_kind = *weighted_index({35, 65});  // egtp: gtp's pick, or its own
  const ParallelConfig without_gtp = c;
  c.gtp = largest_divisor_at_most(topologies::dp(c), kSizes[static_cast<std::size_t>(gtp_pick)]);
  c.egtp = largest_divisor_at_most(topologies::edp(c),
                                   kSizes[static_cast<std::size_t>(gtp_kind == 0 ? gtp_pick : egtp_pick)]);
  if (topologies::uses_gtp(c)) {
    c.dist_opt_instances = 1;
    if (topologies::check_config(c) || (o.avoid_megatron_corners && !megatron_layout_assumptions_hold(c)))
      c = without_gtp;
  }
  return c;
}

// ---- Models.

ModelSpec pick_gpt(const ParallelConfig& c) {
  ModelSpec s;
  s.kind = topologies::ModelKind::gpt;
  // Layers: per (stage, chunk), or uneven first/last stages (multiples of vpp).
  const int layers_per_chunk = multiplier({60, 30, 10});
  const bool uneven = flag(20);
  const int uneven_kind = *weighted_index({40, 30, 30});  // first and last, first, last
  const int first_mult = multiplier({70, 30});
  const int last_mult = multiplier({70, 30});
  if (c.pp > 1 && uneven) {
    const bool first = uneven_kind != 2;
    const bool last = uneven_kind != 1;
    const int middle_stages = c.pp - (first ? 1 : 0) - (last ? 1 : 0);
    if (first) s.first_stage_layers = c.vpp * first_mult;
    if (last) s.last_stage_layers = c.vpp * last_mult;
    s.num_layers = s.first_stage_layers.value_or(0) + s.last_stage_layers.value_or(0) +
                   middle_stages * c.vpp * layers_per_chunk;
  } else {
    s.num_layers = c.pp * c.vpp * layers_per_chunk;
  }

  // MoE: always with EP > 1, often otherwise (experts outside the expert topology too).
  const bool moe_pick = flag(60);
  const int experts_per_ep_rank = multiplier({50, 35, 15});
  const int moe_freq = multiplier({75, 25});
  const bool moe = c.ep > 1 || moe_pick;

  // Attention: query groups a multiple of tp, heads a multiple of the groups.
  const int groups = c.tp * multiplier({70, 30});
  const int heads = groups * multiplier({60, 40});
  const bool explicit_kv = flag(50);
  const int kv = multiplier({50, 30, 20});
  const int hidden_mult = multiplier({50, 30, 20});
  const int hidden_small = multiplier({20, 20, 20, 20, 10, 10});
  s.num_query_groups = groups;
  s.num_attention_heads = heads;
  if (explicit_kv) {
    s.kv_channels = kv;
    s.hidden_size = hidden_small;
  } else {
    s.hidden_size = heads * hidden_mult;
  }
  s.vocab_size = c.tp * multiplier({40, 30, 20, 10});
  s.max_position_embeddings = multiplier({40, 30, 30});
  s.ffn_hidden_size = c.tp * multiplier({50, 30, 20});
  const int moe_ffn = c.etp * multiplier({70, 30});

  // Features, each shrinking to "off" (fewer parameters).
  const bool bias = flag(60);
  const bool shared_expert = flag(25);
  const bool shared_gate = flag(50);
  const int shared_mult = multiplier({70, 30});
  const bool rms = flag(40);
  const bool qk = flag(30);
  const bool rope = flag(40);
  const bool sink = flag(30);
  const bool untie = flag(50);
  const bool swiglu = flag(30);
  const int mtp = *weighted_index({80, 15, 5});
  const bool detach = flag(50);
  // DeepSeek-V3's first dense layers, in Megatron-LM's list form of --moe-layer-freq.
  const int dense_first = *weighted_index({85, 10, 5});

  if (moe) {
    s.num_experts = c.ep * experts_per_ep_rank;
    s.moe_ffn_hidden_size = moe_ffn;
    s.moe_layer_freq = moe_freq;
    if (dense_first > 0 && s.num_layers > dense_first) {
      s.moe_layer_freq = 1;
      s.moe_layer_pattern.assign(static_cast<std::size_t>(s.num_layers), true);
      for (int layer = 0; layer < dense_first; ++layer) s.moe_layer_pattern[layer] = false;
    }
  }
  // Megatron-LM: expert biases only with ETP 1; shared experts never have biases.
  s.add_bias_linear = bias && !(moe && c.etp != 1);
  if (moe && !s.add_bias_linear && shared_expert) {
    s.moe_shared_expert_intermediate_size = c.tp * shared_mult;
    s.moe_shared_expert_gate = shared_gate;
  }
  s.normalization = rms ? topologies::Normalization::rms_norm : topologies::Normalization::layer_norm;
  s.qk_layernorm = qk;
  s.position_embedding =
      rope ? topologies::PositionEmbedding::rope : topologies::PositionEmbedding::learned_absolute;
  s.softmax_type = sink ? topologies::SoftmaxType::learnable : topologies::SoftmaxType::vanilla;
  s.untie_embeddings_and_output_weights = untie;
  s.swiglu = swiglu;
  s.mtp_num_layers = mtp;
  s.mtp_detach_heads = mtp > 0 && detach;
  // MTP's eh_proj is column-parallel with hidden_size rows.
  if (mtp > 0 && s.hidden_size % c.tp != 0) s.hidden_size *= c.tp;
  return s;
}

// One param of a custom layout, drawn before the configuration places it.
struct ParamDraw {
  int class_index = 0;
  std::vector<int> shape;  // 1..3 dims of 1..4
  int stage = 0, chunk = 0, expert = 0;  // raw: taken modulo pp, vpp, num_experts
  bool mtp = false;
};

// Classes in shrinking order: replicated first (the simplest: no split), experts last.
constexpr ParamClass kClassOrder[] = {
    ParamClass::replicated,    ParamClass::column,        ParamClass::row,
    ParamClass::column_bias,   ParamClass::vocab,         ParamClass::head_sharded,
    ParamClass::expert_row_bias, ParamClass::expert_column, ParamClass::expert_row,
    ParamClass::expert_column_bias};

rc::Gen<ParamDraw> gen_param_draw() {
  return rc::gen::exec([] {
    ParamDraw d;
    d.class_index = *weighted_index({20, 14, 12, 8, 6, 8, 12, 8, 6, 6});
    const int dims = multiplier({50, 40, 10});
    for (int i = 0; i < 3; ++i) {
      const int dim = multiplier({35, 30, 20, 15});
      if (i < dims) d.shape.push_back(dim);
    }
    d.stage = *uniform_index(64);
    d.chunk = *uniform_index(64);
    d.expert = *uniform_index(64);
    d.mtp = flag(12);
    return d;
  });
}

ModelSpec pick_custom(const ParallelConfig& c) {
  ModelSpec s;
  s.kind = topologies::ModelKind::custom;
  s.num_experts = c.ep * multiplier({60, 40});
  const int count = multiplier({25, 25, 20, 15, 10, 5});
  const std::vector<ParamDraw> draws =
      *rc::gen::container<std::vector<ParamDraw>>(static_cast<std::size_t>(count), gen_param_draw());
  const bool tied = flag(40);
  const int tied_rows = multiplier({50, 30, 20});
  const int tied_cols = multiplier({50, 30, 20});
  if (tied) {
    topologies::CustomParam p;
    p.name = "embedding";
    p.param_class = ParamClass::vocab;
    p.shape = {c.tp * tied_rows, tied_cols};
    p.tied = true;
    s.params.push_back(std::move(p));
  }
  for (std::size_t i = 0; i < draws.size(); ++i) {
    const ParamDraw& d = draws[i];
    topologies::CustomParam p;
    p.name = "p" + std::to_string(i);
    p.param_class = kClassOrder[d.class_index];
    const int dim = topologies::partition_dim(p.param_class);
    p.shape.assign(d.shape.begin(), d.shape.end());
    while (static_cast<int>(p.shape.size()) <= dim) p.shape.push_back(1);
    const bool expert = topologies::is_expert_class(p.param_class);
    if (dim >= 0) p.shape[static_cast<std::size_t>(dim)] *= expert ? c.etp : c.tp;
    p.stage = d.stage % c.pp;
    p.chunk = d.chunk % c.vpp;
    if (expert) p.expert = d.expert % s.num_experts;
    p.mtp = d.mtp;
    s.params.push_back(std::move(p));
  }
  // Without expert params and without EP, no experts at all.
  if (c.ep == 1 && std::none_of(s.params.begin(), s.params.end(), [](const topologies::CustomParam& p) {
        return topologies::is_expert_class(p.param_class);
      }))
    s.num_experts = 0;
  return s;
}

vocab::PathOptions pick_path_options() {
  using kernels::GradientMode;
  vocab::PathOptions o;
  constexpr vocab::OptimizerModel kOptimizers[] = {
      vocab::OptimizerModel::plain, vocab::OptimizerModel::distributed,
      vocab::OptimizerModel::layerwise, vocab::OptimizerModel::muon};
  o.optimizer = kOptimizers[*uniform_index(4)];
  constexpr GradientMode kModes[] = {GradientMode::ones,    GradientMode::dyadic,
                                     GradientMode::rank_encoded, GradientMode::zeros,
                                     GradientMode::uniform, GradientMode::normal,
                                     GradientMode::sparse};
  o.gradients.generator.mode = kModes[*weighted_index({20, 30, 15, 5, 10, 10, 10})];
  constexpr kernels::Dtype kDtypes[] = {kernels::Dtype::fp32, kernels::Dtype::bf16,
                                        kernels::Dtype::fp16};
  o.gradients.generator.dtype = kDtypes[*weighted_index({60, 20, 20})];
  o.gradients.generator.seed = *fixed_u64();
  o.accumulation = flag(20) ? kernels::Accumulation::fp32 : kernels::Accumulation::fp64;
  constexpr double kMaxNorms[] = {1.0, 0.0, 1e6, 0.5, 1e-3};
  o.max_norm = kMaxNorms[*weighted_index({40, 20, 15, 15, 10})];
  const bool buckets = flag(40);
  const int bucket = multiplier({10, 10, 10, 10, 10, 10, 10, 10, 5, 5, 5, 5});
  o.bucket_elements = buckets ? bucket : 0;
  const int p_kind = *weighted_index({70, 10, 10, 10});
  if (p_kind == 1) o.p_values = {1.0};
  if (p_kind == 2) o.p_values = {3.0};
  if (p_kind == 3) o.p_values = {1.0, 3.0};
  const bool selective = flag(10);
  const int selected = *uniform_index(topologies::kParamClassCount);
  if (selective) o.gradients.class_mask = vocab::class_bit(kClassOrder[selected]);
  return o;
}

}  // namespace

bool experts_as_dense_with_other_groups(const ParallelConfig& c) {
  if (c.ep > 1 || c.etp != c.tp || c.egtp != c.gtp) return false;
  // Both families split ranks into runs {base + i * stride} of one size: equal iff the strides are.
  using topologies::Axis;
  return (c.tp > 1 && axis_stride(c, Axis::tp, false) != axis_stride(c, Axis::tp, true)) ||
         (c.gtp > 1 && axis_stride(c, Axis::gtp, false) != axis_stride(c, Axis::gtp, true));
}

bool instances_split_their_shards(const ParallelConfig& c) {
  if (c.dist_opt_instances <= 1) return false;
  const topologies::RankLayout layout(c);
  using topologies::Family;
  for (int rank = 0; rank < c.world; ++rank) {
    const std::span<const int> instance = layout.group_ranks(Family::dist_opt, rank);
    for (Family family : {Family::dp_cp, Family::expt_dp}) {
      const std::span<const int> group = layout.group_ranks(family, rank);
      const int size = static_cast<int>(group.size()) / c.dist_opt_instances;
      const int first = layout.index_in(family, rank) / size * size;
      // The members of the rank's group in its instance must be exactly its slice.
      int in_instance = 0;
      for (int member : group)
        if (std::find(instance.begin(), instance.end(), member) != instance.end()) ++in_instance;
      if (in_instance != size) return true;
      for (int k = first; k < first + size; ++k)
        if (std::find(instance.begin(), instance.end(), group[static_cast<std::size_t>(k)]) == instance.end()) return true;
    }
  }
  return false;
}

LayoutCorner megatron_layout_corner(const ParallelConfig& c) {
  if (experts_as_dense_with_other_groups(c)) return LayoutCorner::experts_as_dense;
  if (instances_split_their_shards(c)) return LayoutCorner::instances_split_their_shards;
  return LayoutCorner::none;
}

std::string_view layout_corner_name(LayoutCorner corner) {
  switch (corner) {
    case LayoutCorner::experts_as_dense: return "experts as dense with ETP groups unlike TP groups";
    case LayoutCorner::instances_split_their_shards: return "distributed-optimizer instances whose stats groups split their shards";
    case LayoutCorner::none: break;
  }
  return "none";
}

bool megatron_layout_assumptions_hold(const ParallelConfig& c) {
  if (c.dist_opt_instances > 1 && c.order != topologies::kDefaultOrder) return false;
  return !experts_as_dense_with_other_groups(c);
}

rc::Gen<ParallelConfig> gen_config(const TopologyGenOptions& options) {
  // The size is read through a Gen so it is the one this generation runs at.
  return rc::Gen<ParallelConfig>([options](const rc::Random& random, int size) {
    return rc::gen::exec([options, size] { return pick_config(options, size); })(random, size);
  });
}

rc::Gen<ModelSpec> gen_gpt_model(const ParallelConfig& config) {
  return rc::gen::exec([config] { return pick_gpt(config); });
}

rc::Gen<ModelSpec> gen_custom_model(const ParallelConfig& config) {
  return rc::gen::exec([config] { return pick_custom(config); });
}

rc::Gen<ModelSpec> gen_model(const ParallelConfig& config) {
  return rc::gen::exec([config] {
    // Index 0 (the shrink target) is the GPT family: the layouts users recognise.
    // One pick either way, so the picks after it keep their random streams.
    const bool custom = *weighted_index({60, 40}) == 1;
    return custom ? *gen_custom_model(config) : *gen_gpt_model(config);
  });
}

rc::Gen<vocab::PathOptions> gen_path_options() {
  return rc::gen::exec([] { return pick_path_options(); });
}

namespace {

// A configuration drawn with `topology` and one of `presets` laid out on it. A preset's sizes follow
// the configuration, so few configurations lack its model (Megatron-LM's expert-bias rule, say);
// those are drawn again.
std::pair<ParallelConfig, ModelSpec> pick_preset_case(const TopologyGenOptions& topology,
                                                      const std::vector<topologies::Preset>& presets) {
  std::string last_why;
  for (int attempt = 0; attempt < kPresetDraws; ++attempt) {
    const ParallelConfig config = *gen_config(topology);
    const topologies::Preset preset = presets[static_cast<std::size_t>(*fixed_index(static_cast<int>(presets.size())))];
    topologies::PresetModel laid_out = topologies::preset_model(preset, config);
    if (laid_out.model) return {config, std::move(*laid_out.model)};
    last_why = std::move(laid_out.why_none);
  }
  throw rc::GenerationFailure("no configuration of " + std::to_string(kPresetDraws) +
                              " drawn in a row lays out a preset asked for; the last said: " + last_why);
}

rc::Gen<casefile::Case> gen_any_case(const CaseGenOptions& options) {
  return rc::Gen<casefile::Case>([options](const rc::Random& random, int size) {
    return rc::gen::exec([options] {
      casefile::Case c;
      const int fault_index =
          options.faults.empty() ? 0 : *fixed_index(static_cast<int>(options.faults.size()));
      const bool zero_count_fault =
          !options.faults.empty() &&
          options.faults[static_cast<std::size_t>(fault_index)] == vocab::Fault::zero_count_in_float32;
      const int one_in = std::max(0, zero_count_fault ? options.big_zeros_one_in_for_its_fault
                                                      : options.big_zeros_one_in);
      const bool big_zeros =
          one_in > 0 && *weighted_index({one_in - 1, 1}) == 1 && !options.gpt_only && options.presets.empty();
      TopologyGenOptions topology = options.topology;
      if (big_zeros && topology.exact_world == 0) topology.max_world = std::min(topology.max_world, 4);
      if (!options.presets.empty()) {
        std::tie(c.topology, c.model) = pick_preset_case(topology, options.presets);
      } else if (big_zeros) {
        c.topology = *gen_config(topology);
        c.model = *gen_custom_model(c.topology);
        topologies::CustomParam big;
        big.name = "big";
        big.param_class = ParamClass::replicated;
        big.shape = {kBigZerosElements};
        c.model.params.insert(c.model.params.begin(), std::move(big));
      } else {
        c.topology = *gen_config(topology);
        c.model = *gen_model(c.topology);
        if (options.gpt_only && c.model.kind != topologies::ModelKind::gpt) c.model = *gen_gpt_model(c.topology);
      }
      c.path = *gen_path_options();
      if (big_zeros) c.path.gradients.generator.mode = kernels::GradientMode::zeros;
      if (!options.faults.empty()) {
        const vocab::Fault fault = options.faults[static_cast<std::size_t>(fault_index)];
        c.path.faults = vocab::FaultSet::of({fault});
        // A reduction fault changes nothing where the gradients enter after the reduction (which
        // the big-zeros param, dealt to every rank, would make slow: it is for the zero count).
        if (vocab::is_reduction_fault(fault) && !big_zeros && !gradnorm::reduction_refusal(c.topology))
          c.path.gradients.before_reduction = true;
      }
      // Now and then a report's own numbers for one class the model has, so the stated values'
      // CPU route through the path, the truth and the clip are fuzzed too (picked last: the
      // picks above keep their streams; none is the shrink target).
      if (!big_zeros && *weighted_index({90, 10}) == 1) {
        const topologies::LogicalModel model(c.model, c.topology);
        vocab::StatedFor s;
        s.param_class = model.param(*uniform_index(std::max(1, model.size()))).param_class;
        constexpr double kConstants[] = {3.0, 0.1, -0.5, 4.0, 1e-3};
        constexpr double kScales[] = {2.0, -0.25, 1e3};
        if (*weighted_index({60, 40}) == 0) {
          s.gradient = {topologies::StatedGradient::Kind::constant, kConstants[*uniform_index(5)], {}};
        } else {
          s.gradient = {topologies::StatedGradient::Kind::scale, kScales[*uniform_index(3)], {}};
        }
        c.path.gradients.stated.push_back(std::move(s));
      }
      return options.restrict_to ? options.restrict_to(std::move(c)) : c;
    })(random, size);
  });
}

}  // namespace

rc::Gen<casefile::Case> gen_case(const CaseGenOptions& options) {
  if (!options.keep_only) return gen_any_case(options);
  // As rc::gen::suchThat, with room for a code drawn rarely (one Megatron-FSDP strategy is one
  // case in 20, hybrid FSDP one in hundreds): suchThat gives up after 100 draws.
  return rc::Gen<casefile::Case>([any = gen_any_case(options), keep = options.keep_only](const rc::Random& random,
                                                                                            int size) {
    rc::Random r = random;
    for (int attempt = 0; attempt < kKeepOnlyDraws; ++attempt) {
      if (rc::Maybe<rc::Shrinkable<casefile::Case>> kept = rc::shrinkable::filter(any(r.split(), size), keep))
        return std::move(*kept);
    }
    throw rc::GenerationFailure("no case kept in " + std::to_string(kKeepOnlyDraws) + " draws in a row");
  });
}

std::uint64_t case_seed(std::uint64_t campaign_seed, std::int64_t index) {
  auto mix64 = [](std::uint64_t z) {  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  return mix64(mix64(campaign_seed) ^ (static_cast<std::uint64_t>(index) * 0x9E3779B97F4A7C15ull));
}

int case_size_param(std::int64_t index) { return static_cast<int>(index % 101); }

rc::Shrinkable<casefile::Case> generate_case(const CaseGenOptions& options, std::uint64_t campaign_seed,
                                   std::int64_t index) {
  return gen_case(options)(rc::Random(case_seed(campaign_seed, index)), case_size_param(index));
}

CaseSize case_size(const casefile::Case& c) {
  CaseSize size;
  size.world = c.topology.world;
  size.layers = c.model.kind == topologies::ModelKind::gpt ? c.model.num_layers : 0;
  size.experts = c.model.num_experts;
  const topologies::LogicalModel model(c.model, c.topology);
  size.params = model.size();
  size.elements = model.total_elements();
  return size;
}

}  // namespace tally::fuzz
