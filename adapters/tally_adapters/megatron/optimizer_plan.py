"""The optimizer's side of a manifest: the children of a (chained) Megatron optimizer, each with
its stats group, the groups its filter receives and its clip; the pieces each owns of the main
params with Megatron's own keep decisions (its duplicate filter, its zero count); and the
statistics of the gradients each holds.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from .model_params import param_attributes


def group_ranks(group, world: int) -> List[int]:
    """Sorted global ranks of a process group; None means WORLD."""
    import torch.distributed as dist

    if group is None:
        return list(range(world))
    return sorted(int(r) for r in dist.get_process_group_ranks(group))


def maybe_group_ranks(group, world: int) -> Optional[List[int]]:
    return None if group is None else group_ranks(group, world)


def _megatron_classes():
    from megatron.core.optimizer import optimizer as opt_mod

    classes = {
        "ChainedOptimizer": opt_mod.ChainedOptimizer,
        "Float16OptimizerWithFloat16Params": opt_mod.Float16OptimizerWithFloat16Params,
        "FP32Optimizer": opt_mod.FP32Optimizer,
    }
    try:
        from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

        classes["LayerWiseDistributedOptimizer"] = LayerWiseDistributedOptimizer
    except ImportError:  # pragma: no cover - older versions
        pass
    try:
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        classes["DistributedOptimizer"] = DistributedOptimizer
    except ImportError:  # pragma: no cover
        pass
    return classes


def _source_mentions(fn, word: str) -> bool:
    try:
        return word in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


class ChildPlan(NamedTuple):
    """A child that computes the norm: the group it reduces over (None: WORLD), whether its zero
    count is counted, and the groups its zero count's duplicate filter receives."""

    name: str
    child: Any
    stats_group: Any
    zeros_counted: bool
    zeros_tp_group: Any
    zeros_expert_tp_group: Any


def _groups_count_zeros_passes(optimizer, holder):
    """The groups `optimizer.count_zeros` hands count_zeros_fp32, read off `holder`: none where
    that version passes no tp_group (0.16.1's LayerWise and shared ChainedOptimizer paths)."""
    if not _source_mentions(type(optimizer).count_zeros, "tp_group"):
        return None, None
    return getattr(holder, "tp_group", None), getattr(holder, "expert_tp_group", None)


def _plan(optimizer, world: int) -> List[ChildPlan]:
    """Which children compute the norm, over which group, and what their zero count passes."""
    C = _megatron_classes()
    LW = C.get("LayerWiseDistributedOptimizer")
    Chained = C["ChainedOptimizer"]
    top = type(optimizer).__name__
    if LW is not None and isinstance(optimizer, LW):
        return _layer_wise_children(optimizer, top, True, C)
    if not isinstance(optimizer, Chained):
        _check_child(optimizer, C)
        ztp, zetp = _own_zero_groups(optimizer)
        return [ChildPlan(top, optimizer, optimizer.get_grad_stats_parallel_group(), True, ztp, zetp)]
    children = optimizer.chained_optimizers
    for child in children:
        if not (LW is not None and isinstance(child, LW)):
            _check_child(child, C)
    # Shared group: one count_zeros_fp32 over every child's params with the first child's
    # groups; else each child counts its own zeros, when its config logs them.
    shared = optimizer.grads_states_parallel_group_is_shared() if children else True
    shared_groups = _groups_count_zeros_passes(optimizer, children[0]) if children else (None, None)
    plan = []
    for i, child in enumerate(children):
        if LW is not None and isinstance(child, LW):
            if shared:
                # The chain would reduce its children's grads together over one group, which the
                # layer-wise optimizer's own statistics never are: not recorded rather than recorded wrong.
                raise NotImplementedError(
                    f"{top}.chained_optimizers[{i}] ({type(child).__name__}) shares one grad-stats group with "
                    "the other children of its chain; tally_adapters.megatron records a chained layer-wise "
                    "optimizer only with its own statistics"
                )
            # Chained (0.19's parameter layout): the chain counts its zeros when its config logs them.
            counted = bool(getattr(child.config, "log_num_zeros_in_grad", False))
            plan += _layer_wise_children(child, f"{top}.chained_optimizers[{i}]", counted, C)
            continue
        if shared:
            counted, (ztp, zetp) = True, shared_groups
        else:
            counted = bool(getattr(child.config, "log_num_zeros_in_grad", False))
            ztp, zetp = _own_zero_groups(child)
        plan.append(
            ChildPlan(
                f"{top}.chained_optimizers[{i}]",
                child,
                child.get_grad_stats_parallel_group(),
                counted,
                ztp,
                zetp,
            )
        )
    return plan


def _layer_wise_children(layer_wise, name: str, counted: bool, C) -> List[ChildPlan]:
    """A LayerWiseDistributedOptimizer's own children, which hold its params: its norm and zero
    count (get_grad_norm_fp32 and count_zeros_fp32 with grad_stats_parallel_group=None) are over
    WORLD, alone or chained with a DistributedOptimizer (megatron-core 0.19's parameter layout)."""
    ztp, zetp = _groups_count_zeros_passes(layer_wise, layer_wise)
    plan = []
    for j, leaf in enumerate(layer_wise.chained_optimizers):
        _check_child(leaf, C)
        plan.append(ChildPlan(f"{name}.chained_optimizers[{j}]", leaf, None, counted, ztp, zetp))
    return plan


def _own_zero_groups(child):
    """The groups MegatronOptimizer.count_zeros passes for a child: its tp_group (0.16.1), and
    its expert_tp_group where that version's count_zeros passes one."""
    ztp = getattr(child, "tp_group", None)
    zetp = None
    if _source_mentions(type(child).count_zeros, "expert_tp_group"):
        zetp = getattr(child, "expert_tp_group", None)
    return ztp, zetp


def _check_child(child, C):
    if isinstance(child, C["ChainedOptimizer"]):
        raise NotImplementedError(
            f"{type(child).__name__} nested inside a ChainedOptimizer is not supported"
        )
    known = tuple(
        C[k]
        for k in ("Float16OptimizerWithFloat16Params", "FP32Optimizer", "DistributedOptimizer")
        if k in C
    )
    if not isinstance(child, known):
        raise NotImplementedError(
            f"child optimizer type {type(child).__name__} is not supported by tally_adapters.megatron"
        )


def _main_to_model(child, C, held_numel) -> Dict[int, Tuple[Any, Optional[Tuple[int, int]]]]:
    """id(main param) -> (model param, (begin, end) or None for the whole box). `held_numel`:
    id(Megatron-FSDP param) -> the elements this rank holds of it."""
    out: Dict[int, Tuple[Any, Optional[Tuple[int, int]]]] = {}
    if getattr(child, "is_stub_optimizer", False) or getattr(child, "optimizer", None) is None:
        return out
    DO = C.get("DistributedOptimizer")
    if DO is not None and isinstance(child, DO):
        if getattr(child.ddp_config, "use_megatron_fsdp", False):
            # Its main params are the model's DTensor params, each the whole range this rank holds.
            return {id(p): (p, (0, held_numel[id(p)])) for p in child.get_parameters() if id(p) in held_numel}
        precision_aware = child.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8
        f16_main = child.shard_float16_groups if precision_aware else child.shard_fp32_from_float16_groups
        pairs = [(child.model_float16_groups, f16_main), (child.model_fp32_groups, child.shard_fp32_groups)]
        for model_groups, main_groups in pairs:
            for mg, sg in zip(model_groups, main_groups):
                for model_param, main in zip(mg, sg):
                    if main is None:
                        continue
                    r = child._get_model_param_range_map(model_param)["param"]
                    out[id(main)] = (model_param, (int(r.start), int(r.end)))
        return out
    if isinstance(child, C["Float16OptimizerWithFloat16Params"]):
        for mg, sg in zip(child.float16_groups, child.fp32_from_float16_groups):
            for model_param, main in zip(mg, sg):
                out[id(main)] = (model_param, None)
        for group in child.fp32_from_fp32_groups:
            for p in group:
                out[id(p)] = (p, None)
        return out
    # FP32Optimizer: the model params are the main params
    for p in child.get_parameters():
        out[id(p)] = (p, None)
    return out


def _grad_the_filter_reads(param, config):
    """The gradient MegatronOptimizer.get_main_grads_for_grad_norm reads for `param`."""
    if getattr(param, "__fsdp_param__", False):
        return param.grad._local_tensor if param.grad is not None else None
    if getattr(config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False):
        return getattr(param, "decoupled_grad", None)
    return param.grad


def _kept_by_norm_group(child):
    """group -> ids of the gradients `child`'s filter keeps for that group's norm (None: the main
    norm, which leaves out megatron-core 0.19's separate groups), each filter run once."""
    norm_filter = _norm_filter(child)
    kept: Dict[Optional[str], set] = {}

    def of(group: Optional[str]) -> set:
        if group not in kept:
            if group is not None and "grad_norm_group" not in inspect.signature(norm_filter).parameters:
                raise NotImplementedError(
                    f"{type(child).__name__}'s grad-norm filter takes no grad_norm_group, and a param "
                    f"is in grad_norm_group '{group}'"
                )
            grads = norm_filter() if group is None else norm_filter(grad_norm_group=group)
            kept[group] = {id(g) for g in grads}
        return kept[group]

    return of


def _norm_filter(child):
    for name in ("get_main_grads_for_grad_norm", "get_grads_for_grad_norm", "_filter_grads_for_norm"):
        fn = getattr(child, name, None)
        if callable(fn):
            return fn
    raise NotImplementedError(f"{type(child).__name__} has no grad-norm filter method")


def _zero_predicate():
    """Megatron's zero-count predicates, from the module count_zeros_fp32 lives in."""
    from megatron.core.optimizer import clip_grads

    not_shared = clip_grads.param_is_not_shared
    not_tp_dup = clip_grads.param_is_not_tensor_parallel_duplicate
    not_gtp_dup = getattr(clip_grads, "param_is_not_gtp_duplicate", None)
    accepts_expert = "expert_tp_group" in inspect.signature(not_tp_dup).parameters

    def kept(param, use_decoupled, tp_group, expert_tp_group) -> bool:
        if getattr(param, "__fsdp_param__", False):
            return param.grad is not None
        attr = "decoupled_grad" if use_decoupled else "grad"
        if getattr(param, attr, None) is None:
            return False
        if not not_shared(param):
            return False
        if accepts_expert:
            ok = not_tp_dup(param, tp_group=tp_group, expert_tp_group=expert_tp_group)
        else:
            ok = not_tp_dup(param, tp_group=tp_group)
        if not ok:
            return False
        if not_gtp_dup is not None and not not_gtp_dup(param):
            return False
        return True

    return kept


def describe_optimizers(optimizer, params, param_index, param_objs, world):
    """Each child of `optimizer`'s plan with its main params, mapped onto `params` (the model
    params' records, as describe_params gives them)."""
    # id(model param) -> the elements this rank holds of it (a Megatron-FSDP param's held range).
    held_numel = {id(p): math.prod(entry["record"]["extents"]) for p, entry in zip(param_objs, params)}
    C = _megatron_classes()
    zero_kept = _zero_predicate()
    out = []
    for name, child, stats_group, zeros_counted, ztp, zetp in _plan(optimizer, world):
        inner = getattr(child, "optimizer", None)
        label = f"{name} ({type(child).__name__}: {type(inner).__name__})"
        config = child.config
        use_decoupled = bool(getattr(config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False))
        kept_ids = _kept_by_norm_group(child)
        mapping = _main_to_model(child, C, held_numel)
        mains = []
        for main in child.get_parameters():
            if getattr(main, "__fsdp_param__", False) and id(main) not in param_index:
                if main.grad is not None:
                    raise RuntimeError(f"{label}: a Megatron-FSDP param this rank holds none of has a gradient")
                continue  # an empty shard: no gradient, nothing counted
            if id(main) in mapping:
                model_param, rng = mapping[id(main)]
            elif id(main) in param_index:
                model_param, rng = main, None
            else:
                raise RuntimeError(
                    f"{label}: a main param of shape {list(main.shape)} maps to no model param"
                )
            if id(model_param) not in param_index:
                raise RuntimeError(
                    f"{label}: a main param's model param (shape {list(model_param.shape)}) is "
                    "not a param of the model passed to dump_manifest"
                )
            pi = param_index[id(model_param)]
            numel = model_param.numel()
            begin, end = (0, numel) if rng is None else rng
            g = _grad_the_filter_reads(main, config)
            # Kept for the norm of the model param's own grad-norm group (the main norm for None).
            own_group = params[pi]["record"]["attributes"]["grad_norm_group"]
            kept = g is not None and id(g) in kept_ids(own_group)
            kz = bool(zeros_counted) and zero_kept(main, use_decoupled, ztp, zetp)
            zg = getattr(main, "decoupled_grad" if use_decoupled else "grad", None)
            stat_grad = g if g is not None else zg
            mains.append(
                {
                    "record": {
                        "param": pi,
                        "begin": int(begin),
                        "end": int(end),
                        "attributes": param_attributes(main),
                        "kept": bool(kept),
                        "kept_zeros": bool(kz),
                        "stats": None,
                    },
                    "grad": stat_grad,
                    "main": main,
                    # no grad on the main param: the stats of the model grad's range stand in
                    "fallback": (pi, begin, end) if stat_grad is None else None,
                }
            )
        record = {
            "name": label,
            "stats_group": group_ranks(stats_group, world),
            "tp_group": maybe_group_ranks(getattr(child, "tp_group", None), world),
            "expert_tp_group": maybe_group_ranks(getattr(child, "expert_tp_group", None), world),
            "clip": None,
            "main_params": [m["record"] for m in mains],
        }
        out.append({"record": record, "mains": mains})
    return out


def fill_stats(params, optimizers):
    """fp64 sum of squares, abs max and zero count of every gradient, on its device, with one
    transfer at the end."""
    import torch

    jobs = []  # (record, tensor or None)
    for p in params:
        jobs.append((p["record"], p["grad"], None))
    for o in optimizers:
        for m in o["mains"]:
            if m["grad"] is not None:
                jobs.append((m["record"], m["grad"], None))
            else:
                pi, b, e = m["fallback"]
                jobs.append((m["record"], params[pi]["grad"], (b, e)))
    rows = []
    for _record, g, rng in jobs:
        if g is None:
            rows.append(None)
            continue
        if hasattr(g, "_local_tensor"):
            g = g._local_tensor
        x = g.detach().reshape(-1)
        if rng is not None:
            x = x[rng[0] : rng[1]]
        x = x.to(torch.float64)
        if x.numel() == 0:
            rows.append(torch.zeros(3, dtype=torch.float64, device=x.device))
            continue
        rows.append(
            torch.stack(
                [(x * x).sum(), x.abs().max(), (x == 0).sum().to(torch.float64)]
            )
        )
    values = [r.cpu().tolist() if r is not None else None for r in rows]
    for (record, _g, _rng), v in zip(jobs, values):
        if v is None:
            # no gradient at all: nothing was read; an all-zero gradient stands in
            n = 1
            for s in record.get("extents", []):
                n *= s
            if "end" in record:
                n = record["end"] - record["begin"]
            v = [0.0, 0.0, float(n)]
        ss, am, z = v
        record["stats"] = {"sum_squares": float(ss), "abs_max": float(am), "zeros": int(z)}
