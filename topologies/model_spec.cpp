#include "topologies/model_spec.h"

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "topologies/detail/model_params.h"
#include "topologies/moe_layer_pattern.h"
#include "topologies/presets.h"

namespace tally::topologies {

namespace {

using std::to_string;

struct ClassEntry {
  ParamClass param_class;
  std::string_view name;
  bool expert;
  int partition_dim;
};

// The class table of docs/megatron-reference.md §3, in one place.
constexpr std::array<ClassEntry, kParamClassCount> kClassTable = {{
    {ParamClass::column, "column", false, 0},
    {ParamClass::column_bias, "column-bias", false, 0},
    {ParamClass::row, "row", false, 1},
    {ParamClass::replicated, "replicated", false, -1},
    {ParamClass::vocab, "vocab", false, 0},
    {ParamClass::head_sharded, "head-sharded", false, 0},
    {ParamClass::expert_column, "expert-column", true, 0},
    {ParamClass::expert_column_bias, "expert-column-bias", true, 0},
    {ParamClass::expert_row, "expert-row", true, 1},
    {ParamClass::expert_row_bias, "expert-row-bias", true, -1},
}};

const ClassEntry& entry(ParamClass c) { return kClassTable[static_cast<int>(c)]; }

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + to_string(shape[i]);
  return out + "]";
}

bool valid_name_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '.' || ch == '_' || ch == '-' || ch == '/' || ch == ':';
}

std::optional<std::string> check_sizes(const ModelSpec& s) {
  const std::array<std::pair<const char*, int>, 10> positive = {{
      {"num_layers", s.num_layers},
      {"hidden_size", s.hidden_size},
      {"num_attention_heads", s.num_attention_heads},
      {"vocab_size", s.vocab_size},
      {"max_position_embeddings", s.max_position_embeddings},
      {"moe_layer_freq", s.moe_layer_freq},
      {"kv_lora_rank", s.kv_lora_rank},
      {"qk_head_dim", s.qk_head_dim},
      {"qk_pos_emb_head_dim", s.qk_pos_emb_head_dim},
      {"v_head_dim", s.v_head_dim},
  }};
  for (const auto& [name, value] : positive) {
    if (value < 1) return std::string(name) + " must be at least 1 (got " + to_string(value) + ")";
    if (value > kMaxSize)
      return std::string(name) + " " + to_string(value) + " is larger than tally supports (at most " +
             to_string(kMaxSize) + ")";
  }
  const std::array<std::pair<const char*, std::optional<int>>, 7> optional_positive = {{
      {"num_query_groups", s.num_query_groups},
      {"q_lora_rank", s.q_lora_rank},
      {"kv_channels", s.kv_channels},
      {"ffn_hidden_size", s.ffn_hidden_size},
      {"moe_ffn_hidden_size", s.moe_ffn_hidden_size},
      {"decoder_first_pipeline_num_layers", s.first_stage_layers},
      {"decoder_last_pipeline_num_layers", s.last_stage_layers},
  }};
  for (const auto& [name, value] : optional_positive) {
    if (!value) continue;
    if (*value < 1) return std::string(name) + " must be at least 1 (got " + to_string(*value) + ")";
    if (*value > kMaxSize)
      return std::string(name) + " " + to_string(*value) +
             " is larger than tally supports (at most " + to_string(kMaxSize) + ")";
  }
  const std::array<std::pair<const char*, int>, 3> non_negative = {{
      {"num_experts", s.num_experts},
      {"moe_shared_expert_intermediate_size", s.moe_shared_expert_intermediate_size},
      {"mtp_num_layers", s.mtp_num_layers},
  }};
  for (const auto& [name, value] : non_negative) {
    if (value < 0) return std::string(name) + " must be at least 0 (got " + to_string(value) + ")";
    if (value > kMaxSize)
      return std::string(name) + " " + to_string(value) + " is larger than tally supports (at most " +
             to_string(kMaxSize) + ")";
  }
  return std::nullopt;
}

// Rules that concern the elements and the count of parameters: the same visitor that builds a
// LogicalModel walks the spec, so the bounds hold for exactly what would be built.
std::optional<std::string> check_bounds(const ModelSpec& spec) {
  const std::int64_t count = detail::param_count(spec);
  if (count > kMaxParams)
    return "the model has " + to_string(count) + " parameters; tally supports at most " +
           to_string(kMaxParams);
  std::optional<std::string> error;
  std::int64_t total = 0;
  detail::for_each_param(spec, [&](const detail::ParamDraft& p) {
    if (error) return;
    const std::int64_t numel = detail::saturated_numel(p.shape);
    if (numel > kMaxElements) {
      error = detail::format_name(p.pattern, p.layer, p.expert) + " has more than " + to_string(kMaxElements) +
              " elements, more than tally supports in one model";
      return;
    }
    total += numel;  // at most kMaxParams * 2^40 < 2^63
  });
  if (error) return error;
  if (total > kMaxElements)
    return "the model has " + to_string(total) + " elements; tally supports at most " +
           to_string(kMaxElements);
  return std::nullopt;
}

std::optional<std::string> check_gpt(const ModelSpec& s) {
  if (!s.params.empty())
    return "params is only for a custom layout (kind gpt builds its own parameters)";
  if (!s.preset.empty() && !preset_from_name(s.preset))
    return "preset '" + s.preset + "' is not a preset (" + preset_names() + ")";
  if (std::optional<std::string> error = check_sizes(s)) return error;
  if (s.multi_latent_attention) {
    if (s.num_query_groups && *s.num_query_groups != s.num_attention_heads)
      return "num_query_groups " + to_string(*s.num_query_groups) + " with multi_latent_attention: Megatron-LM holds "
             "group query attention and multi-latent attention mutually exclusive (arguments.py:1892-1893 at "
             "core_v0.19.0)";
    if (s.kv_channels)
      return "kv_channels " + to_string(*s.kv_channels) + " with multi_latent_attention: its heads are qk_head_dim + "
             "qk_pos_emb_head_dim wide for queries and keys and v_head_dim for values; kv_channels is not read";
  } else if (!s.kv_channels && s.hidden_size % s.num_attention_heads != 0)
    return "hidden_size " + to_string(s.hidden_size) + " is not divisible by num_attention_heads " +
           to_string(s.num_attention_heads) + " (kv_channels defaults to their quotient)";
  const int groups = resolved_query_groups(s);
  if (s.num_attention_heads % groups != 0)
    return "num_attention_heads " + to_string(s.num_attention_heads) +
           " is not divisible by num_query_groups " + to_string(groups);
  const bool moe = s.num_experts > 0;
  if (!moe && s.moe_ffn_hidden_size)
    return "moe_ffn_hidden_size " + to_string(*s.moe_ffn_hidden_size) + " needs num_experts > 0";
  if (!moe && s.moe_shared_expert_intermediate_size > 0)
    return "moe_shared_expert_intermediate_size " +
           to_string(s.moe_shared_expert_intermediate_size) + " needs num_experts > 0";
  if (s.moe_shared_expert_gate && s.moe_shared_expert_intermediate_size == 0)
    return "moe_shared_expert_gate needs a shared expert (moe_shared_expert_intermediate_size > 0)";
  if (s.moe_shared_expert_intermediate_size > 0 && s.add_bias_linear)
    return "moe_shared_expert_intermediate_size " +
           to_string(s.moe_shared_expert_intermediate_size) +
           " with add_bias_linear: Megatron-LM's shared experts do not support biases "
           "(disable add_bias_linear)";
  if (s.mtp_detach_heads && s.mtp_num_layers == 0)
    return "mtp_detach_heads needs mtp_num_layers > 0";
  if (!s.moe_layer_pattern.empty()) {
    if (s.moe_layer_freq != 1)
      return "moe_layer_freq " + to_string(s.moe_layer_freq) + " and a layer pattern: Megatron-LM's "
             "--moe-layer-freq is one or the other";
    if (static_cast<std::int64_t>(s.moe_layer_pattern.size()) != s.num_layers)
      return "moe_layer_freq " + moe_layer_pattern_text(s.moe_layer_pattern) + " has " +
             to_string(s.moe_layer_pattern.size()) + " layers, num_layers is " + to_string(s.num_layers) +
             " (Megatron-LM: \"Invalid length of moe_layer_pattern\", gpt_layer_specs.py)";
    if (!moe) return "moe_layer_freq " + moe_layer_pattern_text(s.moe_layer_pattern) + " needs num_experts > 0";
  }
  return check_bounds(s);
}

std::optional<std::string> check_custom(const ModelSpec& s) {
  if (!s.preset.empty()) return "preset " + s.preset + " is a GPT of its family; a custom layout has none";
  const std::string_view kind = "custom layout";
  if (s.params.empty()) return std::string(kind) + " has no params";
  if (static_cast<std::int64_t>(s.params.size()) > kMaxParams)
    return std::string(kind) + " has " + to_string(s.params.size()) +
           " params; tally supports at most " + to_string(kMaxParams);
  if (s.num_experts < 0)
    return "num_experts must be at least 0 (got " + to_string(s.num_experts) + ")";
  if (s.num_experts > kMaxSize)
    return "num_experts " + to_string(s.num_experts) + " is larger than tally supports (at most " +
           to_string(kMaxSize) + ")";
  std::unordered_set<std::string_view> names;
  int tied = 0;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const CustomParam& p = s.params[i];
    const std::string at = "params[" + to_string(i) + "]";
    if (p.name.empty()) return at + ": name is empty";
    if (p.name.size() > kMaxNameLength)
      return at + ": name is longer than " + to_string(kMaxNameLength) + " characters";
    if (!std::all_of(p.name.begin(), p.name.end(), valid_name_char))
      return at + " '" + p.name + "': name may use letters, digits and . _ - / : only";
    const std::string who = at + " '" + p.name + "'";
    if (!names.insert(p.name).second) return who + ": name repeats an earlier param";
    const int dims = static_cast<int>(p.shape.size());
    if (dims < 1 || dims > kMaxDims)
      return who + ": shape has " + to_string(dims) + " dims (1 to " + to_string(kMaxDims) +
             " allowed)";
    for (std::int64_t d : p.shape)
      if (d < 1 || d > kMaxElements)
        return who + ": shape " + shape_string(p.shape) + " has a dim outside 1.." +
               to_string(kMaxElements);
    if (partition_dim(p.param_class) >= dims)
      return who + ": class " + std::string(class_name(p.param_class)) + " splits dim " +
             to_string(partition_dim(p.param_class)) + ", but shape " + shape_string(p.shape) +
             " has " + to_string(dims) + " dim" + (dims == 1 ? "" : "s");
    if (p.stage < 0) return who + ": stage must be at least 0 (got " + to_string(p.stage) + ")";
    if (p.chunk < 0) return who + ": chunk must be at least 0 (got " + to_string(p.chunk) + ")";
    if (is_expert_class(p.param_class)) {
      if (p.expert < 0 || p.expert >= s.num_experts)
        return who + ": expert " + to_string(p.expert) + " is out of range (num_experts " +
               to_string(s.num_experts) + ")";
    } else if (p.expert != -1) {
      return who + ": expert " + to_string(p.expert) + " is only for expert classes (class " +
             std::string(class_name(p.param_class)) + ")";
    }
    if (p.tied) {
      if (p.param_class != ParamClass::vocab || p.stage != 0 || p.chunk != 0)
        return who + ": tied needs class vocab on stage 0, chunk 0 (the word embedding the "
                     "output layer shares)";
      if (++tied > 1) return who + ": only one param may be tied to the output layer";
    }
  }
  return check_bounds(s);
}

std::optional<std::string> check_divisible(const std::string& what, std::int64_t value,
                                           const char* by_name, int by) {
  if (value % by != 0)
    return what + " " + to_string(value) + " is not divisible by " + by_name + " " + to_string(by);
  return std::nullopt;
}

std::optional<std::string> check_stages(const ModelSpec& s, int pp, int vpp) {
  const int layers = s.num_layers;
  if (!s.first_stage_layers && !s.last_stage_layers) {
    if (pp > layers)
      return "pp " + to_string(pp) + " is larger than num_layers " + to_string(layers) +
             ": every pipeline stage needs a layer";
    const std::int64_t chunks = std::int64_t{pp} * vpp;
    if (layers % chunks != 0)
      return "num_layers " + to_string(layers) + " is not divisible by pp*vpp = " +
             to_string(chunks);
    return std::nullopt;
  }
  const char* first_name = "decoder_first_pipeline_num_layers";
  const char* last_name = "decoder_last_pipeline_num_layers";
  if (pp == 1)
    return std::string(s.first_stage_layers ? first_name : last_name) +
           " needs pp > 1 (uneven stages)";
  const int first = s.first_stage_layers.value_or(0);
  const int last = s.last_stage_layers.value_or(0);
  const int middle_stages =
      pp - (s.first_stage_layers ? 1 : 0) - (s.last_stage_layers ? 1 : 0);
  const std::int64_t middle = std::int64_t{layers} - first - last;
  const std::string split = "num_layers " + to_string(layers) + " minus the first/last stage layers (" +
                            to_string(first) + " + " + to_string(last) + ")";
  if (middle < 0) return split + " is negative";
  if (middle_stages == 0 && middle != 0)
    return split + " leaves " + to_string(middle) + " layers for no middle stage (pp " +
           to_string(pp) + ")";
  if (middle_stages > 0 && middle < middle_stages)
    return split + " = " + to_string(middle) + " leaves a middle stage without layers (" +
           to_string(middle_stages) + " middle stages)";
  if (middle_stages > 0 && middle % middle_stages != 0)
    return split + " = " + to_string(middle) + " is not divisible by the " +
           to_string(middle_stages) + " middle stages";
  if (first % vpp != 0)
    return std::string(first_name) + " " + to_string(first) + " is not divisible by vpp " +
           to_string(vpp);
  if (last % vpp != 0)
    return std::string(last_name) + " " + to_string(last) + " is not divisible by vpp " +
           to_string(vpp);
  if (middle_stages > 0 && (middle / middle_stages) % vpp != 0)
    return "the " + to_string(middle / middle_stages) +
           " layers of each middle stage are not divisible by vpp " + to_string(vpp);
  return std::nullopt;
}

std::optional<std::string> check_gpt_config(const ModelSpec& s, const ParallelConfig& c) {
  if (auto e = check_divisible("vocab_size", s.vocab_size, "tp", c.tp)) return e;
  if (auto e = check_divisible("num_attention_heads", s.num_attention_heads, "tp", c.tp)) return e;
  if (auto e = check_divisible("num_query_groups", resolved_query_groups(s), "tp", c.tp)) return e;
  // A dense layer's FC1 and FC2 are split over TP (MTP layers follow the decoder's MoE spec).
  const bool dense_mlp = s.num_experts == 0 || moe_layer_count(s) < s.num_layers;
  if (dense_mlp)
    if (auto e = check_divisible("ffn_hidden_size", resolved_ffn_hidden(s), "tp", c.tp)) return e;
  if (s.moe_shared_expert_intermediate_size > 0)
    if (auto e = check_divisible("moe_shared_expert_intermediate_size",
                                 s.moe_shared_expert_intermediate_size, "tp", c.tp))
      return e;
  if (s.mtp_num_layers > 0)
    if (auto e = check_divisible("hidden_size", s.hidden_size, "tp", c.tp))
      return *e + " (the MTP eh_proj is column-parallel with hidden_size rows)";
  if (c.ep > 1 && s.num_experts == 0)
    return "ep " + to_string(c.ep) + " needs num_experts > 0 (expert parallelism needs MoE layers)";
  if (s.num_experts > 0) {
    if (auto e = check_divisible("num_experts", s.num_experts, "ep", c.ep)) return e;
    if (auto e = check_divisible("moe_ffn_hidden_size", resolved_moe_ffn_hidden(s), "etp", c.etp))
      return e;
  }
  return check_stages(s, c.pp, c.vpp);
}

std::optional<std::string> check_custom_config(const ModelSpec& s, const ParallelConfig& c) {
  if (c.ep > 1 && s.num_experts == 0)
    return "ep " + to_string(c.ep) + " needs num_experts > 0 (expert parallelism needs experts)";
  if (s.num_experts > 0)
    if (auto e = check_divisible("num_experts", s.num_experts, "ep", c.ep)) return e;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const CustomParam& p = s.params[i];
    const std::string who = "params[" + to_string(i) + "] '" + p.name + "'";
    if (p.stage >= c.pp)
      return who + ": stage " + to_string(p.stage) + " is out of range (pp " + to_string(c.pp) +
             ")";
    if (p.chunk >= c.vpp)
      return who + ": chunk " + to_string(p.chunk) + " is out of range (vpp " + to_string(c.vpp) +
             ")";
    const int dim = partition_dim(p.param_class);
    if (dim < 0) continue;
    const bool expert = is_expert_class(p.param_class);
    const int size = expert ? c.etp : c.tp;
    if (p.shape[dim] % size != 0)
      return who + ": dim " + to_string(dim) + " of shape " + shape_string(p.shape) + " (" +
             to_string(p.shape[dim]) + ") is not divisible by " + (expert ? "etp " : "tp ") +
             to_string(size);
  }
  return std::nullopt;
}

}  // namespace

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= dims[d];
  return n;
}

std::string shape_string(const Shape& shape) {
  return shape_string(std::vector<std::int64_t>(shape.dims.begin(), shape.dims.begin() + shape.rank));
}

std::string_view class_name(ParamClass c) { return entry(c).name; }

std::optional<ParamClass> class_from_name(std::string_view name) {
  for (const ClassEntry& e : kClassTable)
    if (e.name == name) return e.param_class;
  return std::nullopt;
}

bool is_expert_class(ParamClass c) { return entry(c).expert; }
int partition_dim(ParamClass c) { return entry(c).partition_dim; }

std::string_view normalization_name(Normalization value) {
  return value == Normalization::layer_norm ? "LayerNorm" : "RMSNorm";
}
std::string_view position_embedding_name(PositionEmbedding value) {
  return value == PositionEmbedding::learned_absolute ? "learned_absolute" : "rope";
}
std::string_view softmax_type_name(SoftmaxType value) {
  return value == SoftmaxType::vanilla ? "vanilla" : "learnable";
}
std::string_view model_kind_name(ModelKind kind) {
  return kind == ModelKind::gpt ? "gpt" : "custom";
}

int resolved_query_groups(const ModelSpec& s) {
  return s.num_query_groups.value_or(s.num_attention_heads);
}
int resolved_kv_channels(const ModelSpec& s) {
  return s.kv_channels.value_or(s.num_attention_heads > 0 ? s.hidden_size / s.num_attention_heads
                                                          : 0);
}
int resolved_ffn_hidden(const ModelSpec& s) { return s.ffn_hidden_size.value_or(4 * s.hidden_size); }
int resolved_moe_ffn_hidden(const ModelSpec& s) {
  return s.moe_ffn_hidden_size.value_or(resolved_ffn_hidden(s));
}
bool is_moe_layer(const ModelSpec& s, int layer) {
  if (s.num_experts == 0) return false;
  if (!s.moe_layer_pattern.empty())
    return layer >= 0 && layer < static_cast<int>(s.moe_layer_pattern.size()) && s.moe_layer_pattern[layer];
  return s.moe_layer_freq > 0 && layer % s.moe_layer_freq == 0;
}

std::int64_t moe_layer_count(const ModelSpec& s) {
  if (s.num_experts == 0) return 0;
  if (!s.moe_layer_pattern.empty()) {
    std::int64_t count = 0;
    for (int layer = 0; layer < s.num_layers && layer < static_cast<int>(s.moe_layer_pattern.size()); ++layer)
      count += s.moe_layer_pattern[layer] ? 1 : 0;
    return count;
  }
  const std::int64_t freq = std::max(1, s.moe_layer_freq);
  return (s.num_layers + freq - 1) / freq;
}

std::string moe_layer_freq_text(const ModelSpec& s) {
  return s.moe_layer_pattern.empty() ? to_string(s.moe_layer_freq) : moe_layer_pattern_text(s.moe_layer_pattern);
}

std::optional<std::string> check_model(const ModelSpec& spec) {
  return spec.kind == ModelKind::gpt ? check_gpt(spec) : check_custom(spec);
}

std::optional<std::string> check_model(const ModelSpec& spec, const ParallelConfig& config) {
  if (std::optional<std::string> error = check_model(spec)) return error;
  return spec.kind == ModelKind::gpt ? check_gpt_config(spec, config)
                                     : check_custom_config(spec, config);
}

std::optional<std::string> check_megatron_expert_bias(const ModelSpec& spec, const ParallelConfig& config) {
  if (spec.kind != ModelKind::gpt || spec.num_experts == 0 || !spec.add_bias_linear || config.etp == 1)
    return std::nullopt;
  return "expert biases (add_bias_linear with num_experts " + to_string(spec.num_experts) +
         ") need etp 1, got etp " + to_string(config.etp) +
         " (Megatron-LM: bias in MoE is only supported when ETP==1)";
}

namespace detail {

std::vector<int> layers_per_chunk(const ModelSpec& spec, int pp, int vpp) {
  std::vector<int> per_chunk(pp, 0);
  const int first = spec.first_stage_layers.value_or(0);
  const int last = spec.last_stage_layers.value_or(0);
  const int middle_stages =
      pp - (spec.first_stage_layers ? 1 : 0) - (spec.last_stage_layers ? 1 : 0);
  const int middle = middle_stages > 0 ? (spec.num_layers - first - last) / middle_stages : 0;
  for (int s = 0; s < pp; ++s) {
    int layers = middle;
    if (s == 0 && spec.first_stage_layers) layers = first;
    if (s == pp - 1 && spec.last_stage_layers) layers = last;
    per_chunk[s] = layers / vpp;
  }
  return per_chunk;
}

}  // namespace detail

LayerRange layers_of(const ModelSpec& spec, int pp, int vpp, int stage, int chunk) {
  if (spec.kind != ModelKind::gpt) return {};
  const std::vector<int> per_chunk = detail::layers_per_chunk(spec, pp, vpp);
  int round = 0, before = 0;
  for (int s = 0; s < pp; ++s) {
    round += per_chunk[s];
    if (s < stage) before += per_chunk[s];
  }
  return {chunk * round + before, per_chunk[stage]};
}

std::string describe(const ModelSpec& s) {
  std::ostringstream out;
  if (s.kind == ModelKind::custom) {
    out << "custom: " << s.params.size() << " params";
    if (s.num_experts > 0) out << ", " << s.num_experts << " experts";
    return out.str();
  }
  out << "gpt";
  if (!s.preset.empty()) out << " (preset " << s.preset << ")";
  out << ": " << s.num_layers << " layers, hidden " << s.hidden_size << ", heads " << s.num_attention_heads;
  if (!s.multi_latent_attention)
    out << " (query groups " << resolved_query_groups(s) << ", kv_channels " << resolved_kv_channels(s) << ")";
  out << ", vocab " << s.vocab_size;
  if (s.num_experts == 0 || moe_layer_count(s) < s.num_layers) out << ", ffn " << resolved_ffn_hidden(s);
  if (s.num_experts > 0) {
    out << ", " << s.num_experts << " experts (ffn " << resolved_moe_ffn_hidden(s);
    if (!s.moe_layer_pattern.empty())
      out << ", layers " << moe_layer_pattern_text(s.moe_layer_pattern);
    else if (s.moe_layer_freq > 1)
      out << ", every " << s.moe_layer_freq << " layers";
    out << ")";
    if (s.moe_shared_expert_intermediate_size > 0)
      out << ", shared expert " << s.moe_shared_expert_intermediate_size
          << (s.moe_shared_expert_gate ? " with gate" : "");
  }
  out << ", " << normalization_name(s.normalization)
      << (s.add_bias_linear ? ", linear biases" : ", no linear biases");
  if (s.swiglu) out << ", swiglu";
  if (s.multi_latent_attention) {
    out << ", multi-latent attention (";
    if (s.q_lora_rank) out << "q_lora_rank " << *s.q_lora_rank << ", ";
    out << "kv_lora_rank " << s.kv_lora_rank << ", heads qk " << s.qk_head_dim << " + rope " << s.qk_pos_emb_head_dim
        << ", v " << s.v_head_dim << ")";
  }
  if (s.qk_layernorm) out << ", qk norms";
  if (s.softmax_type == SoftmaxType::learnable) out << ", attention sink";
  out << ", " << position_embedding_name(s.position_embedding) << ", "
      << (s.untie_embeddings_and_output_weights ? "untied" : "tied") << " output layer";
  if (s.mtp_num_layers > 0)
    out << ", " << s.mtp_num_layers << " MTP layers" << (s.mtp_detach_heads ? " (own norm group)" : "");
  if (s.first_stage_layers) out << ", first stage " << *s.first_stage_layers << " layers";
  if (s.last_stage_layers) out << ", last stage " << *s.last_stage_layers << " layers";
  return out.str();
}

}  // namespace tally::topologies
