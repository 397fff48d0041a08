#include "run/deepspeed/section.h"

#include "io/json_read.h"

namespace tally::run {

using nlohmann::json;

DeepSpeedConfig read_deepspeed_config(const json& value, const std::string& path) {
  DeepSpeedConfig d;
  io::read_object(
      value, path,
      {{"zero_stage", [&](const json& v, const std::string& p) { d.zero_stage = static_cast<int>(io::read_integer(v, p, 0, 3)); }},
       {"grad_accum_fp32", [&](const json& v, const std::string& p) { d.grad_accum_fp32 = io::read_bool(v, p); }},
       {"autotp", [&](const json& v, const std::string& p) { d.autotp = io::read_bool(v, p); }},
       {"autoep", [&](const json& v, const std::string& p) { d.autoep = io::read_bool(v, p); }},
       {"fused_adam", [&](const json& v, const std::string& p) { d.fused_adam = io::read_bool(v, p); }},
       {"offload_optimizer", [&](const json& v, const std::string& p) { d.offload_optimizer = io::read_bool(v, p); }},
       {"launcher",
        [&](const json& v, const std::string& p) {
          d.launcher = static_cast<DeepSpeedLauncher>(io::read_choice(v, p, {"deepspeed", "accelerate", "trainer"}));
        }},
       {"loss_scale",
        [&](const json& v, const std::string& p) {
          d.loss_scale = static_cast<int>(io::read_integer(v, p, 1, 1 << 16));
          if (d.loss_scale & (d.loss_scale - 1))
            io::fail(p, "expected a power of two (a loss scale that keeps every gradient exact), got " +
                            std::to_string(d.loss_scale));
        }}},
      "the DeepSpeed configuration");
  return d;
}

nlohmann::ordered_json deepspeed_config_json(const DeepSpeedConfig& d) {
  nlohmann::ordered_json j = {{"zero_stage", d.zero_stage}, {"grad_accum_fp32", d.grad_accum_fp32}, {"loss_scale", d.loss_scale}};
  // absent: false, as in earlier case files
  if (d.autotp) j["autotp"] = true;
  if (d.autoep) j["autoep"] = true;
  if (d.fused_adam) j["fused_adam"] = true;
  if (d.offload_optimizer) j["offload_optimizer"] = true;
  if (d.launcher != DeepSpeedLauncher::deepspeed) j["launcher"] = deepspeed_launcher_name(d.launcher);
  return j;
}

}  // namespace tally::run
