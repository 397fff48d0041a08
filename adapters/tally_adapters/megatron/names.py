"""Names and boxes, with no torch: a Megatron param's logical name (what tally's model calls it),
the box of the logical tensor a rank's piece holds, and which params are routed experts or
attention sinks. tests/adapters/megatron/test_megatron_manifest.py covers them.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

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
            logical[name] = join_name(join_name(logical.get(grand, grand), "local_experts"), str(ids[i]))
        else:
            logical[name] = join_name(base, new_leaf)
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
        return join_name(join_name(join_name(experts_mod, "local_experts"), str(ids[int(m.group(2))])), f"{linear}.{m.group(1)}")
    name = join_name(base, leaf)
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


def join_name(a: str, b: str) -> str:
    return f"{a}.{b}" if a else b
