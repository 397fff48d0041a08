"""Collectives a framework calls that gloo lacks, each built exactly from collectives gloo has, so a
worker on CPUs (or several ranks sharing one GPU) runs the framework's own reduction unmodified.

- `ReduceOp.PREMUL_SUM(f)` (NCCL's: each rank's input times f, then summed) in
  `reduce_scatter_tensor`, `reduce_scatter_single` and `all_reduce`: FSDP2 reduces with it whenever
  a gradient divide factor is set (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
  `_get_gradient_divide_factors`), and torchtitan sets one on every FSDP module. Gloo raises "Cannot
  use ReduceOp.PREMUL_SUM with Gloo"; the shim multiplies a copy of the input by f and sums it with
  gloo's SUM, which is the op's definition. Every other op, and every group of another backend,
  goes to torch's collective untouched.

- A coalesced block (`torch.distributed._coalescing_manager`) on a gloo group: megatron-core's DDP
  issues each bucket's all-reduce inside one (megatron/core/distributed/param_and_grad_buffer.py),
  which ends in `allreduce_coalesced`, and gloo refuses that on CUDA tensors ("ProcessGroupGloo::
  allreduce_coalesced: unsupported device type cuda"). The shim runs each collective of the block
  as it is issued: the same all-reduces (reduce-scatters) over the same group, one per tensor,
  each rank's tensors summed as the coalesced op sums them. Only synchronous blocks: an async one
  (overlapped gradient reduction) raises.

`installed()` puts the PREMUL_SUM shims in place for a `with` block, `coalesced_one_by_one()` the
coalescing one, and each restores torch's functions after it. tests/adapters/test_gloo_shims.py
checks each against torch's own collectives on gloo.
"""

from __future__ import annotations

import contextlib
import functools

# Each collective shimmed: its input argument, and whether it works in place.
_SHIMMED = {"reduce_scatter_tensor": ("input", False), "reduce_scatter_single": ("input", False),
          "all_reduce": ("tensor", True)}


def _premul_factor(op):
    """The factor of a PREMUL_SUM op; None for any other op."""
    from torch.distributed import ReduceOp

    # A bare RedOpType (ReduceOp.SUM, ...) has no `op`; only a ReduceOp made with a factor is one.
    if isinstance(op, ReduceOp) and getattr(op, "op", None) == ReduceOp.RedOpType.PREMUL_SUM:
        if not hasattr(op, "factor"):
            raise RuntimeError(f"torch {torch_version()} keeps a PREMUL_SUM's factor out of Python's reach, so "
                               "tally_adapters.gloo_shims cannot run it on gloo (torch 2.12 and later can)")
        return op.factor
    return None


def torch_version() -> str:
    import torch

    return torch.__version__


def premul_sum_readable() -> bool:
    """Whether this torch makes PREMUL_SUM ops whose factor the shim can read (torch 2.12 and later)."""
    from torch.distributed import ReduceOp

    return callable(ReduceOp.PREMUL_SUM)


def _on_gloo(group) -> bool:
    import torch.distributed as dist

    return dist.get_backend(group) == "gloo"


def _premul_sum_on_gloo(collective, input_name: str, in_place: bool = False):
    """`collective` with PREMUL_SUM on a gloo group done as gloo's SUM over each rank's input
    (argument `input_name`) times the factor: a scaled copy, or the tensor itself scaled where the
    collective works in place (all_reduce)."""
    import inspect

    from torch.distributed import ReduceOp

    signature = inspect.signature(collective)

    @functools.wraps(collective)
    def shimmed(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        factor = _premul_factor(bound.arguments["op"])
        if factor is None or not _on_gloo(bound.arguments["group"]):
            return collective(*args, **kwargs)
        tensor = bound.arguments[input_name]
        bound.arguments[input_name] = tensor.mul_(factor) if in_place else tensor * factor
        bound.arguments["op"] = ReduceOp.SUM
        return collective(*bound.args, **bound.kwargs)

    shimmed.tally_shim = collective
    return shimmed


@contextlib.contextmanager
def installed():
    """torch.distributed's collectives with the shims above for the `with` block (the framework
    calls them through the module, as `dist.reduce_scatter_single`)."""
    import torch.distributed as dist

    # reduce_scatter_single is torch 2.12's and later; each collective the installed torch has.
    originals = {name: getattr(dist, name) for name in _SHIMMED if hasattr(dist, name)}
    if any(hasattr(f, "tally_shim") for f in originals.values()):
        yield  # already in place (a nested block)
        return
    for name, collective in originals.items():
        setattr(dist, name, _premul_sum_on_gloo(collective, *_SHIMMED[name]))
    try:
        yield
    finally:
        for name, f in originals.items():
            setattr(dist, name, f)


def _one_by_one_on_gloo(manager):
    """torch's coalescing manager `manager`, but on a gloo group a block whose collectives run as
    they are issued (none is queued for a coalesced op)."""

    @contextlib.contextmanager
    @functools.wraps(manager)
    def shimmed(group=None, device=None, async_ops=False):
        from torch.distributed import distributed_c10d as c10d

        if not _on_gloo(group or c10d._get_default_group()):
            with manager(group, device, async_ops) as cm:
                yield cm
            return
        if async_ops:
            raise RuntimeError("tally_adapters.gloo_shims runs a coalesced block on gloo one collective at a time, "
                               "synchronously; an async block (overlapped gradient reduction) is not shimmed")
        yield c10d._CoalescingManager()

    shimmed.tally_shim = manager
    return shimmed


@contextlib.contextmanager
def coalesced_one_by_one():
    """torch's `_coalescing_manager`, in torch.distributed and in every module that imported it by
    name (megatron-core's param_and_grad_buffer does), run one collective at a time on gloo groups
    for the `with` block."""
    import sys

    from torch.distributed import distributed_c10d as c10d

    original = c10d._coalescing_manager
    if hasattr(original, "tally_shim"):
        yield  # already in place (a nested block)
        return
    # A module's own dict, not getattr: a lazy module's __getattr__ would import what it names.
    holders = [m for m in list(sys.modules.values())
               if m is not None and vars(m).get("_coalescing_manager") is original]
    shim = _one_by_one_on_gloo(original)
    for module in holders:
        module._coalescing_manager = shim
    try:
        yield
    finally:
        for module in holders:
            module._coalescing_manager = original
