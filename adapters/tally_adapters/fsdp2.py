"""Gradients that enter before FSDP2's own reduction: each rank's contribution left by a backward under
FSDP2's hooks, so `fully_shard`'s post-backward reduce-scatter (and HSDP's all-reduce), with the divide
factor the framework set, runs exactly as in training. Shared by the workers whose frameworks wrap
their models with `fully_shard` (torchtitan, NeMo-Automodel).

The loss is not the model's: while FSDP2 runs its hooks around each unit's `forward` (a module
`fully_shard` wrapped; other wrappers' forward hooks, a TP plan's, are set aside meanwhile), that
forward is, for the block, the sum over the params the unit manages
itself of `term(path, p)` (p as FSDP2 has unsharded it, path its name in `named_parameters`) plus its
nested units' forwards. A term whose gradient is this rank's share of the param's gradient (its local
values times the share, summed) makes backward leave exactly that share in each unsharded gradient,
which FSDP2 then reduces.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, List, Tuple


def _units(model):
    """Every unit `fully_shard` made in `model`, each with the params it manages itself, as
    (module, local name, path) (a param shared by two modules, a tied embedding, once), and the units
    directly nested in it. `model` itself first; {} when FSDP2 wrapped nothing."""
    from torch.distributed.fsdp import FSDPModule

    units: Dict[int, Tuple[object, List[Tuple[object, str, str]], List[object]]] = {}
    seen = set()

    def walk(module, prefix, unit):
        for local, p in module._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                units[id(unit)][1].append((module, local, prefix + local))
        for name, child in module._modules.items():
            if child is None:
                continue
            if isinstance(child, FSDPModule):
                units[id(unit)][2].append(child)
                units[id(child)] = (child, [], [])
                walk(child, prefix + name + ".", child)
            else:
                walk(child, prefix + name + ".", unit)

    if not isinstance(model, FSDPModule):
        if any(isinstance(m, FSDPModule) for m in model.modules()):
            raise ValueError("FSDP2 wrapped submodules but not the model's root, which its users always wrap last")
        return {}
    units[id(model)] = (model, [], [])
    walk(model, "", model)
    return units


def _forward_of(own, nested):
    def forward(term):
        total = 0
        for module, local, path in own:
            total = total + term(path, module._parameters[local])
        for unit in nested:
            total = total + unit(term)
        return total

    return forward


def _is_fsdp_hook(hook) -> bool:
    """Whether a forward (pre-)hook is FSDP2's own (FSDPState's, possibly wrapped for a group of
    modules), not one another wrapper registered (a TP plan's input and output layouts)."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    # FSDPState's bound methods, whose functions FSDP2 decorates (and wraps again for a group): the
    # state is the `__self__` of one link of the `__wrapped__` chain.
    while hook is not None:
        if isinstance(getattr(hook, "__self__", None), FSDPState):
            return True
        hook = getattr(hook, "__wrapped__", None)
    return False


@contextlib.contextmanager
def _unit_forwards(units):
    """Each unit's forward the loss above for the `with` block, with FSDP2's forward hooks only (a TP
    plan's hooks lay out activations, which this forward has none of); the model's own after it."""
    saved = []
    try:
        for unit, own, nested in units.values():
            for hooks in (unit._forward_pre_hooks, unit._forward_hooks):
                saved.append((hooks, list(hooks.items())))
                for hook_id, hook in list(hooks.items()):
                    if not _is_fsdp_hook(hook):
                        del hooks[hook_id]
            unit.forward = _forward_of(own, nested)  # an instance attribute: __call__ takes it
        yield
    finally:
        for unit, _, _ in units.values():
            unit.__dict__.pop("forward", None)
        for hooks, items in saved:
            hooks.clear()
            hooks.update(items)


def backward_through_fsdp2(model, term: Callable[[str, object], object]) -> None:
    """Clears every gradient, then runs the backward of the sum of `term(path, p)` over every param of
    `model` under FSDP2's hooks, so each param's gradient is the reduction FSDP2 makes of the terms'
    gradients over its group. Without FSDP2 (a data-parallel size of 1 left unwrapped) it is the plain
    backward of that sum."""
    for p in model.parameters():
        p.grad = None
    units = _units(model)
    if not units:
        total = 0
        for path, p in model.named_parameters():
            total = total + term(path, p)
        total.backward()
        return
    with _unit_forwards(units):
        model(term).backward()


def local_term(shares: Dict[str, object], device, partial_over=()) -> Callable[[str, object], object]:
    """The term whose gradient on this rank is its share: `shares[path]` (numpy, the param's whole
    logical shape) cut to the box of the logical tensor this rank's unsharded param holds, times the
    param's local values, summed. The gradient is this rank's own, placed as the param is, except
    that on a mesh dim named in `partial_over` (the TP dim under sequence parallelism) a Replicate
    param's gradient is Partial, as sequence-sharded activations leave it: FSDP2 sums it over that
    dim before its own reduction."""
    import numpy as np
    import torch
    from torch.distributed.tensor import Partial

    from . import dtensor as tally_dtensor

    def grad_placements(p):
        names = tally_dtensor.dim_names(p.device_mesh)
        return tuple(Partial() if name in partial_over and placement.is_replicate() else placement
                     for name, placement in zip(names, p.placements))

    def term(path, p):
        offsets, extents = tally_dtensor.local_box(p)
        box = shares[path][tuple(slice(o, o + e) for o, e in zip(offsets, extents))]
        weight = torch.from_numpy(np.ascontiguousarray(box)).to(device=device, dtype=p.dtype)
        local = p.to_local(grad_placements=grad_placements(p)) if tally_dtensor.is_dtensor(p) else p
        return (local * weight).sum()

    return term


def replicated_over(p, dim_name: str) -> bool:
    """Whether the DTensor param `p` is Replicate on its mesh dim `dim_name` (False where it has none)."""
    from . import dtensor as tally_dtensor

    if not tally_dtensor.is_dtensor(p):
        return False
    names = tally_dtensor.dim_names(p.device_mesh)
    return any(name == dim_name and placement.is_replicate() for name, placement in zip(names, p.placements))


def held_gradients(params):
    """Each param's local box and the flat values FSDP2 left in its gradient (zeros where it left none:
    the clip then skips the param, and the judge sees what it missed), by id."""
    import math

    import numpy as np

    from . import dtensor as tally_dtensor

    boxes, held = {}, {}
    for p in params:
        boxes[id(p)] = tally_dtensor.local_box(p)
        held[id(p)] = tally_dtensor.local_values(p.grad) if p.grad is not None else \
            np.zeros(int(math.prod(boxes[id(p)][1])), dtype=np.float32)
    return boxes, held
