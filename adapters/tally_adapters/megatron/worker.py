#!/usr/bin/env python3
"""tally's worker for megatron-core: executes tally's cases with Megatron's own, unmodified code
and writes the manifests `tally` judges (`tally fuzz|run|replay --target megatron-core`).

Started by tally, once per world size, under torchrun (one process per rank):

    torchrun --standalone --nproc-per-node WORLD -m tally_adapters.megatron.worker \\
        --queue DIR --parent-pid PID [--backend auto|nccl|gloo]

The ranks stay up across cases. Per case (the files of the queue folder are described in
docs/real-targets.md): rank 0 waits for `case-<K>.json` (a tally case) and tells the others,
which read it too; every rank
rebuilds Megatron's parallel state for the case's topology (`initialize_model_parallel` with its
TP, PP, VPP, CP, EP, ETP, rank order and distributed-optimizer instances), builds the case's GPT
model from Megatron's local layer spec (`get_gpt_decoder_block_spec(use_transformer_engine=
False)`: no Transformer Engine, no Apex), wraps each model chunk in Megatron's
DistributedDataParallel (or, for a case with a `megatron_fsdp` section, in Megatron-FSDP's
FullyShardedDataParallel with its strategies), builds the case's optimizer with `get_megatron_optimizer` (plain:
chained Adam; distributed: the DistributedOptimizer; layerwise: Muon with the layer-wise
distributed optimizer, over megatron-core 0.19's parameter layout where the case's
`optimizer.layer_wise_param_layout` asks for it; muon: Muon without it), sets every param's gradient buffer (`main_grad`)
to the values tally's generator gives the logical element it holds (`case-<K>.gradients.*`),
runs `prepare_grads`, `get_grad_norm` and `count_zeros` (and, for MTP heads with a norm of their
own, megatron-core 0.19's `_compute_grad_norms_by_group`), and writes the manifests with
`tally_adapters.megatron.dump_manifest` into `case-<K>/`. Rank 0 then writes `case-<K>.result.json`.

What the worker changes around Megatron, and why (never a Megatron file):
- No forward or backward pass runs: the gradients are set, as after Megatron's own gradient
  reductions (every replica of an element holds the same value), so the norm step sees exactly
  the gradients tally's truth is made of.
- Sequence parallelism is off and the model's TransformerConfig says CP 1 while the parallel
  state has the case's CP: the local spec's torch norms refuse sequence parallelism and its
  attention refuses CP, and neither changes a parameter. DDP and the optimizers read the real CP
  groups from the parallel state.
- With more ranks than GPUs the default process group is gloo (NCCL refuses two ranks of one
  communicator on one GPU); Megatron's groups then use gloo too. No collective of a training step
  is run, so none of gloo's gaps (coalesced all-reduce on CUDA tensors) is reached.
- Megatron's parallel state is kept from one case to the next while the topology is the same (a
  sweep runs a layout's cases one after another; a shrink keeps the topology of the case it
  shrinks): making the groups is most of a case's time on gloo. Another topology, or a case that
  raised on any rank, has every rank destroy its groups and make them anew, so hundreds of cases
  do not exhaust sockets or file descriptors.
- Megatron-FSDP: its main gradients are fp32 (`megatron_fsdp_main_grads_dtype`; Megatron-LM's
  default is the params' bf16), each rank writes the range of each param its buffer shard holds,
  and the optimizer gets them through Megatron-FSDP's own `update_main_grads`; its gradient
  reduction (`finish_grad_sync`, a reduce-scatter gloo lacks) is not run, as DDP's is not.
- megatron-core 0.16.1's Muon calls emerging_optimizers with a keyword 0.3.0 renamed
  (`use_nesterov`): translated at construction (muon_compat.py).
"""

import functools
import gc
import sys

from .. import worker as base
from ..queue import framework_setup, thread_names_of_this_process, threads_of_this_process
from . import manifest as tally_megatron
from .muon_compat import emerging_optimizers_compat

# --- planted faults (the real mutation score) ---------------------------------------------------------
#
# A catalog fault (`tally run --list-faults`) with a counterpart in Megatron is planted for one case
# by replacing, in every loaded megatron module that imported it, the function that decides the
# rule; the original is put back after the case. Megatron's files are never touched. The adapter
# reads the same functions when it records what was kept, so the manifests show the planted rule.


def _plant_no_dedup_filter(orig):
    return lambda param, *args, **kwargs: True


def _plant_expert_dedup_on_dense_tp(orig):
    # Megatron-LM #6099: no TP groups reach the filter, which falls back to the dense TP rank.
    return lambda param, *args, **kwargs: orig(param)


def _plant_tied_copy_not_shared(orig):
    return lambda param: True


def _reducing_all_reduce(orig, how):
    import torch.distributed as dist

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if how == "world":
            group = None
        work = orig(tensor, op=op, group=group, async_op=async_op)
        if how == "average" and op == dist.ReduceOp.SUM:
            tensor.div_(dist.get_world_size(group))
        return work

    return all_reduce


def _plant_reduction(orig, how):
    """get_grad_norm_fp32 whose all-reduces average the group's sums (`average`) or run over the
    whole world instead of the stats group (`world`)."""
    import torch.distributed as dist

    def get_grad_norm_fp32(*args, **kwargs):
        saved = dist.all_reduce
        dist.all_reduce = _reducing_all_reduce(saved, how)
        try:
            return orig(*args, **kwargs)
        finally:
            dist.all_reduce = saved

    return get_grad_norm_fp32


# fault -> ([(the module of the function it replaces, the function, how to make the replacement)], how)
PLANTS = {
    "no-dedup-filter": (
        [("megatron.core.tensor_parallel.layers", "param_is_not_tensor_parallel_duplicate", _plant_no_dedup_filter)],
        "param_is_not_tensor_parallel_duplicate keeps every param",
    ),
    "expert-dedup-on-dense-tp": (
        [("megatron.core.tensor_parallel.layers", "param_is_not_tensor_parallel_duplicate", _plant_expert_dedup_on_dense_tp)],
        "param_is_not_tensor_parallel_duplicate called without its TP groups (Megatron-LM #6099)",
    ),
    "tied-copy-not-shared": (
        [("megatron.core.transformer.module", "param_is_not_shared", _plant_tied_copy_not_shared)],
        "param_is_not_shared keeps the last stage's tied copy",
    ),
    "average-rank-norms": (
        [("megatron.core.optimizer.clip_grads", "get_grad_norm_fp32", lambda orig: _plant_reduction(orig, "average"))],
        "get_grad_norm_fp32 averages the stats group's sums of squares instead of adding them",
    ),
    "stats-over-replicas": (
        [("megatron.core.optimizer.clip_grads", "get_grad_norm_fp32", lambda orig: _plant_reduction(orig, "world"))],
        "get_grad_norm_fp32 reduces over the whole world instead of the child's stats group",
    ),
}

# Catalog faults without a counterpart planted here, and why.
NOT_PLANTED = {
    "allreduce-flag-lost-on-main-params": "megatron-core 0.16 and later copy allreduce to main params "
    "in several places (no one function to replace)",
    "expert-weights-not-tp-marked": "an attribute of the params: the adapter derives each param's box from "
    "the same attributes, so the manifests would describe another model",
    "expert-label-from-ep-only": "decided while the layers are built (the allreduce attribute): as "
    "expert-weights-not-tp-marked",
    "expert-label-ignores-gtp": "needs generalized TP, which needs Transformer Engine",
    "muon-expert-stats-without-egtp": "needs generalized TP, which needs Transformer Engine",
    "expert-stats-over-dense-mp": "the param grouping of get_megatron_muon_optimizer, not one function",
    # The clip itself is recorded (each child's coefficient, its clipped gradients): these wrong
    # norms are decided inside the optimizers' step(), with no function of their own to replace.
    "clip-per-child-norm": "the norm each child clips with is chosen inside ChainedOptimizer.step, not one function",
    "clip-per-stage-norm": "the norm each stage clips with is chosen inside the optimizer's step, not one function",
    "clip-per-ep-group-norm": "the norm each EP group clips with is chosen inside the optimizer's step, not one function",
    "tp-sharded-param-unmarked": "the releases miscount attention sinks themselves (no fault to plant): "
    "the local DotProductAttention's softmax_offset is never marked tensor_model_parallel",
    "replicated-marked-tp": "an attribute of the params: the adapter derives each param's box from it",
    "expert-norm-dropped": "the chained optimizer's combination of children, not one function",
    "missing-ep-reduction": "the stats group is the child's (one ProcessGroup): no EP part to drop alone",
    "missing-pp-reduction": "the stats group is the child's (one ProcessGroup): no PP part to drop alone",
    "zero-count-in-float32": "needs a tensor of 2^24 elements, beyond the worker's small models",
    "empty-rank-skips-collective": "a hang: the worker would be stopped, not judged",
    "inf-norm-combined-by-l2": "the worker reports the L2 norm only",
    "distopt-padding-counted": "the DistributedOptimizer's buffer layout, not one function",
    "distopt-overlapping-shards": "the DistributedOptimizer's buffer layout, not one function",
    "average-local-norms-over-dp": "two reductions of one rank's norm: not one function",
    "tp-marking-unseen-by-filter": "param_is_not_tensor_parallel_duplicate reads the param's own mark, which "
    "the adapter reads too to describe its box",
    "norm-of-scaled-gradients": "the worker runs Megatron in bf16, without a loss scale",
    "layer-wise-unsharded-at-dp-cp-1": "megatron-core 0.16.1 and 0.19.2 do it already "
    "(LayerWiseDistributedOptimizer.shard_params returns early at DP x CP 1)",
}


# What a rank's CUDA cache keeps from one case to the next.
CUDA_CACHE_KEPT_BYTES = 1 << 30
# A full collection after every case was a fifth of a world-8 case's time (bench/RESULTS.md); a
# case's models take megabytes, so one every CASES_PER_COLLECTION cases holds little for long.
CASES_PER_COLLECTION = 16


# --- building the case ----------------------------------------------------------------------------


def collect_everything():
    """A collection of all of it, the frozen included; what survives is frozen again, so the
    collection Megatron-FSDP runs after each build (param_and_grad_buffer.py) looks only at what
    came since."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def process_groups_in(value, process_group_type):
    """The process groups `value` is or holds (a parallel-state variable: a group, or a list,
    tuple or dict of them)."""
    if isinstance(value, dict):
        value = list(value.values())
    items = value if isinstance(value, (list, tuple)) else [value]
    return [g for g in items if isinstance(g, process_group_type)]


def destroy_parallel_state():
    """Megatron's destroy_model_parallel forgets its groups; this also destroys them, and every
    other group torch holds but the world (Megatron-FSDP's, a case's own), then collects what
    referred to them. A gloo group keeps its three threads and its sockets while any object refers
    to it, destroyed or not. On CPUs this gives a layout's threads back; on the H200 something a
    case builds still refers to them (bench/RESULTS.md), and the queue's thread budget retires the
    worker instead."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    candidates = [g for value in vars(ps).values() for g in process_groups_in(value, dist.ProcessGroup)]
    # torch's own registry of the groups it made (private: getattr, so a torch without it still
    # destroys Megatron's).
    registry = getattr(getattr(getattr(dist, "distributed_c10d", None), "_world", None), "pg_map", {})
    candidates += [g for g in list(registry) if isinstance(g, dist.ProcessGroup)]
    groups = list({id(g): g for g in candidates if g is not dist.group.WORLD}.values())
    del candidates
    ps.destroy_model_parallel()
    for g in groups:
        try:
            dist.destroy_process_group(g)
        except Exception:  # a group torch already released
            pass
    del groups
    collect_everything()


def parallel_state_arguments(topology):
    """initialize_model_parallel's arguments for the case's topology: two cases with equal ones
    share Megatron's parallel state."""
    vpp = topology.get("vpp", 1)
    return dict(
        tensor_model_parallel_size=topology.get("tp", 1),
        pipeline_model_parallel_size=topology.get("pp", 1),
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        context_parallel_size=topology.get("cp", 1),
        expert_model_parallel_size=topology.get("ep", 1),
        expert_tensor_parallel_size=topology.get("etp", topology.get("tp", 1)),
        order=topology.get("order", "tp-cp-ep-dp-pp"),
        num_distributed_optimizer_instances=topology.get("dist_opt_instances", 1),
    )


def transformer_config(case):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    t, m = case["topology"], case["model"]
    experts = m.get("num_experts", 0)
    kw = dict(
        num_layers=m.get("num_layers", 2),
        hidden_size=m.get("hidden_size", 16),
        num_attention_heads=m.get("num_attention_heads", 4),
        add_bias_linear=m.get("add_bias_linear", True),
        normalization=m.get("normalization", "LayerNorm"),
        qk_layernorm=m.get("qk_layernorm", False),
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=t.get("tp", 1),
        pipeline_model_parallel_size=t.get("pp", 1),
        expert_model_parallel_size=t.get("ep", 1),
        expert_tensor_parallel_size=t.get("etp", t.get("tp", 1)),
        sequence_parallel=False,
        context_parallel_size=1,
        bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
    )
    if t.get("vpp", 1) > 1:
        kw["virtual_pipeline_model_parallel_size"] = t["vpp"]
    for key in ("num_query_groups", "kv_channels", "ffn_hidden_size"):
        if m.get(key) is not None:
            kw[key] = m[key]
    if m.get("swiglu", False):
        kw["gated_linear_unit"] = True
        kw["activation_func"] = F.silu
    if m.get("softmax_type", "vanilla") == "learnable":
        # An attention sink: the local DotProductAttention's learnable softmax_offset, per head.
        kw["softmax_type"] = "learnable"
    if m.get("mtp_num_layers", 0):
        kw["mtp_num_layers"] = m["mtp_num_layers"]
        # megatron-core 0.19: the MTP params carry grad_norm_group "mtp", a norm of their own.
        if m.get("mtp_detach_heads", False):
            kw["mtp_detach_heads"] = True
    if m.get("decoder_first_pipeline_num_layers") is not None:
        kw["num_layers_in_first_pipeline_stage"] = m["decoder_first_pipeline_num_layers"]
    if m.get("decoder_last_pipeline_num_layers") is not None:
        kw["num_layers_in_last_pipeline_stage"] = m["decoder_last_pipeline_num_layers"]
    if experts:
        kw.update(
            num_moe_experts=experts,
            moe_ffn_hidden_size=m.get("moe_ffn_hidden_size") or m.get("ffn_hidden_size") or 4 * kw["hidden_size"],
            moe_router_topk=min(2, experts),
            # Megatron refuses top-1 routing with the softmax after the top-k
            moe_router_pre_softmax=experts == 1,
            moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=False,
            moe_layer_freq=m.get("moe_layer_freq", 1),
        )
        if m.get("moe_shared_expert_intermediate_size", 0):
            kw["moe_shared_expert_intermediate_size"] = m["moe_shared_expert_intermediate_size"]
            kw["moe_shared_expert_gate"] = m.get("moe_shared_expert_gate", False)
    return TransformerConfig(**kw)


def build_model(case, config):
    """The model chunks (one per virtual pipeline stage), each in Float16Module and DDP."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer.module import Float16Module

    t, m, o = case["topology"], case["model"], case["optimizer"]
    vpp = t.get("vpp", 1)
    distributed = o.get("model", "plain") == "distributed"
    layer_wise_layout = o.get("layer_wise_param_layout", False)
    bucket = o.get("bucket_elements", 0)
    fsdp = case.get("megatron_fsdp")
    if fsdp is not None:
        # Megatron-FSDP, as Megatron-LM's training sets it up (one stage: tally's rules keep PP 1),
        # its main gradients in fp32 so the values tally gives stay exact.
        ddp_config = DistributedDataParallelConfig(
            use_megatron_fsdp=True,
            use_distributed_optimizer=True,
            data_parallel_sharding_strategy=fsdp["data_parallel_sharding_strategy"],
            outer_dp_sharding_strategy=fsdp.get("outer_dp_sharding_strategy", "no_shard"),
            num_distributed_optimizer_instances=t.get("dist_opt_instances", 1),
            megatron_fsdp_main_grads_dtype=torch.float32,
        )
    else:
        ddp_config = DistributedDataParallelConfig(
            # The parameter layout's buffers are the distributed optimizer's (reduce-scattered).
            use_distributed_optimizer=distributed or layer_wise_layout,
            overlap_grad_reduce=False,
            grad_reduce_in_fp32=True,
            bucket_size=bucket if bucket > 0 else None,
            num_distributed_optimizer_instances=t.get("dist_opt_instances", 1),
        )
    models = []
    for i in range(vpp):
        vp_stage = i if vpp > 1 else None
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, vp_stage=vp_stage)
        mtp = None
        if m.get("mtp_num_layers", 0):
            mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False, vp_stage=vp_stage)
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=m.get("vocab_size", 64),
            max_sequence_length=m.get("max_position_embeddings", 32),
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=not m.get("untie_embeddings_and_output_weights", False),
            position_embedding_type=m.get("position_embedding_type", "learned_absolute"),
            vp_stage=vp_stage,
            mtp_block_spec=mtp,
        )
        model.cuda(torch.cuda.current_device())
        models.append(Float16Module(config, model))
    if fsdp is not None:
        from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel

        return [FullyShardedDataParallel(config=config, ddp_config=ddp_config, module=model) for model in models]
    layouts = layer_wise_param_layouts(models, ddp_config) if layer_wise_layout else [None] * len(models)
    # As Megatron's training loop wraps chunks: only the first chunk's buffers are bucketed.
    chunks = []
    for i, (model, layout) in enumerate(zip(models, layouts)):
        extra = {} if layout is None else {"full_param_layout": layout}
        chunks.append(
            DistributedDataParallel(
                config=config, ddp_config=ddp_config, module=model, disable_bucketing=(i > 0), **extra
            )
        )
    return chunks


def layer_wise_param_layouts(models, ddp_config):
    """Each model chunk's parameter layout, as megatron-core 0.19's training gives its DDP buffers
    for the layer-wise optimizer (megatron/training/training.py, wrap_model_chunks_with_ddp with
    use_layer_wise_param_layout): the params tagged for buffer routing (Muon's matrices to
    shard-aligned buffers, the rest to the distributed optimizer's), each chunk laid out by
    LayerWiseDistributedOptimizer.compute_full_param_layout, over the intra-instance DP sizes, one
    bucket per buffer: without overlapped gradient reduction resolve_ddp_bucket_size gives no bucket
    size, and the worker does not overlap."""
    from megatron.core.optimizer.layer_wise_optimizer import (
        LayerWiseDistributedOptimizer,
        tag_params_for_buffer_routing,
    )
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.utils import get_pg_size

    tag_params_for_buffer_routing(models)
    groups = ProcessGroupCollection.use_mpu_process_groups()
    dense_dp = getattr(groups, "intra_dp_cp", None)
    dense_dp = groups.dp_cp if dense_dp is None else dense_dp
    expert_dp = getattr(groups, "intra_expt_dp", None)
    expert_dp = getattr(groups, "expt_dp", None) if expert_dp is None else expert_dp
    return [
        LayerWiseDistributedOptimizer.compute_full_param_layout(
            [p for p in model.parameters() if p.requires_grad],
            None,
            get_pg_size(dense_dp),
            ddp_config,
            expert_data_parallel_world_size=get_pg_size(expert_dp),
        )
        for model in models
    ]


def build_optimizer(case, chunks):
    import dataclasses

    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    kind = case["optimizer"].get("model", "plain")
    config = OptimizerConfig(
        optimizer="adam",
        lr=0.0,
        weight_decay=0.0,
        bf16=True,
        use_distributed_optimizer=(kind == "distributed"),
        log_num_zeros_in_grad=True,
        # The case's max_norm: the worker runs the release's own clip (tally_megatron.release_clip).
        clip_grad=float(case.get("statistics", {}).get("max_norm", 0.0) or 0.0),
        muon_tp_mode="duplicated",
    )
    if kind in ("plain", "distributed"):
        return get_megatron_optimizer(config, chunks)
    layer_wise = kind == "layerwise"
    if "use_layer_wise_distributed_optimizer" in {f.name for f in dataclasses.fields(OptimizerConfig)}:
        config.optimizer = "muon"
        config.use_layer_wise_distributed_optimizer = layer_wise
        # Over the parameter layout (DDP's use_distributed_optimizer) megatron-core 0.19 chains the
        # layer-wise optimizer with a DistributedOptimizer of the non-Muon params.
        return get_megatron_optimizer(config, chunks)
    from megatron.core.optimizer.muon import get_megatron_muon_optimizer

    emerging_optimizers_compat()
    return get_megatron_muon_optimizer(config, chunks, layer_wise_distributed_optimizer=layer_wise)


def set_gradients(chunks, tensors):
    """Every param's main_grad from the logical tensor's box it holds. Returns the tally names of
    the params this rank holds; raises where the framework's model is not tally's."""
    import torch

    params, _, objs = tally_megatron._describe_params(tally_megatron._model_chunks(chunks))
    held = set()
    fsdp_modules = {}
    for entry, p in zip(params, objs):
        r = entry["record"]
        name = r["logical_name"]
        if name not in tensors:
            raise LookupError(
                f"model mismatch: megatron-core built {r['name']} (logical {name}, shape "
                f"{r['logical_shape']}), which tally's model of the case does not have"
            )
        logical = tensors[name]
        if list(logical.shape) != list(r["logical_shape"]):
            raise LookupError(
                f"model mismatch: {name} is {r['logical_shape']} in megatron-core, "
                f"{list(logical.shape)} in tally's model"
            )
        box = tuple(slice(o, o + e) for o, e in zip(r["offsets"], r["extents"]))
        values = torch.from_numpy(logical[box].copy())
        if getattr(p, "__fsdp_param__", False):
            # The range this rank holds, in Megatron-FSDP's main-grad buffer.
            with torch.no_grad():
                entry["grad"].copy_(values.reshape(-1).to(entry["grad"].device))
            fsdp_modules[id(p._megatron_fsdp_model)] = p._megatron_fsdp_model
            held.add(name)
            continue
        values = values.reshape(p.shape)
        if getattr(p, "main_grad", None) is None:
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        with torch.no_grad():
            p.main_grad.copy_(values.to(p.main_grad.device))
        held.add(name)
    # Megatron-FSDP hands its optimizer the buffer's shards as the DTensor params' gradients, as after
    # a backward (attach_grad_to_optimizer_state); its reduction (finish_grad_sync) is not run: the
    # values are already those after it.
    for module in fsdp_modules.values():
        module.param_and_grad_buffer.update_main_grads()
    return held


class MegatronCoreWorker(base.Worker):
    """tally's worker for megatron-core: executes tally's cases with Megatron's own, unmodified code."""

    framework = "megatron-core"
    package = "megatron."
    plants = PLANTS
    not_planted = NOT_PLANTED
    needs_gpu = True
    # initialize_model_parallel's arguments of the parallel state in place; None: none is.
    parallel_state_of = None
    cases_since_collection = 0

    def framework_version(self):
        try:
            from megatron.core import package_info

            return package_info.__version__
        except Exception:
            return "unknown"

    def cannot_run(self):
        # Megatron-FSDP's adapter lays out its device meshes with einops, which megatron-core's
        # wheel does not require.
        try:
            import einops  # noqa: F401
        except ImportError:
            return {"megatron_fsdp": "einops is not installed, and Megatron-FSDP's adapter needs it (pip install einops)"}
        return {}

    def start(self):
        # Every module that imports a function a fault replaces is loaded before any fault is
        # planted, so none keeps a replacement past its case.
        import megatron.core.distributed  # noqa: F401
        import megatron.core.models.gpt  # noqa: F401
        import megatron.core.optimizer  # noqa: F401
        import megatron.core.optimizer.clip_grads  # noqa: F401

    def use_parallel_state(self, topology):
        """Megatron's parallel state for `topology`: the one in place when every rank has that
        topology's (a rank whose last case raised has none), else made anew on every rank."""
        import os

        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        arguments = parallel_state_arguments(topology)
        in_place = [None] * dist.get_world_size()
        dist.all_gather_object(in_place, ("parallel state in place", arguments == self.parallel_state_of))
        if any(not isinstance(answer, tuple) or answer[0] != "parallel state in place" for answer in in_place):
            # A rank is at another collective: the ranks are out of step, and no later case would
            # be true. The worker ends, and tally starts another.
            print(f"tally's megatron-core worker: ranks out of step at the parallel state's check ({in_place})",
                  file=sys.stderr, flush=True)
            os._exit(3)
        if all(answer[1] for answer in in_place):
            return
        # Every rank destroys what it has (nothing, after a case that raised) and makes it anew,
        # so the ranks make their groups at the same point.
        self.parallel_state_of = None
        threads_before = threads_of_this_process()
        destroy_parallel_state()
        if dist.get_rank() == 0:
            # What the old groups gave back: the log shows a layout change that keeps threads.
            print(f"parallel state anew: rank 0's threads {threads_before} before the old groups were destroyed, "
                  f"{threads_of_this_process()} after ({thread_names_of_this_process()})", file=sys.stderr, flush=True)
        ps.initialize_model_parallel(**arguments)
        self.parallel_state_of = arguments

    def execute(self, request):
        """Runs the request's case on this rank and writes its manifests."""
        import torch
        import torch.distributed as dist
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        case = request.case
        chunks = optimizer = None
        planted = self.planted(request)
        try:
            planted.__enter__()
            # Megatron's own checks of the case (its parallel state's, its model's and optimizer's
            # constructors') decline it: a refusal counted by reason, not an error of the worker.
            with framework_setup("megatron"):
                self.use_parallel_state(case["topology"])
                model_parallel_cuda_manual_seed(1234)
                config = transformer_config(case)
                chunks = build_model(case, config)
                optimizer = build_optimizer(case, chunks)
            tensors = request.gradients()
            held = set_gradients(chunks, tensors)
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, sorted(held))
            missing = set(tensors) - set().union(*map(set, everyone))
            if missing:
                raise LookupError(
                    f"model mismatch: no rank of megatron-core's model holds {sorted(missing)[:5]} "
                    f"({len(missing)} of tally's params)"
                )
            max_norm = float(case.get("statistics", {}).get("max_norm", 0.0) or 0.0)
            optimizer.prepare_grads()
            norm = optimizer.get_grad_norm()
            zeros = optimizer.count_zeros()
            # megatron-core 0.19's separate grad-norm groups (MTP with detached heads), as its step
            # computes them to clip each group by its own norm.
            group_norms = None
            if case["model"].get("mtp_detach_heads", False):
                group_norms = optimizer._compute_grad_norms_by_group()
            tally_megatron.dump_manifest(
                optimizer,
                chunks,
                request.manifests_dir,
                producer=self.producer(),
                grad_norm=norm,
                num_zeros=zeros,
                group_norms=group_norms,
                case_digest=request.case_digest,
                clip=functools.partial(tally_megatron.release_clip, optimizer) if max_norm > 0 else None,
            )
        except BaseException:
            self.parallel_state_of = None  # no state a failed case leaves is reused: the next case makes it anew
            raise
        finally:
            planted.__exit__(None, None, None)
            del optimizer, chunks
            self.cases_since_collection += 1
            if self.cases_since_collection >= CASES_PER_COLLECTION:
                collect_everything()
                self.cases_since_collection = 0
            # The ranks share the GPU, but a case's models take megabytes: a rank keeps its cache up
            # to CUDA_CACHE_KEPT_BYTES, so the next case allocates without cudaMalloc.
            if torch.cuda.memory_reserved() > CUDA_CACHE_KEPT_BYTES:
                torch.cuda.empty_cache()


def main(argv=None):
    return base.run(MegatronCoreWorker, argv)


if __name__ == "__main__":
    sys.exit(main())
