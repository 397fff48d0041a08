#include "fuzz/model_json.h"

#include <fstream>
#include <functional>
#include <limits>
#include <unordered_set>
#include <vector>

namespace tally::fuzz {

namespace {

using nlohmann::json;
using topologies::CustomParam;
using topologies::ModelKind;
using topologies::ModelSpec;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw ModelJsonError(path + ": " + why);
}

// The value as it was written, shortened so a message stays one line.
std::string shown(const json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

const char* type_word(const json& value) {
  if (value.is_object()) return "an object";
  if (value.is_array()) return "an array";
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "a boolean";
  if (value.is_null()) return "null";
  return "a number";
}

std::int64_t read_integer(const json& value, const std::string& path, std::int64_t min,
                          std::int64_t max) {
  const std::string expected =
      min == 1   ? "a positive integer"
      : min == 0 ? "an integer >= 0"
                 : "an integer >= " + std::to_string(min);
  const std::string range = expected + " at most " + std::to_string(max);
  if (!value.is_number_integer()) fail(path, "expected " + expected + ", got " + shown(value));
  if (value.is_number_unsigned()) {
    // Non-negative literals parse as unsigned; compare before narrowing.
    const std::uint64_t v = value.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(max)) fail(path, "expected " + range + ", got " + shown(value));
    if (static_cast<std::int64_t>(v) < min) fail(path, "expected " + expected + ", got " + shown(value));
    return static_cast<std::int64_t>(v);
  }
  const std::int64_t v = value.get<std::int64_t>();
  if (v < min) fail(path, "expected " + expected + ", got " + shown(value));
  if (v > max) fail(path, "expected " + range + ", got " + shown(value));
  return v;
}

int read_int(const json& value, const std::string& path, int min) {
  return static_cast<int>(read_integer(value, path, min, topologies::kMaxSize));
}

bool read_bool(const json& value, const std::string& path) {
  if (!value.is_boolean()) fail(path, "expected true or false, got " + shown(value));
  return value.get<bool>();
}

std::string read_string(const json& value, const std::string& path) {
  if (!value.is_string()) fail(path, "expected a string, got " + shown(value));
  return value.get<std::string>();
}

// One of `names`, returned as its index.
int read_choice(const json& value, const std::string& path, std::vector<std::string_view> names) {
  const std::string text = read_string(value, path);
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == text) return static_cast<int>(i);
  std::string list;
  for (std::size_t i = 0; i < names.size(); ++i) list += (i ? ", " : "") + std::string(names[i]);
  fail(path, "expected one of " + list + ", got " + shown(value));
}

// A reader for one key of an object.
using FieldReader = std::function<void(const json& value, const std::string& path)>;
struct Field {
  std::string_view key;
  FieldReader read;
};

void read_object(const json& object, const std::string& path, const std::vector<Field>& fields,
                 std::string_view what, std::vector<std::string_view> required = {}) {
  if (!object.is_object()) fail(path, std::string("expected an object, got ") + type_word(object));
  for (const auto& [key, value] : object.items()) {
    const Field* field = nullptr;
    for (const Field& f : fields)
      if (f.key == key) field = &f;
    if (!field) fail(path + "." + key, "unknown key for " + std::string(what));
    field->read(value, path + "." + key);
  }
  for (std::string_view key : required)
    if (!object.contains(std::string(key)))
      fail(path, "missing key '" + std::string(key) + "' for " + std::string(what));
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
      bool_field("untie_embeddings_and_output_weights", s.untie_embeddings_and_output_weights),
      bool_field("swiglu", s.swiglu),
      int_field("num_experts", s.num_experts, 0),
      optional_field("moe_ffn_hidden_size", s.moe_ffn_hidden_size),
      int_field("moe_shared_expert_intermediate_size", s.moe_shared_expert_intermediate_size, 0),
      bool_field("moe_shared_expert_gate", s.moe_shared_expert_gate),
      int_field("moe_layer_freq", s.moe_layer_freq, 1),
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

// nlohmann keeps the last of repeated keys; a case file with two values for one field is
// ambiguous, so it is rejected.
json parse_rejecting_duplicates(std::string_view text, std::string_view source) {
  std::vector<std::unordered_set<std::string>> keys;
  std::string duplicate;
  const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text.begin(), text.end(), callback);
  } catch (const json::parse_error& error) {
    std::string what = error.what();
    for (char& ch : what)
      if (ch == '\n' || ch == '\r') ch = ' ';
    throw ModelJsonError(std::string(source) + ": invalid JSON: " + what);
  }
  if (!duplicate.empty())
    throw ModelJsonError(std::string(source) + ": key '" + duplicate +
                         "' appears twice in one object");
  return parsed;
}

}  // namespace

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
      params.push_back(std::move(q));
    }
    j["params"] = std::move(params);
    return j;
  }
  auto optional = [&j](const char* key, const std::optional<int>& value) {
    if (value) j[key] = *value;
  };
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
  j["untie_embeddings_and_output_weights"] = s.untie_embeddings_and_output_weights;
  j["swiglu"] = s.swiglu;
  j["num_experts"] = s.num_experts;
  optional("moe_ffn_hidden_size", s.moe_ffn_hidden_size);
  j["moe_shared_expert_intermediate_size"] = s.moe_shared_expert_intermediate_size;
  j["moe_shared_expert_gate"] = s.moe_shared_expert_gate;
  j["moe_layer_freq"] = s.moe_layer_freq;
  j["mtp_num_layers"] = s.mtp_num_layers;
  j["mtp_detach_heads"] = s.mtp_detach_heads;
  optional("decoder_first_pipeline_num_layers", s.first_stage_layers);
  optional("decoder_last_pipeline_num_layers", s.last_stage_layers);
  return j;
}

ModelSpec model_spec_from_json(const json& value, std::string_view path_view) {
  const std::string path(path_view);
  if (!value.is_object()) fail(path, std::string("expected an object, got ") + type_word(value));
  ModelSpec spec;
  if (value.contains("kind"))
    spec.kind = static_cast<ModelKind>(read_choice(value["kind"], path + ".kind", {"gpt", "custom"}));
  if (spec.kind == ModelKind::gpt)
    read_object(value, path, gpt_fields(spec), "a gpt model");
  else
    read_object(value, path, custom_fields(spec), "a custom layout", {"params"});
  return spec;
}

ModelSpec model_spec_from_text(std::string_view text, std::string_view source) {
  return model_spec_from_json(parse_rejecting_duplicates(text, source), "model");
}

ModelSpec load_model_spec(const std::string& file) {
  // Bounded read: a model file is small; a huge or endless input is an error, not a hang.
  constexpr std::size_t kMaxFileBytes = std::size_t{64} << 20;
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ModelJsonError(file + ": cannot open the model file");
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxFileBytes)
      throw ModelJsonError(file + ": larger than " + std::to_string(kMaxFileBytes >> 20) +
                           " MiB, more than a model file holds");
  }
  if (in.bad()) throw ModelJsonError(file + ": cannot read the model file");
  return model_spec_from_text(text, file);
}

}  // namespace tally::fuzz
