// ModelSpec: the unsharded model, described and never materialised. Either the GPT/MoE family
// of Megatron-LM (docs/megatron-reference.md §3) or a `custom` list of parameters given by class,
// so any scenario from a bug report can be written as data.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "topologies/parallel_config.h"

namespace tally::topologies {

// The class table of docs/megatron-reference.md §3: how a parameter is sharded and which attributes Megatron-LM
// gives it.
enum class ParamClass : std::uint8_t {
  column,              // TP, dim 0 (QKV, FC1, output layer, eh_proj)
  column_bias,         // TP, dim 0
  row,                 // TP, dim 1 (proj, FC2)
  replicated,          // whole on every TP rank (norms, row biases, router, gate)
  vocab,               // TP, dim 0 (word embedding)
  head_sharded,        // TP, dim 0 (attention sink / softmax offset)
  expert_column,       // ETP, dim 0; one expert lives on one EP rank
  expert_column_bias,  // ETP, dim 0
  expert_row,          // ETP, dim 1
  expert_row_bias,     // whole on every ETP rank (expert FC2 bias)
};
inline constexpr int kParamClassCount = 10;
inline constexpr std::array<ParamClass, kParamClassCount> kAllParamClasses = {
    ParamClass::column,        ParamClass::column_bias,        ParamClass::row,
    ParamClass::replicated,    ParamClass::vocab,              ParamClass::head_sharded,
    ParamClass::expert_column, ParamClass::expert_column_bias, ParamClass::expert_row,
    ParamClass::expert_row_bias};

std::string_view class_name(ParamClass param_class);  // "column-bias", "expert-row-bias", ...
std::optional<ParamClass> class_from_name(std::string_view name);
bool is_expert_class(ParamClass param_class);
// The dimension a class is split along (over TP, or ETP for expert classes); -1: not split.
int partition_dim(ParamClass param_class);

enum class Normalization : std::uint8_t { layer_norm, rms_norm };  // LayerNorm has a bias
enum class PositionEmbedding : std::uint8_t { learned_absolute, rope };
enum class SoftmaxType : std::uint8_t { vanilla, learnable };  // learnable: an attention sink
std::string_view normalization_name(Normalization value);         // "LayerNorm" | "RMSNorm"
std::string_view position_embedding_name(PositionEmbedding value);  // "learned_absolute" | "rope"
std::string_view softmax_type_name(SoftmaxType value);            // "vanilla" | "learnable"

// Tally's own bounds, so a hostile spec cannot make anything large: the model is only
// described, so big element counts are fine, but the parameter list is held in memory.
inline constexpr int kMaxDims = 4;
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 40;  // per model and per dim
inline constexpr std::int64_t kMaxParams = 1'000'000;
inline constexpr int kMaxSize = 1 << 30;  // any single size field of the GPT family
inline constexpr std::size_t kMaxNameLength = 256;

// A tensor shape of 1..kMaxDims dims.
struct Shape {
  std::array<std::int64_t, kMaxDims> dims{};
  int rank = 0;
  std::int64_t operator[](int dim) const { return dims[dim]; }
  std::int64_t numel() const;
  friend bool operator==(const Shape&, const Shape&) = default;
};
std::string shape_string(const Shape& shape);  // "[48, 16]"

// Gradient values a case states for a param instead of generating them, written as a bug report
// gives them: one constant for every element, the generated values times a scale, or every
// element listed in row-major order. Each stated value is rounded once to the gradient dtype.
struct StatedGradient {
  enum class Kind : std::uint8_t { constant, scale, values };
  Kind kind = Kind::constant;
  double number = 0.0;         // constant: the value; scale: the factor
  std::vector<double> values;  // values: one per element of the logical tensor
  friend bool operator==(const StatedGradient&, const StatedGradient&) = default;
};
inline constexpr std::int64_t kMaxStatedValues = std::int64_t{1} << 20;  // per list

// One parameter of a custom layout.
struct CustomParam {
  std::string name;  // unique; letters, digits and . _ - / : only
  ParamClass param_class = ParamClass::replicated;
  std::vector<std::int64_t> shape;  // 1..kMaxDims positive dims
  int stage = 0;                    // pipeline stage
  int chunk = 0;                    // virtual pipeline chunk on that stage
  int expert = -1;                  // expert classes: 0..num_experts-1; others: -1
  bool mtp = false;                 // in the separate `mtp` grad-norm group
  bool tied = false;  // vocab on stage 0 shared with the output layer (a `shared` copy on the
                      // last stage when pp > 1)
  std::optional<StatedGradient> gradient;  // absent: the case's generated gradients
  friend bool operator==(const CustomParam&, const CustomParam&) = default;
};

enum class ModelKind : std::uint8_t { gpt, custom };
std::string_view model_kind_name(ModelKind kind);  // "gpt" | "custom"

// Field names follow Megatron-LM's arguments. Unset optionals take Megatron-LM's defaults
// (see the resolved_* functions).
struct ModelSpec {
  ModelKind kind = ModelKind::gpt;
  // The architecture preset the model was laid out from (topologies/presets.h), "" for none: a
  // label for reports; the fields below are the model.
  std::string preset;

  // GPT/MoE family.
  int num_layers = 2;
  int hidden_size = 16;
  int num_attention_heads = 4;
  std::optional<int> num_query_groups;  // GQA; default num_attention_heads
  std::optional<int> kv_channels;       // default hidden_size / num_attention_heads
  std::optional<int> ffn_hidden_size;   // default 4 * hidden_size
  int vocab_size = 64;
  int max_position_embeddings = 32;  // rows of the learned position embedding
  bool add_bias_linear = true;       // QKV, proj, FC1, FC2, router and expert biases
  Normalization normalization = Normalization::layer_norm;
  bool qk_layernorm = false;
  PositionEmbedding position_embedding = PositionEmbedding::learned_absolute;
  SoftmaxType softmax_type = SoftmaxType::vanilla;
  // Multi-latent attention (Megatron-LM's --multi-latent-attention; DeepSeek-V2 and V3): low-rank
  // query and key-value projections in place of linear_qkv, laid out as megatron-core's Transformer
  // Engine spec builds it (the down projections duplicated on every TP rank, the up projections
  // split over TP, the q/kv norms fused into the up projections with qk_layernorm). The sizes
  // take Megatron-LM's defaults; without multi_latent_attention they are not read.
  bool multi_latent_attention = false;
  std::optional<int> q_lora_rank;  // none: one linear_q_proj, no query down projection
  int kv_lora_rank = 32;
  int qk_head_dim = 128;
  int qk_pos_emb_head_dim = 64;
  int v_head_dim = 128;
  bool untie_embeddings_and_output_weights = false;
  bool swiglu = false;  // gated FC1: twice the rows
  // MoE: num_experts > 0 turns every moe_layer_freq-th layer (0, freq, 2*freq, ...) into MoE.
  int num_experts = 0;  // also the placement of a custom layout's expert params
  std::optional<int> moe_ffn_hidden_size;  // default ffn_hidden_size
  int moe_shared_expert_intermediate_size = 0;  // 0: no shared expert
  bool moe_shared_expert_gate = false;
  int moe_layer_freq = 1;
  // Megatron-LM's list form of --moe-layer-freq (topologies/moe_layer_pattern.h): one entry per
  // decoder layer, true for MoE; empty: moe_layer_freq decides.
  std::vector<bool> moe_layer_pattern;
  // Multi-token prediction: layers on the last pipeline stage.
  int mtp_num_layers = 0;
  bool mtp_detach_heads = false;  // MTP params in their own `mtp` grad-norm group
  // Uneven pipeline: decoder layers on the first / last stage (Megatron-LM's
  // --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers).
  std::optional<int> first_stage_layers;
  std::optional<int> last_stage_layers;

  // Custom layout.
  std::vector<CustomParam> params;

  friend bool operator==(const ModelSpec&, const ModelSpec&) = default;
};

int resolved_query_groups(const ModelSpec& spec);
int resolved_kv_channels(const ModelSpec& spec);
int resolved_ffn_hidden(const ModelSpec& spec);
int resolved_moe_ffn_hidden(const ModelSpec& spec);
bool is_moe_layer(const ModelSpec& spec, int layer);  // a decoder layer (global id)
std::int64_t moe_layer_count(const ModelSpec& spec);
// --moe-layer-freq as Megatron-LM takes it: "2", or the pattern's run-length list "([0]*1+[1]*3)".
std::string moe_layer_freq_text(const ModelSpec& spec);

// The first rule `spec` breaks on its own, as one line naming the sizes and the rule.
std::optional<std::string> check_model(const ModelSpec& spec);
// The same, then the rules that depend on the parallel configuration (divisibility by tp, etp,
// ep, pp*vpp; stages; Megatron-LM's build-time checks). `config` must pass check_config.
std::optional<std::string> check_model(const ModelSpec& spec, const ParallelConfig& config);
// Megatron-LM's build-time rule that is not the model's structure: expert biases need ETP 1 ("bias
// in MoE is only supported when ETP==1"). DeepSpeed's MoE layer takes such a model (the FC1 bias
// split over expert TP, the FC2 bias whole on every expert-TP rank), so check_model leaves the rule
// to casefile::check_case, which applies it to every case but a DeepSpeed one.
std::optional<std::string> check_megatron_expert_bias(const ModelSpec& spec, const ParallelConfig& config);

// Decoder layers of one (stage, chunk), as Megatron-LM's get_transformer_layer_offset places
// them: chunk c on stage s starts at c*L/vpp + s*L/(pp*vpp) when stages are even; with uneven
// first/last stages every chunk of the model holds first/vpp, middle/vpp, ... layers in turn.
struct LayerRange {
  int first = 0;
  int count = 0;
};
// Only for a spec and sizes that pass check_model.
LayerRange layers_of(const ModelSpec& spec, int pp, int vpp, int stage, int chunk);

// "gpt: 2 layers, hidden 16, ..." or "custom: 5 params, 4 experts" for messages and headers.
std::string describe(const ModelSpec& spec);

}  // namespace tally::topologies
