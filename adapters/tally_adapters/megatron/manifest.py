"""tally_adapters.megatron: write what a Megatron-core optimizer counted in its gradient norm, as the
per-rank manifest that `tally check DIR` judges (docs/manifest.md).

Call order (on EVERY rank: the function runs collectives through the optimizer):

    # gradients are in the model params' .main_grad (DDP buffers), e.g. after backward and
    # finalize_model_grads, or set by hand as in examples/tiny_moe_gpt.py
    found_inf = optimizer.prepare_grads()         # copies model grads to the main params' .grad
    norm = optimizer.get_grad_norm()              # what Megatron reports as grad norm
    zeros = optimizer.count_zeros()               # what Megatron reports as num-zeros
    dump_manifest(optimizer, model, out_dir, grad_norm=norm, num_zeros=zeros)

`grad_norm` and `num_zeros` may be left out: dump_manifest then calls `get_grad_norm()` and
`count_zeros()` itself (both collectives; every rank must call dump_manifest). Call it after
`prepare_grads()` and before anything that clips or steps, so that the main params' `.grad`
still holds the gradients the norm was computed from. In a training loop, for the step to
inspect, do the lines above and then `optimizer.step()` as usual (it repeats prepare_grads,
which is idempotent for bf16 without a loss scaler; with a dynamic fp16 scaler the scaler
would be updated twice for that step).

What is written (manifest format version 2): each rank writes `out_dir/rank-<R>.json`, and rank
0 also writes `out_dir/groups.json`, the run's group table: every distinct rank list any rank
refers to, once, sorted. A rank file refers to its groups (`groups`, each optimizer's
`stats_group`, `tp_group`, `expert_tp_group`) by index into that table, so a world-sized group
is written once for the run rather than once per rank (world squared in version 1). The ranks
agree on the table with one `all_gather_object` in which each rank sends only the lists it
leads (whose smallest rank is itself), as arithmetic runs; every rank then builds the same
sorted table. A list that does not hold the rank is therefore found only if the rank leading it
refers to it too (else refer_to_groups raises, naming it). Every file is written atomically.

What is recorded (megatron-core 0.16.1 read, not guessed; later versions are handled where
noted):

* `params`: every parameter of every model chunk (DDP / Float16Module wrappers unwrapped), in
  `named_parameters()` order. The logical name replaces `...layers.<i>` of a TransformerLayer by
  its global index (`layer_number - 1`: the pipeline offset included), the local expert index of
  `experts.local_experts.<i>` (SequentialMLP) by the global expert id
  (`MoELayer.local_expert_indices[i]`), and a TE grouped linear's `linear_fc1.weight<i>` by
  `local_experts.<global id>.linear_fc1.weight`: the names of tally's logical model
  (topologies/logical_model.h), so the worker writes the names tally sent, renaming none. A
  `shared` tied output-layer copy names the word embedding. The box of a `tensor_model_parallel` param runs along
  `partition_dim` at (rank in the sharding group) * (local extent), the group being the owning
  layer's `tp_group` (the expert-TP group for routed experts, the TP group otherwise); an
  attention sink (`core_attention.softmax_offset`) is this TP rank's heads though unmarked
  (`is_attention_sink`); any other param holds the whole tensor. (A `partition_stride` != 1 shard is not contiguous in the
  unsharded tensor; its box is then a relabelling that still partitions the logical tensor
  exactly, which is all the ledger needs.) Stats are of `.main_grad` (else `.grad`), in fp64 on
  the GPU.
* `optimizers`: the children that compute the norm:
  - LayerWiseDistributedOptimizer: its `chained_optimizers`; 0.16.1 reduces the norm
    (`get_grad_norm_fp32(..., grad_stats_parallel_group=None)`) and the zero count over WORLD,
    so `stats_group` is the whole world. Its zero count calls `count_zeros_fp32` with no
    `tp_group` in 0.16.1 (a version whose LayerWise `count_zeros` passes its own
    `tp_group`/`expert_tp_group`, Megatron-LM #6099, is recorded with those).
  - ChainedOptimizer: its `chained_optimizers`, each with its own
    `get_grad_stats_parallel_group()` (None: WORLD). When all children report the same group
    object, 0.16.1 counts zeros in one `count_zeros_fp32` over every child's params WITHOUT a
    tp_group (the fallback to the global TP rank); otherwise each child's own `count_zeros`
    (with its `tp_group`), and only if the child's `config.log_num_zeros_in_grad` is set (else
    that child contributes 0: `kept_zeros` false everywhere).
  - a single MegatronOptimizer (Float16OptimizerWithFloat16Params, FP32Optimizer,
    DistributedOptimizer): itself.
  `tp_group` / `expert_tp_group`: the child's attributes (null when absent; 0.16.1's
  `param_is_not_tensor_parallel_duplicate(param, tp_group=None)` has no expert group at all).
  `main_params`: the child's `get_parameters()` in order, mapped back to the model param
  (Float16: `float16_groups` <-> `fp32_from_float16_groups`, fp32 params are their own main;
  DistributedOptimizer: the shard's range inside its model param), with the attributes found on
  the main param (0.16.1's Float16 main copies carry the TP attributes and `shared`, not
  `allreduce`), `kept` = the main param's grad is (identity) in the child's own
  `get_main_grads_for_grad_norm()`, `kept_zeros` = Megatron's zero-count predicates
  (`param_is_not_shared`, `param_is_not_tensor_parallel_duplicate` as imported by clip_grads)
  with the groups its `count_zeros` passes.
* `reported`: `norm` = `get_grad_norm()` as a float, `zeros` = `count_zeros()` (0.16.1
  accumulates it in float32 and returns a float; written as an integer), `inf_norm` null.
* With `clip` given (a callable that runs the release's own clip of the main grads, as
  `release_clip(optimizer)` does, and returns its `ClipCall`s): after every `stats` is taken,
  the clip runs; then each main param's `clipped_stats` are of the grad the filter reads,
  read again, and each child's `clip` is `{"max_norm", "coefficient"}` of the clip call that
  scaled its main params (the coefficient it applied: min(1, max_norm / (norm + 1e-6))), null
  where no call did.

Megatron-FSDP (megatron-core 0.19's `use_megatron_fsdp`): the module's params are DTensors, which
are also the one DistributedOptimizer's params. A rank's `params` entry of one is the box of what it
holds: the flat range of the raw TP-local param in its shard of Megatron-FSDP's main-grad buffer
(whole rows; all of it for no_shard; no entry where the range is empty), with the raw param's
attributes and the statistics of that range of the buffer. Its main param is the DTensor param
itself, with the attributes found on it (Megatron-FSDP copies some of the raw param's, not
`allreduce`), `kept` as the filter decided on it, `kept_zeros` as count_zeros_fp32 counts a
Megatron-FSDP gradient (every one that is not None) and the statistics of its local gradient.

megatron-core 0.19's parameter layout chains a LayerWiseDistributedOptimizer with a
DistributedOptimizer: the layer-wise optimizer's own children are recorded as children over WORLD
(its get_grad_norm and count_zeros), with its zero count. Its separate grad-norm groups are reduced
over the model-parallel group instead (ChainedOptimizer._get_grad_norm_for_group), which a child's
one stats group cannot say: tally's rules refuse that case.

Not supported (NotImplementedError naming what): any other ChainedOptimizer nested
inside a ChainedOptimizer, the legacy GroupedMLP (all local experts in one tensor), and any
other child optimizer type.
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .. import __version__ as ADAPTER_VERSION
from ..check import GradNormMiscount, judge_run  # noqa: F401  (GradNormMiscount: part of this API)
from ..manifest import MANIFEST_VERSION, RANK_LISTS_VERSION, write_run  # noqa: F401

ATTRIBUTE_DEFAULTS = {
    "tensor_model_parallel": False,
    "partition_dim": -1,
    "allreduce": True,
    "shared": False,
    "grad_norm_group": None,
}

# ---------------------------------------------------------------------------------------------
# Pure helpers (no torch): names and boxes. tests/adapters/test_tally_megatron.py covers them.
# ---------------------------------------------------------------------------------------------

_ROUTED_EXPERT_RE = re.compile(r"(^|\.)experts\.")
_TE_GROUPED_LEAF_RE = re.compile(r"^(weight|bias)(\d+)$")


def is_routed_expert_name(local_name: str) -> bool:
    """A param of a MoE layer's routed experts (`...mlp.experts.`), not of its shared experts
    (`...mlp.shared_experts.`)."""
    return _ROUTED_EXPERT_RE.search(local_name) is not None


def logical_module_names(entries: Iterable[Tuple[str, Dict[str, Any]]]) -> Dict[str, str]:
    """Maps every local module name to its logical (global) name.

    `entries`: (local module name, info) in `named_modules()` order (parents before children);
    info may hold `layer_number` (a TransformerLayer: 1-based, pipeline offset included) or
    `local_expert_indices` (a MoE `experts` module: global id of each local expert). The root is
    the empty name.
    """
    logical: Dict[str, str] = {"": ""}
    expert_owner: Dict[str, List[int]] = {}  # local name of an `experts` module -> global ids
    for name, info in entries:
        if name == "":
            continue
        parent, _, leaf = name.rpartition(".")
        base = logical.get(parent, parent)
        # megatron-core 0.19 names an MTP layer's inner layer `mtp_model_layer`; tally (and 0.16)
        # `transformer_layer`.
        new_leaf = "transformer_layer" if leaf == "mtp_model_layer" else leaf
        if "layer_number" in info and info["layer_number"] is not None and leaf.isdigit():
            new_leaf = str(int(info["layer_number"]) - 1)
        grand, _, parent_leaf = parent.rpartition(".")
        if parent_leaf == "local_experts" and leaf.isdigit() and grand in expert_owner:
            ids = expert_owner[grand]
            i = int(leaf)
            if i >= len(ids):
                raise ValueError(f"{name}: local expert {i} but only {len(ids)} local experts")
            # `experts.local_experts.<i>` -> `experts.local_experts.<global id>`
            logical[name] = _join(_join(logical.get(grand, grand), "local_experts"), str(ids[i]))
        else:
            logical[name] = _join(base, new_leaf)
        if info.get("local_expert_indices") is not None:
            expert_owner[name] = list(info["local_expert_indices"])
    # `local_experts` containers themselves: keep a name (unused for params)
    return logical


def logical_param_name(
    local_name: str,
    module_names: Dict[str, str],
    *,
    shared: bool = False,
    expert_ids: Optional[Dict[str, List[int]]] = None,
) -> str:
    """The logical name of a param from its local name (`module.leaf`)."""
    module, _, leaf = local_name.rpartition(".")
    base = module_names.get(module, module)
    m = _TE_GROUPED_LEAF_RE.match(leaf)
    if m and expert_ids is not None and module in expert_ids:
        # TE grouped linear: `experts.linear_fc1.weight<i>` -> `experts.local_experts.<gid>.linear_fc1.weight`
        experts_mod, _, linear = base.rpartition(".")
        ids = expert_ids[module]
        return _join(_join(_join(experts_mod, "local_experts"), str(ids[int(m.group(2))])), f"{linear}.{m.group(1)}")
    name = _join(base, leaf)
    if shared and name.endswith("output_layer.weight"):
        # the tied output-layer copy of the last stage names the word embedding it copies
        name = name[: -len("output_layer.weight")] + "embedding.word_embeddings.weight"
    return name


def shard_box(
    local_shape: Sequence[int],
    tensor_model_parallel: bool,
    partition_dim: int,
    group_rank: int,
    group_size: int,
) -> Tuple[List[int], List[int], List[int]]:
    """(logical_shape, offsets, extents) of a local tensor: a TP/ETP shard along
    `partition_dim` at group_rank * local extent, or the whole tensor."""
    shape = [int(s) for s in local_shape]
    offsets = [0] * len(shape)
    logical = list(shape)
    if tensor_model_parallel and group_size > 1:
        d = partition_dim
        if d < 0:
            d += len(shape)
        if not 0 <= d < len(shape):
            raise ValueError(f"partition_dim {partition_dim} out of range for shape {shape}")
        logical[d] = shape[d] * group_size
        offsets[d] = shape[d] * group_rank
    return logical, offsets, list(shape)


def is_attention_sink(local_name: str) -> bool:
    """The local DotProductAttention's learnable softmax_offset: one sink logit for each of this TP
    rank's heads (num_attention_heads_per_partition of them), a shard of the heads along dim 0,
    which megatron-core 0.16.1 and 0.19.2 never mark tensor_model_parallel
    (transformer/dot_product_attention.py:126-138 at both; their sharded_state_dict shards it along
    dim 0, :260-267). Its box is the shard it is; its attributes stay as Megatron set them, so the
    filters read what they read in training."""
    return local_name.endswith("core_attention.softmax_offset")


def held_box(
    offsets: Sequence[int], extents: Sequence[int], begin: int, end: int, name: str = "a param"
) -> Optional[Tuple[List[int], List[int]]]:
    """(offsets, extents) of the elements [begin, end) of a box flattened row-major, which a
    Megatron-FSDP shard holds: a run along the one axis of a 1-D box, else whole rows (the first
    axis), as Megatron-FSDP cuts a param of two or more axes. None when the range is empty.
    Raises ValueError naming `name` for a range that is not whole rows, or outside the box."""
    offsets, extents = [int(o) for o in offsets], [int(e) for e in extents]
    numel = math.prod(extents)
    if not 0 <= begin <= end <= numel:
        raise ValueError(f"{name}: held range [{begin}, {end}) is outside its {numel} elements")
    if begin == end:
        return None
    row = numel // extents[0] if extents and extents[0] else 1
    if begin % row or end % row:
        raise ValueError(
            f"{name}: held range [{begin}, {end}) of shape {extents} is not whole rows of {row} elements; "
            "a manifest holds boxes"
        )
    offsets[0] += begin // row
    extents[0] = (end - begin) // row
    return offsets, extents


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a else b


# ---------------------------------------------------------------------------------------------
# The Megatron side.
# ---------------------------------------------------------------------------------------------


def dump_manifest(
    optimizer,
    model,
    out_dir: str,
    *,
    producer: Optional[str] = None,
    grad_norm: Optional[float] = None,
    num_zeros: Optional[float] = None,
    clip: Optional[Callable[[], List[Any]]] = None,
    group_norms: Optional[Dict[str, float]] = None,
    case_digest: Optional[str] = None,
) -> str:
    """Writes out_dir/rank-<R>.json for this rank (format version 2), and on rank 0 also
    out_dir/groups.json; returns the rank file's path. See the module docstring for the call
    order. `model`: one module or the list of model chunks, wrapped or not. `group_norms`: the
    norm of each separate grad-norm group the release computed (megatron-core 0.19's
    `grad_norms_by_group`, {"mtp": N}), reported beside the main norm. `case_digest`: the request's,
    where the run answers one of tally's (every file echoes it)."""
    manifest = build_manifest(
        optimizer,
        model,
        producer=producer,
        grad_norm=grad_norm,
        num_zeros=num_zeros,
        clip=clip,
        group_norms=group_norms,
    )
    return write_run(manifest, out_dir, case_digest)


class ClipCall:
    """One call of the release's clip_grad_by_total_norm_fp32: the params it scaled, its max_norm
    and the total norm it was given."""

    def __init__(self, params, max_norm, total_norm):
        self.param_ids = {id(p) for p in params}
        self.max_norm = float(max_norm)
        self.total_norm = _to_float(total_norm)

    def coefficient(self) -> float:
        # What the release multiplies by: clip_coeff = max_norm / (total_norm + 1e-6), below 1 only.
        return min(1.0, self.max_norm / (self.total_norm + 1.0e-6))


def release_clip(optimizer) -> List[ClipCall]:
    """Runs `optimizer`'s own step up to its update (prepare_grads, the norm, the clip of the main
    grads, the zero count; then no update: step_with_ready_grads is skipped for this call) and
    returns every clip call it made. Collectives: call on every rank."""
    import megatron.core.optimizer.optimizer as optimizer_module
    from megatron.core.optimizer.optimizer import ChainedOptimizer

    calls: List[ClipCall] = []
    original = optimizer_module.clip_grad_by_total_norm_fp32

    def recording(parameters, max_norm, total_norm, *args, **kwargs):
        params = [parameters] if hasattr(parameters, "shape") else list(parameters)
        calls.append(ClipCall(params, max_norm, total_norm))
        return original(params, max_norm, total_norm, *args, **kwargs)

    optimizer_module.clip_grad_by_total_norm_fp32 = recording
    optimizer.step_with_ready_grads = lambda: False  # an instance attribute: the update is skipped
    try:
        # A LayerWise optimizer's own step only adds the param all-gather after the update.
        step = ChainedOptimizer.step if isinstance(optimizer, ChainedOptimizer) else type(optimizer).step
        step(optimizer)
    finally:
        optimizer_module.clip_grad_by_total_norm_fp32 = original
        del optimizer.step_with_ready_grads
    return calls


def _record_clip(optimizers, after, calls: List[ClipCall]) -> None:
    """Each main param's clipped_stats (from `after`, the optimizers described again once the clip
    ran) and each child's clip."""
    for before, again in zip(optimizers, after):
        ids = set()
        for m, n in zip(before["mains"], again["mains"]):
            r, q = m["record"], n["record"]
            if (r["param"], r["begin"], r["end"]) != (q["param"], q["begin"], q["end"]):
                raise RuntimeError(f"{before['record']['name']}: its main params changed in the clip")
            r["clipped_stats"] = q["stats"]
            # The child's clip is the main norm's: megatron-core 0.19 clips a separate grad-norm
            # group (MTP) with that group's norm, which the judge holds each param's values to.
            if r["attributes"]["grad_norm_group"] is None:
                ids.add(id(m["main"]))
        scaled = [(len(ids & c.param_ids), c) for c in calls if ids & c.param_ids]
        if scaled:
            call = max(scaled, key=lambda x: x[0])[1]  # the main norm's call covers most of them
            before["record"]["clip"] = {"max_norm": call.max_norm, "coefficient": call.coefficient()}


def build_manifest(optimizer, model, *, producer=None, grad_norm=None, num_zeros=None, clip=None, group_norms=None):
    """This rank's manifest with every group written as its rank list: a version 1 manifest,
    which dump_manifest turns into version 2 (refer_to_groups). It is the one place that reads
    Megatron's parallel_state; runs the collectives get_grad_norm / count_zeros when those
    values are not given. `clip`: see the module docstring."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("dump_manifest needs torch.distributed initialized (as Megatron does)")
    rank = dist.get_rank()
    world = dist.get_world_size()

    if grad_norm is None:
        grad_norm = optimizer.get_grad_norm()
    if num_zeros is None:
        num_zeros = optimizer.count_zeros()

    chunks = _model_chunks(model)
    params, param_index, param_objs = _describe_params(chunks)
    optimizers = _describe_optimizers(optimizer, params, param_index, param_objs, world)

    _fill_stats(params, optimizers)
    if clip is not None:
        calls = clip()
        after = _describe_optimizers(optimizer, params, param_index, param_objs, world)
        _fill_stats([], after)
        _record_clip(optimizers, after, calls)

    manifest = {
        "tally_manifest": RANK_LISTS_VERSION,  # refer_to_groups makes it MANIFEST_VERSION
        "producer": producer or _default_producer(),
        "rank": rank,
        "world": world,
        "parallel": _parallel_sizes(),
        "groups": _groups(world),
        "params": [p["record"] for p in params],
        "optimizers": [o["record"] for o in optimizers],
        "reported": {
            "norm": _to_float(grad_norm),
            "inf_norm": None,
            "zeros": _to_count(num_zeros),
        },
    }
    if group_norms:
        manifest["reported"]["group_norms"] = {str(k): _to_float(v) for k, v in group_norms.items()}
    return manifest


def _default_producer() -> str:
    try:
        from megatron.core import package_info

        version = package_info.__version__
    except Exception:  # pragma: no cover - version lookup only
        version = "unknown"
    return f"tally_adapters.megatron {ADAPTER_VERSION} / megatron-core {version}"


def _to_float(x) -> Optional[float]:
    if x is None:
        return None
    if hasattr(x, "item"):
        x = x.item()
    return float(x)


def _to_count(x) -> Optional[int]:
    if x is None:
        return None
    if hasattr(x, "item"):
        x = x.item()
    x = float(x)
    if x != round(x):
        raise ValueError(f"count_zeros returned a non-integer {x}")
    return int(round(x))


def _ranks(group, world: int) -> List[int]:
    """Sorted global ranks of a process group; None means WORLD."""
    import torch.distributed as dist

    if group is None:
        return list(range(world))
    return sorted(int(r) for r in dist.get_process_group_ranks(group))


def _maybe_ranks(group, world: int) -> Optional[List[int]]:
    return None if group is None else _ranks(group, world)


def _parallel_sizes() -> Dict[str, int]:
    from megatron.core import parallel_state as ps

    return {
        "tp": ps.get_tensor_model_parallel_world_size(),
        "cp": ps.get_context_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "dp": ps.get_data_parallel_world_size(with_context_parallel=False),
        "ep": ps.get_expert_model_parallel_world_size(),
        "etp": ps.get_expert_tensor_parallel_world_size(),
    }


def _groups(world: int) -> Dict[str, List[int]]:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    getters = {
        "tp": lambda: ps.get_tensor_model_parallel_group(),
        "expt_tp": lambda: ps.get_expert_tensor_parallel_group(),
        "pp": lambda: ps.get_pipeline_model_parallel_group(),
        "dp_cp": lambda: ps.get_data_parallel_group(with_context_parallel=True),
        "ep": lambda: ps.get_expert_model_parallel_group(),
        "expt_dp": lambda: ps.get_expert_data_parallel_group(),
        "mp": lambda: ps.get_model_parallel_group(),
        "tp_ep_pp": lambda: ps.get_expert_tensor_model_pipeline_parallel_group(),
    }
    out: Dict[str, List[int]] = {}
    for name, get in getters.items():
        try:
            group = get()
        except Exception:
            if name in ("tp", "expt_tp"):
                raise
            continue
        if group is None or isinstance(group, (list, tuple)):
            if name in ("tp", "expt_tp"):
                raise RuntimeError(f"parallel_state gave no single {name} group")
            continue
        out[name] = sorted(int(r) for r in dist.get_process_group_ranks(group))
    out["world"] = list(range(world))
    return out


# --- the model ---------------------------------------------------------------------------------

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


def _model_chunks(model) -> List[Any]:
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if not chunks:
        raise ValueError("dump_manifest: no model chunks")
    return [_unwrap(c) for c in chunks]


def _attributes(p) -> Dict[str, Any]:
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


def _describe_params(chunks):
    """The model params: records (stats filled in later), index by id, and the param objects."""
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
                experts_name = _join(name, "experts")
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
            attrs = _attributes(model_p)
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
            if fsdp is not None:
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


# --- the optimizer -------------------------------------------------------------------------------


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


def _describe_optimizers(optimizer, params, param_index, param_objs, world):
    """Each child of `optimizer`'s plan with its main params, mapped onto `params` (the model
    params' records, as _describe_params gives them)."""
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
                        "attributes": _attributes(main),
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
            "stats_group": _ranks(stats_group, world),
            "tp_group": _maybe_ranks(getattr(child, "tp_group", None), world),
            "expert_tp_group": _maybe_ranks(getattr(child, "expert_tp_group", None), world),
            "clip": None,
            "main_params": [m["record"] for m in mains],
        }
        out.append({"record": record, "mains": mains})
    return out


def _fill_stats(params, optimizers):
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


# ---------------------------------------------------------------------------------------------
# One call for a framework's own tests.
# ---------------------------------------------------------------------------------------------


def check_grad_norm(
    optimizer,
    model,
    out_dir: str,
    *,
    tally: str = "tally",
    grad_norm: Optional[float] = None,
    num_zeros: Optional[float] = None,
    timeout: float = 600.0,
) -> str:
    """Writes this rank's manifest (dump_manifest, same call order), then rank 0 judges the run
    with `TALLY check OUT_DIR` and every rank gets its verdict (tally_adapters.check.judge_run):
    returns tally's report when every element was counted exactly once, raises GradNormMiscount
    with the report (the miscounted params, the ranks, the rule) when not, and TallyCannotJudge
    when tally could not judge (bad manifests: exit 2; tally missing). Call on every rank."""
    dump_manifest(optimizer, model, out_dir, grad_norm=grad_norm, num_zeros=num_zeros)
    return judge_run(out_dir, tally=tally, timeout=timeout)
