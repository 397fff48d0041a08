"""The model's side of a manifest: every local param of a Megatron model (its chunks unwrapped
from DDP and Megatron-FSDP), with its logical name, its box and the attributes Megatron's norm
code reads; Megatron-FSDP's shard of a param; the gradient the model holds.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, NamedTuple, Tuple

from .names import (
    held_box,
    is_attention_sink,
    is_routed_expert_name,
    join_name,
    logical_module_names,
    logical_param_name,
    shard_box,
)

ATTRIBUTE_DEFAULTS = {
    "tensor_model_parallel": False,
    "partition_dim": -1,
    "allreduce": True,
    "shared": False,
    "grad_norm_group": None,
}
_WRAPPER_NAMES = {
    "DistributedDataParallel",
    "Float16Module",
    "FullyShardedDataParallel",
    "MegatronFSDP",
    "TorchFullyShardedDataParallel",
}


def _unwrap(module):
    while type(module).__name__ in _WRAPPER_NAMES and hasattr(module, "module"):
        module = module.module
    return module


def model_chunks(model) -> List[Any]:
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if not chunks:
        raise ValueError("dump_manifest: no model chunks")
    return [_unwrap(c) for c in chunks]


def param_attributes(p) -> Dict[str, Any]:
    out = {}
    for k, default in ATTRIBUTE_DEFAULTS.items():
        v = getattr(p, k, default)
        if k == "grad_norm_group":
            out[k] = None if v is None else str(v)
        elif k == "partition_dim":
            out[k] = int(v)
        else:
            out[k] = bool(v)
    return out


def _group_rank_size(group) -> Tuple[int, int]:
    import torch.distributed as dist

    return dist.get_rank(group), dist.get_world_size(group)


def describe_params(chunks, unsharded_fsdp=False):
    """The model params: records (stats filled in later), index by id, and the param objects.

    A Megatron-FSDP param is described by the part of it this rank's shard of the main-grad buffer
    holds (none where it holds nothing), its gradient that range of the buffer; with
    `unsharded_fsdp`, by its whole TP-local box, the box a backward gives every DP rank a gradient
    of before Megatron-FSDP reduces them (its gradient then None: the raw param's main_grad is
    allocated by Megatron-FSDP when it is written)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp = (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size())
    etp = (ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size())

    params: List[Dict[str, Any]] = []
    index: Dict[int, int] = {}
    objs: List[Any] = []
    for k, chunk in enumerate(chunks):
        entries = []
        owner: Dict[str, Any] = {}
        expert_ids: Dict[str, List[int]] = {}
        for name, mod in chunk.named_modules():
            info: Dict[str, Any] = {}
            ln = getattr(mod, "layer_number", None)
            if isinstance(ln, int) and re.search(r"(^|\.)layers\.\d+$", name):
                info["layer_number"] = ln
            lei = getattr(mod, "local_expert_indices", None)
            if lei is not None and hasattr(mod, "experts"):
                # the MoELayer: its `experts` child holds the local experts
                experts_name = join_name(name, "experts")
                expert_ids[experts_name] = list(lei)
            if name in expert_ids:
                info["local_expert_indices"] = expert_ids[name]
                if type(mod).__name__ == "GroupedMLP":
                    raise NotImplementedError(
                        f"{name}: legacy GroupedMLP (all local experts in one tensor) is not "
                        "supported; use SequentialMLP or TEGroupedMLP"
                    )
            entries.append((name, info))
            owner[name] = mod
        module_names = logical_module_names(entries)
        # TE grouped linears under an experts module: `experts.linear_fc1` -> ids of `experts`
        grouped_ids = {}
        for ename, ids in expert_ids.items():
            for name in owner:
                if name.startswith(ename + ".") and name.count(".") == ename.count(".") + 1:
                    grouped_ids[name] = ids
        for name, p in chunk.named_parameters():
            if not p.requires_grad:
                # Frozen: no optimizer holds it and no norm counts it, so the truth leaves it out.
                continue
            fsdp = fsdp_shard(p) if getattr(p, "__fsdp_param__", False) else None
            # A Megatron-FSDP param is a DTensor over its shards: its own TP-local tensor (the box)
            # is the raw param it replaced, with every attribute Megatron set.
            model_p = fsdp.raw if fsdp is not None else p
            if getattr(model_p, "is_gtp_weight_remat", False):
                # The format carries GTP shards (docs/manifest.md); mapping one to its box needs
                # its GTP rank and padding, which this adapter does not read yet.
                raise NotImplementedError(
                    f"{name}: a generalized-TP shard (is_gtp_weight_remat); the adapter maps "
                    "TP shards only: run with gtp_weight_remat_size = "
                    "expert_gtp_weight_remat_size = 1"
                )
            attrs = param_attributes(model_p)
            module_name = name.rpartition(".")[0]
            logical = logical_param_name(
                name, module_names, shared=attrs["shared"], expert_ids=grouped_ids
            )
            routed = is_routed_expert_name(name)
            mod = owner.get(module_name)
            group = getattr(mod, "tp_group", None) if mod is not None else None
            sink = is_attention_sink(name) and not attrs["tensor_model_parallel"]
            sharded = attrs["tensor_model_parallel"] or sink
            if sharded:
                if group is not None and isinstance(group, dist.ProcessGroup):
                    grank, gsize = _group_rank_size(group)
                else:
                    grank, gsize = etp if routed else tp
            else:
                grank, gsize = 0, 1
            shape, offsets, extents = shard_box(
                list(model_p.shape), sharded, 0 if sink else attrs["partition_dim"], grank, gsize
            )
            grad = None if fsdp is not None else _model_grad(p)
            if fsdp is not None and not unsharded_fsdp:
                held = held_box(offsets, extents, fsdp.begin, fsdp.end, name)
                if held is None:
                    continue  # this rank's shard holds none of it
                offsets, extents = held
                grad = fsdp.view
            local = name if len(chunks) == 1 else f"chunk{k}.{name}"
            record = {
                "name": local,
                "logical_name": logical,
                "logical_shape": shape,
                "offsets": offsets,
                "extents": extents,
                "attributes": attrs,
                "stats": None,
            }
            if id(p) in index:
                continue  # the same Parameter object reached twice (tied within a chunk)
            index[id(p)] = len(params)
            params.append({"record": record, "grad": grad})
            objs.append(p)
    return params, index, objs


class FsdpShard(NamedTuple):
    """What one rank holds of a Megatron-FSDP param: the raw (TP-local) param it replaced, the
    flat range [begin, end) of it in this rank's shard of the main-grad buffer (all of it for
    no_shard), and that range in the buffer."""

    raw: Any
    begin: int
    end: int
    view: Any


def fsdp_shard(p) -> FsdpShard:
    """The shard of Megatron-FSDP param `p` (the DTensor param the module and its optimizer hold),
    read from Megatron-FSDP's own buffer: the item's slice in this rank's shard, as the optimizer's
    gradient of it is made (ParamAndGradBuffer.update_main_grads)."""
    raw = p.orig_param
    buffers = p._megatron_fsdp_model.param_and_grad_buffer
    grads = buffers.parameter_groups[buffers.param_to_param_group[raw]].main_grad_buffer
    item = grads.param_idx[raw]
    whole = buffers.ddp_config.data_parallel_sharding_strategy == "no_shard"
    begin, end = (0, raw.numel()) if whole else grads._get_item_slice_in_shard(item)
    view = grads.get_item(item, only_shard=not whole)
    if view.numel() != end - begin:
        raise RuntimeError(
            f"Megatron-FSDP's buffer gives {view.numel()} elements of a param of shape {list(raw.shape)} "
            f"for its held range [{begin}, {end})"
        )
    return FsdpShard(raw, int(begin), int(end), view)


def _model_grad(p):
    g = getattr(p, "main_grad", None)
    if g is None:
        g = p.grad
    return g
