#include "run/hf/section.h"

#include "casefile/case_file.h"
#include "io/json_read.h"

namespace tally::run {

using nlohmann::json;

std::string_view hf_norm_name(HfNorm norm) { return norm == HfNorm::trainer ? "trainer" : "accelerate"; }

HfConfig read_hf_config(const json& value, const std::string& path) {
  HfConfig h;
  io::read_object(
      value, path,
      {{"norm",
        [&](const json& v, const std::string& p) {
          h.norm = io::read_choice(v, p, {"accelerate", "trainer"}) == 0 ? HfNorm::accelerate : HfNorm::trainer;
        }},
       {"dp_replicate",
        [&](const json& v, const std::string& p) { h.dp_replicate = static_cast<int>(io::read_integer(v, p, 1, 1 << 20)); }},
       {"gradients_enter",
        [&](const json& v, const std::string& p) { h.before_reduction = casefile::read_before_reduction(v, p); }}},
      "the Hugging Face (transformers and accelerate) configuration");
  return h;
}

nlohmann::ordered_json hf_config_json(const HfConfig& h) {
  nlohmann::ordered_json j = {{"norm", hf_norm_name(h.norm)}, {"dp_replicate", h.dp_replicate}};
  if (h.before_reduction) j["gradients_enter"] = casefile::kBeforeReduction;
  return j;
}

}  // namespace tally::run
