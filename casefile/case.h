// A case: one parallel configuration, one model, one optimizer model with its gradients and
// statistics, the faults switched on, and what the run is expected to give. The unit the fuzzer
// generates and shrinks, case files store, and `tally run` and `tally replay` run.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "vocab/path_options.h"
#include "topologies/model_spec.h"
#include "topologies/parallel_config.h"

namespace tally::casefile {

struct Expectation {
  enum class Outcome { pass, fail, infra_error };
  Outcome outcome = Outcome::pass;
  // For fail: statistics that must fail ("l2", "zeros", "agreement", "clipped", "ledger", ...)
  // and logical params that must be miscounted. Empty: any failure will do.
  std::vector<std::string> statistics;
  std::vector<std::string> miscounted;
  friend bool operator==(const Expectation&, const Expectation&) = default;
};
std::string_view outcome_name(Expectation::Outcome outcome);  // "pass", "fail", "infra-error"

// The real framework a case runs on instead of tally's model of the path (tally fuzz --target):
// its name and the version its worker reported, and the manifests the run that found the case
// wrote, saved next to the case file, so replay can judge them where the framework is absent.
struct RealTarget {
  std::string framework;  // "megatron-core", "deepspeed", "torchtitan", "automodel"
  std::string version;    // "0.19.2"
  std::string manifests;  // folder, relative to the case file's folder; "" when none was saved
  friend bool operator==(const RealTarget&, const RealTarget&) = default;
};
inline constexpr std::string_view kKnownFrameworks[] = {"megatron-core", "deepspeed", "torchtitan", "automodel"};

// DeepSpeed's engine configuration, read only by the deepspeed target (adapters/tally_adapters/deepspeed). With
// the gradient dtype (the engine's precision) it picks the code that computes DeepSpeed's norm:
// ZeRO 0 fp32 clip_grad_norm_, ZeRO 0 bf16/fp16 FP16_UnfusedOptimizer (FP16_Optimizer with
// fused_adam), ZeRO 1 bf16 with fp32 accumulation BF16_Optimizer, ZeRO 1/2 DeepSpeedZeroOptimizer
// (docs/real-targets.md).
struct DeepSpeedConfig {
  int zero_stage = 0;            // 0..3
  bool grad_accum_fp32 = false;  // "data_types": {"grad_accum_dtype": "fp32"}
  int loss_scale = 128;          // fp16's static loss scale: a power of two, 1..2^16
  bool autotp = false;           // DeepSpeed's AutoTP shards the model over TP, not tally's worker
  bool autoep = false;           // DeepSpeed's AutoEP replaces the MoE layers, not DeepSpeed's MoE
  bool fused_adam = false;       // DeepSpeed's FusedAdam, not torch's AdamW: FP16_Optimizer at ZeRO 0 (not bf16 with PP)
  bool offload_optimizer = false;  // ZeRO-Offload to the CPU (ZeRO 1/2): DeepSpeedZeroOptimizer's CPU-offload norm
  friend bool operator==(const DeepSpeedConfig&, const DeepSpeedConfig&) = default;
};

// How a PyTorch-native trainer counts, read only by the torchtitan target
// (adapters/tally_adapters/torchtitan): whose clip runs over the DTensor params, the SPMD backend
// torchtitan lays them out with, and the HSDP replicate degree (DP = dp_replicate x dp_shard).
enum class DTensorClip : std::uint8_t {
  torchtitan,  // torchtitan.distributed.utils.clip_grad_norm_: the EP and non-EP halves, then PP
  torch,       // torch.nn.utils.clip_grad_norm_ over every param, as most FSDP2 users call it
};
enum class SpmdBackend : std::uint8_t {
  full_dtensor,     // every param a DTensor of the dense (or sparse) mesh, FSDP over its DP dims
  partial_dtensor,  // DTensor for the model-parallel dims; fully_shard over (dp_replicate, fsdp)
};
std::string_view dtensor_clip_name(DTensorClip clip);         // "torchtitan" | "torch"
std::string_view spmd_backend_name(SpmdBackend backend);     // "full_dtensor" | "partial_dtensor"
struct TorchTitanConfig {
  DTensorClip clip = DTensorClip::torchtitan;
  SpmdBackend spmd_backend = SpmdBackend::full_dtensor;
  int dp_replicate = 1;  // HSDP's replicate degree; divides DP, the rest is dp_shard
  // Where tally's gradients enter: after FSDP2's reduce-scatter (each rank's reduced shard written
  // in), or before it (each rank's own contribution, as backward leaves it, reduced by FSDP2).
  bool before_reduction = false;
  friend bool operator==(const TorchTitanConfig&, const TorchTitanConfig&) = default;
};

// How NeMo-Automodel lays a case out, read only by the automodel target
// (adapters/tally_adapters/automodel): the HSDP replicate degree of its FSDP2 mesh (DP =
// dp_replicate x dp_shard; Automodel's `distributed.dp_replicate_size`) and whether its TP plan
// shards the sequence (`distributed.sequence_parallel`).
struct AutomodelConfig {
  int dp_replicate = 1;
  bool sequence_parallel = false;
  // Where tally's gradients enter: after FSDP2's reduction, or before it (each rank's contribution,
  // averaged by FSDP2's own reduce-scatter over dp_shard_cp and all-reduce over dp_replicate).
  bool before_reduction = false;
  friend bool operator==(const AutomodelConfig&, const AutomodelConfig&) = default;
};

// Megatron-FSDP (DistributedDataParallelConfig.use_megatron_fsdp), read only by the megatron-core
// target (adapters/tally_adapters/megatron): how its buffers shard over DP
// (data_parallel_sharding_strategy), and, with several optimizer instances
// (topology.dist_opt_instances, hybrid FSDP), across them (outer_dp_sharding_strategy).
enum class FsdpSharding : std::uint8_t { no_shard, optim, optim_grads, optim_grads_params };
inline constexpr FsdpSharding kFsdpShardings[] = {FsdpSharding::no_shard, FsdpSharding::optim,
                                                  FsdpSharding::optim_grads, FsdpSharding::optim_grads_params};
enum class FsdpOuterSharding : std::uint8_t { no_shard, optim };
std::string_view fsdp_sharding_name(FsdpSharding sharding);              // "no_shard", ..., "optim_grads_params"
std::string_view fsdp_outer_sharding_name(FsdpOuterSharding sharding);  // "no_shard" | "optim"
struct MegatronFsdpConfig {
  FsdpSharding sharding = FsdpSharding::optim_grads_params;  // Megatron-LM's default
  FsdpOuterSharding outer_sharding = FsdpOuterSharding::no_shard;
  friend bool operator==(const MegatronFsdpConfig&, const MegatronFsdpConfig&) = default;
};

struct Case {
  std::string description;
  topologies::ParallelConfig topology;
  topologies::ModelSpec model;
  vocab::PathOptions path;
  std::optional<DeepSpeedConfig> deepspeed;  // only for the deepspeed target
  std::optional<TorchTitanConfig> torchtitan;  // only for the torchtitan target
  std::optional<MegatronFsdpConfig> megatron_fsdp;  // only for the megatron-core target
  std::optional<AutomodelConfig> automodel;  // only for the automodel target
  std::optional<RealTarget> target;  // absent: tally's model of the path (the model target)
  std::optional<Expectation> expect;
  friend bool operator==(const Case&, const Case&) = default;
};

// Resets the sections of `c` that only frameworks other than `framework` read (deepspeed,
// torchtitan, automodel; megatron_fsdp, which megatron-core reads): a target's projection of a case
// into its space keeps its own section alone.
void drop_other_frameworks_sections(Case& c, std::string_view framework);

// A case that breaks a rule of the configuration, the model or the options. exit code 2.
class InvalidCase : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The first problem with the case as one line, or nullopt: check_config, check_model for the
// configuration, and the option rules (finite p > 0, finite max_norm >= 0, ...).
std::optional<std::string> check_case(const Case& c);

// Drops the stated gradients (gradients.stated) for a param or class the model no longer has, as
// after a real target removed a feature (an MTP layer, an attention sink, ...). `naming`: the
// topology the params are named in (a tied copy is a param of its own only with PP > 1).
void drop_stated_gradients_without_a_param(Case& c, const topologies::ParallelConfig& naming);

}  // namespace tally::casefile
