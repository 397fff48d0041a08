"""Building a case on megatron-core: its parallel state (made once per topology, destroyed with
every group it made when the topology changes), its TransformerConfig and model, its optimizer
(with the layer-wise param layout and Megatron-FSDP where the case asks), and tally's gradients
written where Megatron's optimizer reads them.
"""

import gc

from . import model_params
from .muon_compat import emerging_optimizers_compat


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
    vpp = topology["vpp"]
    return dict(
        tensor_model_parallel_size=topology["tp"],
        pipeline_model_parallel_size=topology["pp"],
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        context_parallel_size=topology["cp"],
        expert_model_parallel_size=topology["ep"],
        expert_tensor_parallel_size=topology["etp"],
        order=topology["order"],
        num_distributed_optimizer_instances=topology["dist_opt_instances"],
    )


def moe_layer_freq(value):
    """A case's `moe_layer_freq` as megatron-core's TransformerConfig takes it: an int, or the list
    of 0 (dense) and 1 (MoE) per layer that Megatron-LM's --moe-layer-freq expression (a string in
    the case, as tally writes it: "([0]*1+[1]*3)") evaluates to. Only lists, `+`, `*` by an int and
    parentheses are read; anything else raises ValueError naming the text."""
    import ast

    if isinstance(value, int):
        return value

    def evaluate(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            return [evaluate(item) for item in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = evaluate(node.left), evaluate(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(f"moe_layer_freq {value!r}: not a list expression of 0 and 1 ({ast.dump(node)})")

    pattern = evaluate(ast.parse(value, mode="eval").body)
    if not isinstance(pattern, list) or any(layer not in (0, 1) for layer in pattern):
        raise ValueError(f"moe_layer_freq {value!r}: not a list of 0 and 1")
    return pattern


def transformer_config(case):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    t, m = case["topology"], case["model"]
    experts = m["num_experts"]
    kw = dict(
        num_layers=m["num_layers"],
        hidden_size=m["hidden_size"],
        num_attention_heads=m["num_attention_heads"],
        add_bias_linear=m["add_bias_linear"],
        normalization=m["normalization"],
        qk_layernorm=m["qk_layernorm"],
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=t["tp"],
        pipeline_model_parallel_size=t["pp"],
        expert_model_parallel_size=t["ep"],
        expert_tensor_parallel_size=t["etp"],
        sequence_parallel=False,
        context_parallel_size=1,
        bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
    )
    if t["vpp"] > 1:
        kw["virtual_pipeline_model_parallel_size"] = t["vpp"]
    for key in ("num_query_groups", "kv_channels", "ffn_hidden_size"):
        if m.get(key) is not None:
            kw[key] = m[key]
    if m["swiglu"]:
        kw["gated_linear_unit"] = True
        kw["activation_func"] = F.silu
    if m["softmax_type"] == "learnable":
        # An attention sink: the local DotProductAttention's learnable softmax_offset, per head.
        kw["softmax_type"] = "learnable"
    if m["mtp_num_layers"]:
        kw["mtp_num_layers"] = m["mtp_num_layers"]
        # megatron-core 0.19: the MTP params carry grad_norm_group "mtp", a norm of their own.
        if m["mtp_detach_heads"]:
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
            moe_layer_freq=moe_layer_freq(m["moe_layer_freq"]),
        )
        if m["moe_shared_expert_intermediate_size"]:
            kw["moe_shared_expert_intermediate_size"] = m["moe_shared_expert_intermediate_size"]
            kw["moe_shared_expert_gate"] = m["moe_shared_expert_gate"]
    return TransformerConfig(**kw)


def build_model(case, config):
    """The model chunks (one per virtual pipeline stage), each in Float16Module and DDP."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer.module import Float16Module

    t, m, o = case["topology"], case["model"], case["optimizer"]
    vpp = t["vpp"]
    distributed = o["model"] == "distributed"
    layer_wise_layout = o.get("layer_wise_param_layout", False)
    bucket = o["bucket_elements"]
    fsdp = case.get("megatron_fsdp")
    if fsdp is not None:
        # Megatron-FSDP, as Megatron-LM's training sets it up (one stage: tally's rules keep PP 1),
        # its main gradients in fp32 so the values tally gives stay exact.
        ddp_config = DistributedDataParallelConfig(
            use_megatron_fsdp=True,
            use_distributed_optimizer=True,
            data_parallel_sharding_strategy=fsdp["data_parallel_sharding_strategy"],
            outer_dp_sharding_strategy=fsdp["outer_dp_sharding_strategy"],
            num_distributed_optimizer_instances=t["dist_opt_instances"],
            megatron_fsdp_main_grads_dtype=torch.float32,
            # Megatron-FSDP reduces fp32 gradients with NCCL's PREMUL_SUM(1/DP) by default, which gloo
            # lacks: on gloo the worker runs Megatron-LM's --no-gradient-reduce-div-fusion, each
            # rank's gradient times the same factor, then summed, which is PREMUL_SUM's definition
            # (param_and_grad_buffer.py, gradient_reduce_preprocessing).
            gradient_reduce_div_fusion=dist.get_backend() != "gloo",
        )
    else:
        ddp_config = DistributedDataParallelConfig(
            # The parameter layout's buffers are the distributed optimizer's (reduce-scattered).
            use_distributed_optimizer=distributed or layer_wise_layout,
            overlap_grad_reduce=False,
            grad_reduce_in_fp32=True,
            bucket_size=bucket if bucket > 0 else None,
            num_distributed_optimizer_instances=t["dist_opt_instances"],
        )
    models = []
    for i in range(vpp):
        vp_stage = i if vpp > 1 else None
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, vp_stage=vp_stage)
        mtp = None
        if m["mtp_num_layers"]:
            mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False, vp_stage=vp_stage)
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=m["vocab_size"],
            max_sequence_length=m["max_position_embeddings"],
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=not m["untie_embeddings_and_output_weights"],
            position_embedding_type=m["position_embedding_type"],
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

    kind = case["optimizer"]["model"]
    config = OptimizerConfig(
        optimizer="adam",
        lr=0.0,
        weight_decay=0.0,
        bf16=True,
        use_distributed_optimizer=(kind == "distributed"),
        log_num_zeros_in_grad=True,
        # The case's max_norm: the worker runs the release's own clip (tally_megatron.release_clip).
        clip_grad=float(case["statistics"]["max_norm"]),
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


def set_gradients(chunks, tensors, share_of=None):
    """Every param's main_grad from the logical tensor's box it holds: tally's gradient, or, with
    `share_of` (logical name -> this rank's share of the whole tensor: reduction.Contributions.of),
    this rank's share of it, for megatron-core's own reduction to sum. Returns the tally names of
    the params this rank holds; raises where the framework's model is not tally's."""
    import torch

    from . import reduction

    fsdp_before = share_of is not None and any(
        getattr(p, "__fsdp_param__", False) for c in model_params.model_chunks(chunks) for p in c.parameters()
    )
    params, _, objs = model_params.describe_params(model_params.model_chunks(chunks), unsharded_fsdp=fsdp_before)
    held = set()
    fsdp_modules = {}
    fsdp_shares = []  # (raw param, this rank's share of its TP-local box)
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
        whole = logical if share_of is None else share_of(name)
        values = torch.from_numpy(whole[box].copy())
        if getattr(p, "__fsdp_param__", False):
            fsdp_modules[id(p._megatron_fsdp_model)] = p._megatron_fsdp_model
            held.add(name)
            if fsdp_before:
                fsdp_shares.append((p.orig_param, values))
                continue
            # The range this rank holds, in Megatron-FSDP's main-grad buffer.
            with torch.no_grad():
                entry["grad"].copy_(values.reshape(-1).to(entry["grad"].device))
            continue
        values = values.reshape(p.shape)
        if getattr(p, "main_grad", None) is None:
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        with torch.no_grad():
            p.main_grad.copy_(values.to(p.main_grad.device))
        held.add(name)
    if fsdp_before:
        # The shares go where a backward leaves them, and Megatron-FSDP's own hooks start its
        # reduction; finalize_model_grads finishes it (reduction.reduce).
        reduction.fsdp_backward(list(fsdp_modules.values()), fsdp_shares)
        return held
    # Megatron-FSDP hands its optimizer the buffer's shards as the DTensor params' gradients, as after
    # a backward (attach_grad_to_optimizer_state); its reduction (finish_grad_sync) is not run: the
    # values are already those after it.
    for module in fsdp_modules.values():
        module.param_and_grad_buffer.update_main_grads()
    return held
