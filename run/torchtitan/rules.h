// The part of tally's case space the torchtitan worker executes
// (adapters/tally_adapters/torchtitan/worker.py): tally's GPT/MoE model as a torchtitan decoder
// (tok_embeddings, layers, norm, lm_head; each MoE layer's routed experts stacked into one tensor
// per weight, as torchtitan's grouped experts are), its params DTensors on torchtitan's own meshes
// (ParallelDims: pp, dp_replicate, dp_shard, cp, tp; the sparse mesh pp, dp_replicate, efsdp, ep)
// sharded by torchtitan's FSDP2 wrapping (apply_fsdp_to_decoder), and the norm computed by
// torchtitan's clip_grad_norm_ or by torch.nn.utils.clip_grad_norm_ (the case's `torchtitan`
// section). A preset case on one stage is torchtitan's own model of its family instead, placed by
// the family's sharding config and parallelize (torchtitan_family). What lies outside is named with the reason, so `tally run --target torchtitan` refuses
// such a case in one line and the fuzzer never generates one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "casefile/case.h"
#include "run/contributions.h"
#include "run/framework_worker.h"

namespace tally::run {

// Why the torchtitan worker at `version` cannot execute `c`, as one line naming the field and the
// rule; nullopt when it can. Faults must be among those the worker plants (`plants`, its hello's).
std::optional<std::string> torchtitan_refusal(const casefile::Case& c, std::string_view version,
                                                  const FaultPlants& plants = {});

// `c` within the worker's space: VPP 1, tally's default order, one optimizer instance, the plain
// optimizer model, fp32 gradients (FSDP2 reduces and holds them in fp32, torchtitan's default),
// ETP 1 with EP (torchtitan's experts are whole per EP rank) and TP without it (sharded like the
// dense MLP), EP dividing the experts and dp_shard x cp x tp, an untied output with PP (torchtitan
// refuses tying there). A case without a `torchtitan` section gets one drawn from `draw`: whose
// clip (torch's only where it runs: no PP, no EP; torchtitan's where a fault is planted in its
// clip), the SPMD backend, and the HSDP replicate degree (a divisor of DP that leaves EP its ranks).
// A custom layout has no torchtitan counterpart and is returned as it is.
casefile::Case within_torchtitan(casefile::Case c, const FaultPlants& plants, std::uint64_t draw);

// The code that computes the norm of `c`: "torchtitan clip_grad_norm_", "torchtitan
// _clip_grad_norm_with_ep" (EP > 1) or "torch.nn.utils.clip_grad_norm_", then the SPMD backend
// (" on full_dtensor").
std::string torchtitan_norm_code(const casefile::Case& c);

// `base` under each clip and SPMD backend, with FSDP and with HSDP replicating over two, each with
// the gradients entering after FSDP2's reduction and before it ("torchtitan-full_dtensor",
// "torchtitan-full_dtensor-unreduced", "torchtitan-full_dtensor-hsdp", ...,
// "torch-partial_dtensor-hsdp-unreduced"); the worker's refusals decide which run.
std::vector<std::pair<std::string, casefile::Case>> torchtitan_sweep_variants(const casefile::Case& base);

// The configuration the worker builds torchtitan with (`case-<K>.engine.json`, and `tally show`), in
// the names of torchtitan's job config: `parallelism` (data_parallel_replicate_degree,
// data_parallel_shard_degree, context_parallel_degree, tensor_parallel_degree,
// pipeline_parallel_degree, expert_parallel_degree, spmd_backend), `training.max_norm`, and `clip`
// ("torchtitan" or "torch").
nlohmann::ordered_json torchtitan_job_config(const casefile::Case& c);

// How FSDP2 reduces `c`'s gradients under torchtitan, where the case's gradients enter before that
// reduction (nullopt where they enter after it): a dense gradient summed over its FSDP mesh
// (dp_replicate x dp_shard x cp), a routed expert's with EP over the sparse mesh's (dp_replicate x
// efsdp, efsdp = dp_shard x cp x tp / ep: torchtitan/distributed/parallel_dims.py:279), a param TP
// replicates over the stage's every rank (its gradient is Partial over TP under torchtitan's
// sequence parallelism, and FSDP2 all-reduces it over TP first: torch/distributed/fsdp/
// _fully_shard/_fsdp_param.py `_get_grad_inner_tensor`), never
// divided (apply_fsdp_to_decoder sets every FSDP module's gradient_divide_factor to 1:
// torchtitan/distributed/fsdp.py:27-41, :316; the trainer scales the loss by the global token count).
std::optional<ReductionGroups> torchtitan_reduction_groups(const casefile::Case& c);

// torchtitan 0.3.0's own model family the worker builds `c` as: its preset's ("llama3", "qwen3",
// "gpt_oss", "deepseek_v3"; tally_adapters/torchtitan/families.py) on one pipeline stage; empty
// where it builds tally's model as its own decoder (no preset, mixtral, or PP).
std::string_view torchtitan_family(const casefile::Case& c);

// One line of what the worker gives torchtitan, for `tally show`.
std::string torchtitan_model_description(const casefile::Case& c);

}  // namespace tally::run
