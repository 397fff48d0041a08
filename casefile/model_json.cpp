#include "casefile/model_json.h"

#include <vector>

#include "io/json_read.h"
#include "topologies/moe_layer_pattern.h"
#include "topologies/presets.h"

namespace tally::casefile {

namespace {

using nlohmann::json;
using io::Field;
using io::JsonReadError;
using io::fail;
using io::parse_json;
using io::read_array;
using io::read_bool;
using io::read_bounded_file;
using io::read_choice;
using io::read_integer;
using io::read_number;
using io::read_object;
using io::read_string;
using io::shown;
using io::type_word;
using topologies::CustomParam;
using topologies::ModelKind;
using topologies::ModelSpec;

int read_int(const json& value, const std::string& path, int min) {
  return static_cast<int>(read_integer(value, path, min, topologies::kMaxSize));
}

std::vector<Field> gpt_fields(ModelSpec& s) {
  auto int_field = [](std::string_view key, int& target, int min) {
    return Field{key, [&target, min](const json& v, const std::string& p) { target = read_int(v, p, min); }};
  };
  auto optional_field = [](std::string_view key, std::optional<int>& target) {
    return Field{key, [&target](const json& v, const std::string& p) { target = read_int(v, p, 1); }};
  };
  auto bool_field = [](std::string_view key, bool& target) {
    return Field{key, [&target](const json& v, const std::string& p) { target = read_bool(v, p); }};
  };
  return {
      {"kind", [](const json&, const std::string&) {}},
      {"preset",
       [&s](const json& v, const std::string& p) {
         s.preset = read_string(v, p);
         if (!topologies::preset_from_name(s.preset))
           fail(p, "'" + s.preset + "' is not a preset (" + topologies::preset_names() + ")");
       }},
      int_field("num_layers", s.num_layers, 1),
      int_field("hidden_size", s.hidden_size, 1),
      int_field("num_attention_heads", s.num_attention_heads, 1),
      optional_field("num_query_groups", s.num_query_groups),
      optional_field("kv_channels", s.kv_channels),
      optional_field("ffn_hidden_size", s.ffn_hidden_size),
      int_field("vocab_size", s.vocab_size, 1),
      int_field("max_position_embeddings", s.max_position_embeddings, 1),
      bool_field("add_bias_linear", s.add_bias_linear),
      {"normalization",
       [&s](const json& v, const std::string& p) {
         s.normalization = static_cast<topologies::Normalization>(
             read_choice(v, p, {"LayerNorm", "RMSNorm"}));
       }},
      bool_field("qk_layernorm", s.qk_layernorm),
      {"position_embedding_type",
       [&s](const json& v, const std::string& p) {
         s.position_embedding = static_cast<topologies::PositionEmbedding>(
             read_choice(v, p, {"learned_absolute", "rope"}));
       }},
      {"softmax_type",
       [&s](const json& v, const std::string& p) {
         s.softmax_type =
             static_cast<topologies::SoftmaxType>(read_choice(v, p, {"vanilla", "learnable"}));
       }},
      bool_field("multi_latent_attention", s.multi_latent_attention),
      optional_field("q_lora_rank", s.q_lora_rank),
      int_field("kv_lora_rank", s.kv_lora_rank, 1),
      int_field("qk_head_dim", s.qk_head_dim, 1),
      int_field("qk_pos_emb_head_dim", s.qk_pos_emb_head_dim, 1),
      int_field("v_head_dim", s.v_head_dim, 1),
      bool_field("untie_embeddings_and_output_weights", s.untie_embeddings_and_output_weights),
      bool_field("swiglu", s.swiglu),
      int_field("num_experts", s.num_experts, 0),
      optional_field("moe_ffn_hidden_size", s.moe_ffn_hidden_size),
      int_field("moe_shared_expert_intermediate_size", s.moe_shared_expert_intermediate_size, 0),
      bool_field("moe_shared_expert_gate", s.moe_shared_expert_gate),
      {"moe_layer_freq",
       [&s](const json& v, const std::string& p) {
         // Megatron-LM's --moe-layer-freq: an integer, or its list expression as a string.
         if (!v.is_string()) {
           s.moe_layer_freq = read_int(v, p, 1);
           return;
         }
         try {
           s.moe_layer_pattern = topologies::parse_moe_layer_pattern(v.get<std::string>());
         } catch (const std::invalid_argument& error) {
           fail(p, error.what());
         }
       }},
      int_field("mtp_num_layers", s.mtp_num_layers, 0),
      bool_field("mtp_detach_heads", s.mtp_detach_heads),
      optional_field("decoder_first_pipeline_num_layers", s.first_stage_layers),
      optional_field("decoder_last_pipeline_num_layers", s.last_stage_layers),
  };
}

CustomParam read_custom_param(const json& value, const std::string& path) {
  CustomParam p;
  const std::vector<Field> fields = {
      {"name", [&p](const json& v, const std::string& at) { p.name = read_string(v, at); }},
      {"class",
       [&p](const json& v, const std::string& at) {
         const std::optional<topologies::ParamClass> c =
             topologies::class_from_name(read_string(v, at));
         if (!c) {
           std::string list;
           for (topologies::ParamClass known : topologies::kAllParamClasses)
             list += (list.empty() ? "" : ", ") + std::string(topologies::class_name(known));
           fail(at, "expected a class (" + list + "), got " + shown(v));
         }
         p.param_class = *c;
       }},
      {"shape",
       [&p](const json& v, const std::string& at) {
         if (!v.is_array() || v.empty() || v.size() > topologies::kMaxDims)
           fail(at, "expected an array of 1 to " + std::to_string(topologies::kMaxDims) +
                        " positive integers, got " + shown(v));
         for (std::size_t i = 0; i < v.size(); ++i)
           p.shape.push_back(read_integer(v[i], at + "[" + std::to_string(i) + "]", 1,
                                          topologies::kMaxElements));
       }},
      {"stage", [&p](const json& v, const std::string& at) { p.stage = read_int(v, at, 0); }},
      {"chunk", [&p](const json& v, const std::string& at) { p.chunk = read_int(v, at, 0); }},
      {"expert", [&p](const json& v, const std::string& at) { p.expert = read_int(v, at, 0); }},
      {"mtp", [&p](const json& v, const std::string& at) { p.mtp = read_bool(v, at); }},
      {"tied", [&p](const json& v, const std::string& at) { p.tied = read_bool(v, at); }},
      {"gradient",
       [&p](const json& v, const std::string& at) { p.gradient = stated_gradient_from_json(v, at); }},
  };
  read_object(value, path, fields, "a custom param", {"name", "class", "shape"});
  return p;
}

std::vector<Field> custom_fields(ModelSpec& s) {
  return {
      {"kind", [](const json&, const std::string&) {}},
      {"num_experts",
       [&s](const json& v, const std::string& p) { s.num_experts = read_int(v, p, 0); }},
      {"params",
       [&s](const json& v, const std::string& p) {
         if (!v.is_array()) fail(p, std::string("expected an array, got ") + type_word(v));
         if (static_cast<std::int64_t>(v.size()) > topologies::kMaxParams)
           fail(p, "has " + std::to_string(v.size()) + " params; tally supports at most " +
                       std::to_string(topologies::kMaxParams));
         s.params.reserve(v.size());
         for (std::size_t i = 0; i < v.size(); ++i)
           s.params.push_back(read_custom_param(v[i], p + "[" + std::to_string(i) + "]"));
       }},
  };
}

}  // namespace

topologies::StatedGradient stated_gradient_from_json(const json& value, const std::string& path) {
  topologies::StatedGradient g;
  if (value.is_number()) {
    g.kind = topologies::StatedGradient::Kind::constant;
    g.number = read_number(value, path);
  } else if (value.is_object()) {
    g.kind = topologies::StatedGradient::Kind::scale;
    read_object(value, path, {{"scale", [&](const json& v, const std::string& at) { g.number = read_number(v, at); }}},
                "a stated gradient", {"scale"});
  } else if (value.is_array()) {
    g.kind = topologies::StatedGradient::Kind::values;
    const json& list = read_array(value, path, static_cast<std::size_t>(topologies::kMaxStatedValues));
    if (list.empty()) fail(path, "expected one number per element, got an empty array");
    g.values.reserve(list.size());
    for (std::size_t i = 0; i < list.size(); ++i)
      g.values.push_back(read_number(list[i], path + "[" + std::to_string(i) + "]"));
  } else {
    fail(path, "expected a number (every element), {\"scale\": x} or an array of one number per "
               "element, got " + shown(value));
  }
  return g;
}

nlohmann::ordered_json stated_gradient_to_json(const topologies::StatedGradient& g) {
  switch (g.kind) {
    case topologies::StatedGradient::Kind::constant: return g.number;
    case topologies::StatedGradient::Kind::scale: return {{"scale", g.number}};
    case topologies::StatedGradient::Kind::values: return g.values;
  }
  return nullptr;
}

nlohmann::ordered_json model_spec_to_json(const ModelSpec& s) {
  nlohmann::ordered_json j;
  j["kind"] = topologies::model_kind_name(s.kind);
  if (s.kind == ModelKind::custom) {
    j["num_experts"] = s.num_experts;
    nlohmann::ordered_json params = nlohmann::ordered_json::array();
    for (const CustomParam& p : s.params) {
      nlohmann::ordered_json q;
      q["name"] = p.name;
      q["class"] = topologies::class_name(p.param_class);
      q["shape"] = p.shape;
      q["stage"] = p.stage;
      if (p.chunk != 0) q["chunk"] = p.chunk;
      if (p.expert >= 0) q["expert"] = p.expert;
      if (p.mtp) q["mtp"] = true;
      if (p.tied) q["tied"] = true;
      if (p.gradient) q["gradient"] = stated_gradient_to_json(*p.gradient);
      params.push_back(std::move(q));
    }
    j["params"] = std::move(params);
    return j;
  }
  auto optional = [&j](const char* key, const std::optional<int>& value) {
    if (value) j[key] = *value;
  };
  if (!s.preset.empty()) j["preset"] = s.preset;
  j["num_layers"] = s.num_layers;
  j["hidden_size"] = s.hidden_size;
  j["num_attention_heads"] = s.num_attention_heads;
  optional("num_query_groups", s.num_query_groups);
  optional("kv_channels", s.kv_channels);
  optional("ffn_hidden_size", s.ffn_hidden_size);
  j["vocab_size"] = s.vocab_size;
  j["max_position_embeddings"] = s.max_position_embeddings;
  j["add_bias_linear"] = s.add_bias_linear;
  j["normalization"] = topologies::normalization_name(s.normalization);
  j["qk_layernorm"] = s.qk_layernorm;
  j["position_embedding_type"] = topologies::position_embedding_name(s.position_embedding);
  j["softmax_type"] = topologies::softmax_type_name(s.softmax_type);
  if (s.multi_latent_attention) {  // only then: the sizes are not read without it
    j["multi_latent_attention"] = true;
    optional("q_lora_rank", s.q_lora_rank);
    j["kv_lora_rank"] = s.kv_lora_rank;
    j["qk_head_dim"] = s.qk_head_dim;
    j["qk_pos_emb_head_dim"] = s.qk_pos_emb_head_dim;
    j["v_head_dim"] = s.v_head_dim;
  }
  j["untie_embeddings_and_output_weights"] = s.untie_embeddings_and_output_weights;
  j["swiglu"] = s.swiglu;
  j["num_experts"] = s.num_experts;
  optional("moe_ffn_hidden_size", s.moe_ffn_hidden_size);
  j["moe_shared_expert_intermediate_size"] = s.moe_shared_expert_intermediate_size;
  j["moe_shared_expert_gate"] = s.moe_shared_expert_gate;
  if (s.moe_layer_pattern.empty())
    j["moe_layer_freq"] = s.moe_layer_freq;
  else
    j["moe_layer_freq"] = topologies::moe_layer_pattern_text(s.moe_layer_pattern);
  j["mtp_num_layers"] = s.mtp_num_layers;
  j["mtp_detach_heads"] = s.mtp_detach_heads;
  optional("decoder_first_pipeline_num_layers", s.first_stage_layers);
  optional("decoder_last_pipeline_num_layers", s.last_stage_layers);
  return j;
}

ModelSpec model_spec_from_json(const json& value, std::string_view path_view) try {
  const std::string path(path_view);
  if (!value.is_object()) fail(path, std::string("expected an object, got ") + type_word(value));
  ModelSpec spec;
  if (value.contains("kind"))
    spec.kind = static_cast<ModelKind>(read_choice(value["kind"], path + ".kind", {"gpt", "custom"}));
  if (spec.kind == ModelKind::gpt) {
    read_object(value, path, gpt_fields(spec), "a gpt model");
    // A size of multi-latent attention without it would be silently unused.
    if (!spec.multi_latent_attention)
      for (const char* key : {"q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"})
        if (value.contains(key))
          fail(path + "." + key, "is a size of multi-latent attention: set multi_latent_attention true, or leave it out");
  }
  else
    read_object(value, path, custom_fields(spec), "a custom layout", {"params"});
  return spec;
} catch (const JsonReadError& error) {
  throw ModelJsonError(error.what());
}

ModelSpec model_spec_from_text(std::string_view text, std::string_view source) {
  json parsed;
  try {
    parsed = parse_json(text, source);
  } catch (const JsonReadError& error) {
    throw ModelJsonError(error.what());
  }
  return model_spec_from_json(parsed, "model");
}

ModelSpec load_model_spec(const std::string& file) {
  // Bounded read: a model file is small; a huge or endless input is an error, not a hang.
  constexpr std::size_t kMaxFileBytes = std::size_t{64} << 20;
  std::string text;
  try {
    text = read_bounded_file(file, kMaxFileBytes, "model file");
  } catch (const JsonReadError& error) {
    throw ModelJsonError(error.what());
  }
  return model_spec_from_text(text, file);
}

}  // namespace tally::casefile
