#include "run/torchtitan/section.h"

#include "casefile/case_file.h"
#include "io/json_read.h"

namespace tally::run {

using nlohmann::json;

std::string_view dtensor_clip_name(DTensorClip clip) { return clip == DTensorClip::torch ? "torch" : "torchtitan"; }

std::string_view spmd_backend_name(SpmdBackend backend) {
  return backend == SpmdBackend::partial_dtensor ? "partial_dtensor" : "full_dtensor";
}

TorchTitanConfig read_torchtitan_config(const json& value, const std::string& path) {
  TorchTitanConfig d;
  io::read_object(
      value, path,
      {{"clip",
        [&](const json& v, const std::string& p) {
          d.clip = io::read_choice(v, p, {"torchtitan", "torch"}) == 0 ? DTensorClip::torchtitan : DTensorClip::torch;
        }},
       {"spmd_backend",
        [&](const json& v, const std::string& p) {
          d.spmd_backend = io::read_choice(v, p, {"full_dtensor", "partial_dtensor"}) == 0 ? SpmdBackend::full_dtensor
                                                                                          : SpmdBackend::partial_dtensor;
        }},
       {"dp_replicate",
        [&](const json& v, const std::string& p) { d.dp_replicate = static_cast<int>(io::read_integer(v, p, 1, 1 << 20)); }},
       {"gradients_enter",
        [&](const json& v, const std::string& p) {
          d.before_reduction = casefile::read_before_reduction(v, p);
        }}},
      "the torchtitan configuration");
  return d;
}

nlohmann::ordered_json torchtitan_config_json(const TorchTitanConfig& d) {
  nlohmann::ordered_json j = {{"clip", dtensor_clip_name(d.clip)},
                              {"spmd_backend", spmd_backend_name(d.spmd_backend)},
                              {"dp_replicate", d.dp_replicate}};
  // absent: after the reduction, as in earlier case files (whose digests stay theirs)
  if (d.before_reduction) j["gradients_enter"] = casefile::kBeforeReduction;
  return j;
}

}  // namespace tally::run
