#include "topologies/logical_model.h"

#include <algorithm>
#include <charconv>
#include <string_view>
#include <unordered_map>

#include "topologies/detail/model_params.h"

namespace tally::topologies {

namespace detail {

namespace {

constexpr std::int64_t kSaturated = kMaxElements + 1;

std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  std::int64_t out;
  return __builtin_add_overflow(a, b, &out) ? INT64_MAX : out;
}
std::int64_t sat_mul(std::int64_t a, std::int64_t b) {
  std::int64_t out;
  return __builtin_mul_overflow(a, b, &out) ? INT64_MAX : out;
}

Shape make_shape(std::initializer_list<std::int64_t> dims) {
  Shape shape;
  for (std::int64_t d : dims) shape.dims[shape.rank++] = d;
  return shape;
}

// Emits the GPT/MoE family in Megatron-core's registration order (local layer spec):
// GPTModel = embedding, decoder (layers, final_layernorm), mtp, output_layer.
class GptWalker {
 public:
  GptWalker(const ModelSpec& spec, const std::function<void(const ParamDraft&)>& visit)
      : s_(spec), visit_(visit) {}

  void walk() {
    const std::int64_t h = s_.hidden_size;
    draft_.anchor = Anchor::first_chunk;
    draft_.tied = !s_.untie_embeddings_and_output_weights;
    emit({"", "embedding.word_embeddings.weight"}, ParamClass::vocab, {s_.vocab_size, h});
    draft_.tied = false;
    if (s_.position_embedding == PositionEmbedding::learned_absolute)
      emit({"", "embedding.position_embeddings.weight"}, ParamClass::replicated,
           {s_.max_position_embeddings, h});

    draft_.anchor = Anchor::decoder_layer;
    for (int layer = 0; layer < s_.num_layers; ++layer) {
      draft_.layer = layer;
      transformer_layer("decoder.layers.{L}.", is_moe_layer(s_, layer));
    }
    draft_.layer = -1;
    draft_.anchor = Anchor::last_chunk;
    norm("decoder.", "final_layernorm.", h);

    draft_.mtp_group = s_.mtp_detach_heads;
    for (int m = 0; m < s_.mtp_num_layers; ++m) {
      const std::string prefix = "mtp.layers." + std::to_string(m) + ".";
      norm(prefix, "enorm.", h);
      norm(prefix, "hnorm.", h);
      emit({prefix, "eh_proj.weight"}, ParamClass::column, {h, 2 * h});
      transformer_layer(prefix + "transformer_layer.", s_.num_experts > 0);
      norm(prefix, "final_layernorm.", h);
    }
    draft_.mtp_group = false;

    if (s_.untie_embeddings_and_output_weights) {
      draft_.output_layer = true;
      emit({"", "output_layer.weight"}, ParamClass::column, {s_.vocab_size, h});
      draft_.output_layer = false;
    }
  }

 private:
  // The pattern is assigned into the draft's own string, whose capacity outlives each param: a
  // walk allocates per layer at most, not per param.
  void emit(std::initializer_list<std::string_view> name_parts, ParamClass param_class,
            std::initializer_list<std::int64_t> dims) {
    draft_.pattern.clear();
    for (std::string_view part : name_parts) draft_.pattern.append(part);
    draft_.param_class = param_class;
    draft_.shape = make_shape(dims);
    visit_(draft_);
    draft_.expert_block_size = 0;
  }

  void norm(std::string_view prefix, std::string_view name, std::int64_t size) {
    emit({prefix, name, "weight"}, ParamClass::replicated, {size});
    if (s_.normalization == Normalization::layer_norm)
      emit({prefix, name, "bias"}, ParamClass::replicated, {size});
  }

  // TransformerLayer: input_layernorm, self_attention, pre_mlp_layernorm, mlp.
  void transformer_layer(std::string_view prefix, bool moe) {
    const std::int64_t h = s_.hidden_size;
    const std::int64_t heads = s_.num_attention_heads;
    norm(prefix, "input_layernorm.", h);
    // Attention registers core_attention and linear_proj, then its projections and norms.
    const std::string& attn = attn_.assign(prefix).append("self_attention.");
    if (s_.softmax_type == SoftmaxType::learnable)
      emit({attn, "core_attention.softmax_offset"}, ParamClass::head_sharded, {heads});
    if (s_.multi_latent_attention) {
      multi_latent_attention(attn);
    } else {
      emit({attn, "linear_proj.weight"}, ParamClass::row, {h, heads * resolved_kv_channels(s_)});
      if (s_.add_bias_linear) emit({attn, "linear_proj.bias"}, ParamClass::replicated, {h});
      standard_attention(attn);
    }
    norm(prefix, "pre_mlp_layernorm.", h);
    mlp_block(prefix, moe);
  }

  // SelfAttention after linear_proj: linear_qkv and the q/k norms (per head, so split over TP with
  // the heads: megatron-core sums their gradients over TP).
  void standard_attention(std::string_view attn) {
    const std::int64_t h = s_.hidden_size;
    const std::int64_t heads = s_.num_attention_heads;
    const std::int64_t kv = resolved_kv_channels(s_);
    const std::int64_t groups = resolved_query_groups(s_);
    const bool bias = s_.add_bias_linear;
    const std::int64_t qkv = (heads + 2 * groups) * kv;
    emit({attn, "linear_qkv.weight"}, ParamClass::column, {qkv, h});
    if (bias) emit({attn, "linear_qkv.bias"}, ParamClass::column_bias, {qkv});
    if (s_.qk_layernorm) {
      norm(attn, "q_layernorm.", kv);
      norm(attn, "k_layernorm.", kv);
    }
  }

  // MLASelfAttention as megatron-core 0.19's Transformer Engine spec registers it: linear_proj, the
  // query projection (one, or down and up), then the key-value down and up projections. The down
  // projections are TE linears in "duplicated" mode (whole on every TP rank, not marked tensor
  // parallel); the up projections are column-parallel and, with qk_layernorm, carry the q/kv norm
  // fused in (layer_norm_weight), which normalises the whole latent every TP rank holds. Only
  // linear_proj has a bias.
  void multi_latent_attention(std::string_view attn) {
    const std::int64_t h = s_.hidden_size;
    const std::int64_t heads = s_.num_attention_heads;
    const std::int64_t q_head = std::int64_t{s_.qk_head_dim} + s_.qk_pos_emb_head_dim;
    emit({attn, "linear_proj.weight"}, ParamClass::row, {h, heads * s_.v_head_dim});
    if (s_.add_bias_linear) emit({attn, "linear_proj.bias"}, ParamClass::replicated, {h});
    if (!s_.q_lora_rank) {
      emit({attn, "linear_q_proj.weight"}, ParamClass::column, {heads * q_head, h});
    } else {
      emit({attn, "linear_q_down_proj.weight"}, ParamClass::replicated, {*s_.q_lora_rank, h});
      up_projection(attn, "linear_q_up_proj.", heads * q_head, *s_.q_lora_rank);
    }
    emit({attn, "linear_kv_down_proj.weight"}, ParamClass::replicated,
         {std::int64_t{s_.kv_lora_rank} + s_.qk_pos_emb_head_dim, h});
    up_projection(attn, "linear_kv_up_proj.", heads * (std::int64_t{s_.qk_head_dim} + s_.v_head_dim),
                  s_.kv_lora_rank);
  }

  // TELayerNormColumnParallelLinear registers its norm before its weight.
  void up_projection(std::string_view attn, std::string_view name, std::int64_t rows, std::int64_t latent) {
    if (s_.qk_layernorm) {
      emit({attn, name, "layer_norm_weight"}, ParamClass::replicated, {latent});
      if (s_.normalization == Normalization::layer_norm)
        emit({attn, name, "layer_norm_bias"}, ParamClass::replicated, {latent});
    }
    emit({attn, name, "weight"}, ParamClass::column, {rows, latent});
  }

  void mlp_block(std::string_view prefix, bool moe) {
    const std::int64_t h = s_.hidden_size;
    const bool bias = s_.add_bias_linear;
    const std::string& mlp = mlp_.assign(prefix).append("mlp.");
    const std::int64_t gate = s_.swiglu ? 2 : 1;
    if (!moe) {
      const std::int64_t ffn = resolved_ffn_hidden(s_);
      emit({mlp, "linear_fc1.weight"}, ParamClass::column, {gate * ffn, h});
      if (bias) emit({mlp, "linear_fc1.bias"}, ParamClass::column_bias, {gate * ffn});
      emit({mlp, "linear_fc2.weight"}, ParamClass::row, {h, ffn});
      if (bias) emit({mlp, "linear_fc2.bias"}, ParamClass::replicated, {h});
      return;
    }
    // MoELayer: router, experts, shared_experts.
    const std::int64_t experts = s_.num_experts;
    emit({mlp, "router.weight"}, ParamClass::replicated, {experts, h});
    if (bias) emit({mlp, "router.bias"}, ParamClass::replicated, {experts});
    const std::int64_t ffn = resolved_moe_ffn_hidden(s_);
    const std::string& expert = expert_.assign(mlp).append("experts.local_experts.{E}.");
    for (int e = 0; e < s_.num_experts; ++e) {
      draft_.expert = e;
      draft_.expert_block_size = bias ? 4 : 2;
      emit({expert, "linear_fc1.weight"}, ParamClass::expert_column, {gate * ffn, h});
      if (bias) emit({expert, "linear_fc1.bias"}, ParamClass::expert_column_bias, {gate * ffn});
      emit({expert, "linear_fc2.weight"}, ParamClass::expert_row, {h, ffn});
      if (bias) emit({expert, "linear_fc2.bias"}, ParamClass::expert_row_bias, {h});
    }
    draft_.expert = -1;
    const std::int64_t shared = s_.moe_shared_expert_intermediate_size;
    if (shared > 0) {
      // Shared experts are dense MLPs on the dense TP group, without biases.
      const std::string& sh = shared_.assign(mlp).append("shared_experts.");
      emit({sh, "linear_fc1.weight"}, ParamClass::column, {gate * shared, h});
      emit({sh, "linear_fc2.weight"}, ParamClass::row, {h, shared});
      if (s_.moe_shared_expert_gate) emit({sh, "gate_weight"}, ParamClass::replicated, {1, h});
    }
  }

  const ModelSpec& s_;
  const std::function<void(const ParamDraft&)>& visit_;
  ParamDraft draft_;
  std::string attn_, mlp_, expert_, shared_;  // transformer_layer's prefixes, their capacity kept
};

}  // namespace

std::string format_name(std::string_view pattern, int layer, int expert) {
  std::string out;
  out.reserve(pattern.size() + 8);
  std::size_t copied = 0;  // pattern[0, copied) is in `out`
  for (std::size_t at = pattern.find('{'); at != std::string_view::npos; at = pattern.find('{', at + 1)) {
    if (at + 2 >= pattern.size() || pattern[at + 2] != '}') continue;
    const char which = pattern[at + 1];
    if (which != 'L' && which != 'E') continue;
    out.append(pattern.substr(copied, at - copied));
    char digits[16];
    const auto [end, error] = std::to_chars(digits, digits + sizeof digits, which == 'L' ? layer : expert);
    out.append(digits, end);
    copied = at + 3;
    at += 2;
  }
  out.append(pattern.substr(copied));
  return out;
}

std::int64_t saturated_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (int d = 0; d < shape.rank; ++d) n = std::min(sat_mul(n, shape.dims[d]), kSaturated);
  return n;
}

std::int64_t param_count(const ModelSpec& s) {
  if (s.kind == ModelKind::custom) return static_cast<std::int64_t>(s.params.size());
  const std::int64_t norm = s.normalization == Normalization::layer_norm ? 2 : 1;
  const std::int64_t bias = s.add_bias_linear ? 1 : 0;
  // input_layernorm, the sink, the attention's own params, pre_mlp_layernorm.
  const std::int64_t up_projection = 1 + (s.qk_layernorm ? norm : 0);
  const std::int64_t attention_params =
      s.multi_latent_attention
          ? 1 + bias + (s.q_lora_rank ? 1 + up_projection : 1) + 1 + up_projection
          : 2 + 2 * bias + (s.qk_layernorm ? 2 * norm : 0);
  const std::int64_t attention =
      norm + (s.softmax_type == SoftmaxType::learnable ? 1 : 0) + attention_params + norm;
  const std::int64_t dense = 2 + 2 * bias;
  const std::int64_t per_expert = 2 + 2 * bias;
  const std::int64_t shared = s.moe_shared_expert_intermediate_size > 0
                                  ? 2 + (s.moe_shared_expert_gate ? 1 : 0)
                                  : 0;
  const std::int64_t moe = sat_add(1 + bias + shared, sat_mul(s.num_experts, per_expert));
  const std::int64_t layers = s.num_layers;
  const std::int64_t moe_layers = moe_layer_count(s);
  std::int64_t count = 1 + (s.position_embedding == PositionEmbedding::learned_absolute ? 1 : 0);
  count = sat_add(count, sat_mul(layers, attention));
  count = sat_add(count, sat_mul(layers - moe_layers, dense));
  count = sat_add(count, sat_mul(moe_layers, moe));
  count = sat_add(count, norm);
  const std::int64_t mtp_layer =
      sat_add(3 * norm + 1 + attention, s.num_experts > 0 ? moe : dense);
  count = sat_add(count, sat_mul(s.mtp_num_layers, mtp_layer));
  return sat_add(count, s.untie_embeddings_and_output_weights ? 1 : 0);
}

void for_each_param(const ModelSpec& spec, const std::function<void(const ParamDraft&)>& visit) {
  if (spec.kind == ModelKind::gpt) {
    GptWalker(spec, visit).walk();
    return;
  }
  ParamDraft draft;
  draft.anchor = Anchor::explicit_stage;
  for (const CustomParam& p : spec.params) {
    draft.pattern = p.name;  // names have no braces, so no placeholders
    draft.param_class = p.param_class;
    draft.shape = Shape{};
    for (std::int64_t d : p.shape)
      if (draft.shape.rank < kMaxDims) draft.shape.dims[draft.shape.rank++] = d;
    draft.stage = p.stage;
    draft.chunk = p.chunk;
    draft.expert = is_expert_class(p.param_class) ? p.expert : -1;
    draft.expert_block_size = draft.expert >= 0 ? 1 : 0;
    draft.mtp_group = p.mtp;
    draft.tied = p.tied;
    visit(draft);
  }
}

}  // namespace detail

std::string_view grad_norm_group_name(GradNormGroup group) {
  return group == GradNormGroup::mtp ? "mtp" : "";
}

LogicalModel::LogicalModel(ModelSpec spec, const ParallelConfig& config) : spec_(std::move(spec)) {
  if (std::optional<std::string> error = check_model(spec_, config)) throw InvalidModel(*error);
  placement_ = {config.tp, config.etp, config.ep, config.pp, config.vpp, config.gtp, config.egtp};
  const int pp = config.pp, vpp = config.vpp;

  // The (stage, chunk) of every decoder layer, from Megatron-LM's layer offsets: chunk rounds
  // in order, stages in order within a round.
  std::vector<std::pair<int, int>> layer_home;
  if (spec_.kind == ModelKind::gpt) {
    const std::vector<int> per_chunk = detail::layers_per_chunk(spec_, pp, vpp);
    layer_home.reserve(spec_.num_layers);
    chunk_first_layer_.assign(static_cast<std::size_t>(pp) * vpp, 0);  // pp*vpp <= num_layers
    for (int chunk = 0; chunk < vpp; ++chunk)
      for (int stage = 0; stage < pp; ++stage) {
        chunk_first_layer_[static_cast<std::size_t>(stage) * vpp + chunk] =
            static_cast<int>(layer_home.size());
        for (int l = 0; l < per_chunk[stage]; ++l) layer_home.emplace_back(stage, chunk);
      }
  }

  by_stage_.assign(pp, {});
  params_.reserve(detail::param_count(spec_));
  pattern_of_.reserve(params_.capacity());
  std::unordered_map<std::string, std::uint32_t> pattern_index;
  detail::for_each_param(spec_, [&](const detail::ParamDraft& d) {
    LogicalParam p;
    p.id = static_cast<int>(params_.size());
    p.name = detail::format_name(d.pattern, d.layer, d.expert);
    p.param_class = d.param_class;
    p.shape = d.shape;
    p.numel = d.shape.numel();
    switch (d.anchor) {
      case detail::Anchor::first_chunk: p.stage = 0, p.chunk = 0; break;
      case detail::Anchor::decoder_layer:
        p.stage = layer_home[d.layer].first, p.chunk = layer_home[d.layer].second;
        break;
      case detail::Anchor::last_chunk: p.stage = pp - 1, p.chunk = vpp - 1; break;
      case detail::Anchor::explicit_stage: p.stage = d.stage, p.chunk = d.chunk; break;
    }
    p.layer = d.layer;
    p.expert = d.expert;
    p.grad_norm_group = d.mtp_group ? GradNormGroup::mtp : GradNormGroup::main;
    p.tied = d.tied;
    p.embedding_or_output = p.param_class == ParamClass::vocab || d.output_layer;
    if (p.tied) tied_id_ = p.id;
    total_ += p.numel;

    // Runs: consecutive dense ids, or consecutive whole experts of one block size. Only the
    // first param of an expert carries expert_block_size.
    std::vector<ChunkRuns>& chunks = by_stage_[p.stage];
    auto at = std::lower_bound(chunks.begin(), chunks.end(), p.chunk,
                               [](const ChunkRuns& c, int chunk) { return c.chunk < chunk; });
    if (at == chunks.end() || at->chunk != p.chunk) at = chunks.insert(at, ChunkRuns{p.chunk, {}});
    std::vector<Run>& runs = at->runs;
    Run* last = runs.empty() || runs.back().end != p.id ? nullptr : &runs.back();
    const int k = d.expert_block_size;
    if (k > 0) {
      const bool next_expert = last && last->expert_block_size == k &&
                               (last->end - last->begin) % k == 0 &&
                               last->first_expert + (last->end - last->begin) / k == p.expert;
      if (next_expert)
        ++last->end;
      else
        runs.push_back({p.id, p.id + 1, k, p.expert});
    } else if (p.expert >= 0 || (last && last->expert_block_size == 0)) {
      ++last->end;  // the rest of an expert's block, or more dense params
    } else {
      runs.push_back({p.id, p.id + 1, 0, -1});
    }
    params_.push_back(std::move(p));
    if (d.pattern.find('{') == std::string::npos) {
      pattern_of_.push_back(kNameIsPattern);
    } else {
      auto [pattern, fresh] = pattern_index.try_emplace(d.pattern, static_cast<std::uint32_t>(patterns_.size()));
      if (fresh) patterns_.push_back(d.pattern);
      pattern_of_.push_back(pattern->second);
    }
  });

  // Megatron-LM's setup_embeddings_and_output_layer: with pp > 1 the last stage holds a zeroed
  // copy of the word embedding, marked shared. The MTP stage's embedding is that copy when MTP
  // layers exist (it is what shared_embedding_or_output_weight returns there).
  if (pp > 1) {
    if (spec_.kind == ModelKind::gpt && spec_.mtp_num_layers > 0) {
      copy_ = SharedCopy::mtp_embedding;
      copy_of_ = 0;  // the word embedding is always the first parameter
    } else if (tied_id_ >= 0) {
      copy_ = SharedCopy::output_layer;
      copy_of_ = tied_id_;
    }
  }
}

std::int64_t LogicalModel::total_elements(GradNormGroup group) const {
  std::int64_t n = 0;
  for (const LogicalParam& p : params_)
    if (p.grad_norm_group == group) n += p.numel;
  return n;
}

std::string LogicalModel::local_name(int id, int local_expert) const {
  const LogicalParam& p = params_.at(id);
  int layer = p.layer;
  if (layer >= 0)
    layer -= chunk_first_layer_[static_cast<std::size_t>(p.stage) * placement_.vpp + p.chunk];
  const std::uint32_t pattern = pattern_of_[static_cast<std::size_t>(id)];
  if (pattern == kNameIsPattern) return p.name;
  return detail::format_name(patterns_[pattern], layer, local_expert);
}

std::string LogicalModel::local_name(SharedCopy copy) const {
  switch (copy) {
    case SharedCopy::none: return "";
    case SharedCopy::output_layer: return "output_layer.weight";
    case SharedCopy::mtp_embedding: return "embedding.word_embeddings.weight";
  }
  return "";
}

std::span<const LogicalModel::Run> LogicalModel::runs(int stage, int chunk) const {
  for (const ChunkRuns& c : by_stage_.at(stage))
    if (c.chunk == chunk) return c.runs;
  return {};
}

}  // namespace tally::topologies
