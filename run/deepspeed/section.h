// DeepSpeed's case section, `deepspeed`: the engine configuration the DeepSpeed worker
// (adapters/tally_adapters/deepspeed) builds DeepSpeed with. With the gradient dtype (the engine's
// precision) it picks the code that computes DeepSpeed's norm: ZeRO 0 fp32 clip_grad_norm_, ZeRO 0
// bf16/fp16 FP16_UnfusedOptimizer (FP16_Optimizer with fused_adam), ZeRO 1 bf16 with fp32
// accumulation BF16_Optimizer, ZeRO 1/2 DeepSpeedZeroOptimizer (docs/real-targets.md).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "run/case_section.h"

namespace tally::run {

// Who builds the engine: DeepSpeed's own deepspeed.initialize (the worker's call), or accelerate's
// Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=...)).prepare, as a Hugging Face user
// with a DeepSpeed config gets it, the norm being what accelerate's clip_grad_norm_ returns
// (`accelerate`), or the accelerator of a transformers Trainer made with
// TrainingArguments(deepspeed=...), the norm what the Trainer logs, _get_grad_norm (`trainer`).
enum class DeepSpeedLauncher { deepspeed, accelerate, trainer };
inline constexpr std::string_view kDeepSpeedLauncherNames[] = {"deepspeed", "accelerate", "trainer"};
inline std::string_view deepspeed_launcher_name(DeepSpeedLauncher l) { return kDeepSpeedLauncherNames[static_cast<int>(l)]; }

struct DeepSpeedConfig {
  int zero_stage = 0;            // 0..3
  bool grad_accum_fp32 = false;  // "data_types": {"grad_accum_dtype": "fp32"}
  int loss_scale = 128;          // fp16's static loss scale: a power of two, 1..2^16
  bool autotp = false;           // DeepSpeed's AutoTP shards the model over TP, not tally's worker
  bool autoep = false;           // DeepSpeed's AutoEP replaces the MoE layers, not DeepSpeed's MoE
  bool fused_adam = false;       // DeepSpeed's FusedAdam, not torch's AdamW: FP16_Optimizer at ZeRO 0 (not bf16 with PP)
  bool offload_optimizer = false;  // ZeRO-Offload to the CPU (ZeRO 1/2): DeepSpeedZeroOptimizer's CPU-offload norm
  DeepSpeedLauncher launcher = DeepSpeedLauncher::deepspeed;
  friend bool operator==(const DeepSpeedConfig&, const DeepSpeedConfig&) = default;
};

// Strict: an unknown key, a wrong type or a value out of range throws io::JsonReadError naming the field.
DeepSpeedConfig read_deepspeed_config(const nlohmann::json& value, const std::string& path);
// The canonical JSON (the flags that are false, and the launcher deepspeed, left out, as earlier case files wrote them).
nlohmann::ordered_json deepspeed_config_json(const DeepSpeedConfig& d);

// The section, `deepspeed` in a case. Its worker builds DeepSpeed's own models (its MoE takes
// expert biases Megatron-LM refuses with expert TP).
inline constexpr CaseSection<DeepSpeedConfig> kDeepSpeedSection{
    .key = "deepspeed", .read = read_deepspeed_config, .write = deepspeed_config_json, .own_models = true};

}  // namespace tally::run
