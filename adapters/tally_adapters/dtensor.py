"""tally_adapters.dtensor: what a PyTorch-native gradient norm counted, as the manifests `tally check`
judges (docs/manifest.md, format version 2), for any caller of `torch.nn.utils.clip_grad_norm_` or
`get_total_norm` over DTensor parameters (FSDP2, HSDP, tensor-parallel DTensors, torchtitan).

DTensor counts through placements, not attributes: the norm of a gradient DTensor is reduced over
the mesh dims where it is sharded and not over those where it is replicated (a replica that must
meet a shard in one stack is weighted 1/n on each of its n ranks, which sums to once). The
manifests say the same in tally's terms, in exact arithmetic:

- every param is its local shard, a box of the logical tensor (`local_box`, from the DTensor's own
  mesh and placements);
- the children are the caller's split (torchtitan: the EP and non-EP halves), each cut by mesh and
  placement signature (`signature`);
- every child's stats group is the world, and a piece is kept on the first replica of each
  `Replicate` dim of its mesh only (`first_replica`): the ledger then counts each element once
  exactly where DTensor does, and a caller that reduces less (no pipeline all-reduce, a half left
  out) reports a norm the ledger does not imply.

The statistics are of the gradient values the caller states (`gradient_of`); the reported norm is
the caller's own. Plain (non-DTensor) params are whole on their rank: kept everywhere, so a caller
that mixes them with replicated DTensors shows as counting them once per rank.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .manifest import finite_or_none, optimizer_child, rank_manifest, stats
from .manifest import write_run as dump_manifest  # noqa: F401  (the one writer, under the name users call)


def is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def placement_kind(placement) -> str:
    """"R" (replicated), "S" (sharded, strided too) or "P" (a partial sum: not a gradient one can count)."""
    if placement.is_replicate():
        return "R"
    if placement.is_partial():
        return "P"
    return "S"


def dim_names(mesh) -> List[str]:
    """A mesh's dim names as plain strings (a framework may name them with a str Enum: Automodel's
    MeshAxisName)."""
    return [str(getattr(n, "value", n)) for n in (mesh.mesh_dim_names or ())]


def signature(p) -> Tuple[Any, ...]:
    """The mesh and placements a param's norm is reduced by: (mesh dim names, kinds); plain
    tensors have none."""
    if not is_dtensor(p):
        return ("local",)
    names = tuple(p.device_mesh.mesh_dim_names or (f"dim{i}" for i in range(p.device_mesh.ndim)))
    return tuple(f"{n}:{placement_kind(pl)}" for n, pl in zip(names, p.placements))


def local_box(p) -> Tuple[List[int], List[int]]:
    """(offsets, extents) of the box of the logical tensor this rank's shard of `p` holds."""
    if not is_dtensor(p):
        return [0] * p.dim(), list(p.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    if tuple(shape) != tuple(p.to_local().shape):
        raise ValueError(f"a DTensor of shape {tuple(p.shape)} on {p.placements}: its local shard is "
                         f"{tuple(p.to_local().shape)}, its placements say {tuple(shape)}")
    return [int(o) for o in offset], [int(s) for s in shape]


def first_replica(p) -> bool:
    """Whether this rank is the first on every mesh dim `p` is replicated over (where the ledger
    counts its shard; DTensor weights each replica 1/n instead, the same sum)."""
    if not is_dtensor(p):
        return True
    coordinate = p.device_mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("a DTensor on a mesh that does not hold this rank")
    return all(c == 0 for c, pl in zip(coordinate, p.placements) if placement_kind(pl) == "R")


def ranks_along(mesh, dims: Sequence[int]) -> List[int]:
    """The ranks of `mesh` that differ from this rank only along the mesh dims `dims`: the group a
    collective over those dims of `mesh` reduces over on this rank (this rank alone for none)."""
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("a mesh that does not hold this rank")
    grid = mesh.mesh
    index = tuple(slice(None) if d in dims else c for d, c in enumerate(coordinate))
    return sorted(int(r) for r in grid[index].reshape(-1).tolist())


def local_values(t):
    """The flat numpy values of this rank's shard of `t` (a DTensor's local tensor, or `t`)."""
    local = t.to_local() if is_dtensor(t) else t
    return local.detach().cpu().numpy().reshape(-1).copy()


def place_gradient(p, full, name: str):
    """Sets `p.grad` to the whole gradient `full` (a torch tensor of p's logical shape) placed as `p`
    is (`distribute_tensor`, no communication), checks that this rank's shard is the box of `full`
    its placements describe (local_box), and returns (that box, the shard's flat values)."""
    import numpy as np
    import torch.distributed as dist
    from torch.distributed.tensor import distribute_tensor

    p.grad = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None) if is_dtensor(p) else full.clone()
    local = local_values(p.grad)
    offsets, extents = local_box(p)
    box = full.detach().cpu().numpy()[tuple(slice(o, o + e) for o, e in zip(offsets, extents))]
    if not np.array_equal(box.reshape(-1), local):
        raise ValueError(f"rank {dist.get_rank()}: {name}'s gradient shard is not the box {offsets}+{extents} its "
                         f"placements {getattr(p, 'placements', None)} describe")
    return (offsets, extents), local


def clip_coefficients(children: Sequence[Any], params: Sequence[Any], child_of: Callable[[Any], Any],
                      before: Dict[int, Any], after: Dict[int, Any], max_norm: float,
                      norm: float) -> Dict[Any, Tuple[float, float]]:
    """child key -> (max_norm, what the caller's clip multiplied that child's gradients by): the ratio
    of their norms after and before where they tell (`before` and `after`: each param's flat values
    by id), else the clip's rule, min(1, max_norm / (norm + 1e-6))."""
    import numpy as np

    formula = min(1.0, max_norm / (norm + 1.0e-6))
    clips = {}
    for key in children:
        mine = [p for p in params if child_of(p) == key]
        squares = sum(float(np.dot(before[id(p)].astype(np.float64), before[id(p)])) for p in mine)
        clipped = sum(float(np.dot(after[id(p)].astype(np.float64), after[id(p)])) for p in mine)
        clips[key] = (max_norm, math.sqrt(clipped / squares) if squares > 0 else formula)
    return clips


def attributes_of(p, tp_dim_name: str = "tp", expert: bool = False, dim_offset: int = 0) -> Dict[str, Any]:
    """Megatron's counting attributes as the placements give them: sharded over the mesh dim
    `tp_dim_name` is `tensor_model_parallel` with that shard dim (less `dim_offset`: an expert's
    own dims in a stacked tensor); expert params are not `allreduce`."""
    partition = -1
    if is_dtensor(p):
        for name, pl in zip(p.device_mesh.mesh_dim_names or (), p.placements):
            if name == tp_dim_name and placement_kind(pl) == "S":
                partition = int(getattr(pl, "dim", -1)) - dim_offset
    return {
        "tensor_model_parallel": partition >= 0,
        "partition_dim": partition,
        "allreduce": not expert,
        "shared": False,
        "grad_norm_group": None,
    }


class Piece:
    """One manifest param: the elements [begin, end) of a local param's flattened shard that are
    one box of one logical param (a stacked tensor of experts holds several)."""

    def __init__(self, param, name: str, begin: int, end: int, logical_name: str, logical_shape: Sequence[int],
                 offsets: Sequence[int], extents: Sequence[int], attributes: Dict[str, Any]):
        self.param = param
        self.name = name  # the caller's local name of the piece
        self.begin, self.end = begin, end
        self.logical_name = logical_name
        self.logical_shape = [int(d) for d in logical_shape]
        self.offsets = [int(o) for o in offsets]
        self.extents = [int(e) for e in extents]
        self.attributes = attributes


def canonical_children(local_keys, world: int) -> List[Any]:
    """Every rank's child keys (a caller's half, then a signature), gathered and sorted, so every
    rank lists the same children in the same order: collective."""
    import torch.distributed as dist

    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, sorted(set(local_keys), key=repr))
    return sorted({key for keys in gathered for key in keys}, key=repr)


def build_manifest(
    pieces: Sequence[Piece],
    child_of: Callable[[Any], Any],
    children: Sequence[Any],
    gradient_of: Callable[[Any], Any],
    *,
    child_names: Callable[[Any], str],
    groups: Dict[str, List[int]],
    parallel: Dict[str, int],
    producer: str,
    reported_norm: Optional[float],
    clips: Optional[Dict[Any, Tuple[float, float]]] = None,
    clipped_of: Optional[Callable[[Any], Any]] = None,
    stats_groups: Optional[Dict[Any, List[int]]] = None,
) -> Dict[str, Any]:
    """This rank's manifest (rank lists; manifest.write_run turns them into group indices).
    `pieces`: every local piece of every trainable param. `child_of(param)`: its key among
    `children` (canonical_children's list). `gradient_of(param)` / `clipped_of(param)`: the flat
    values of its local shard before and after the caller clipped (numpy). `clips`: child key ->
    (max_norm, coefficient) where the caller clipped. `groups`: this rank's groups by name, `tp` and
    `expt_tp` among them. `stats_groups`: child key -> the ranks this rank's norm of that child is
    summed over, for a caller that reduces each child over groups of its own (NeMo-Automodel); every
    piece is then kept, counted by exactly those ranks. Without it, DTensor's rule: every child over
    the world, a piece kept on the first replica of its Replicate dims."""
    import torch.distributed as dist

    everyone = list(range(dist.get_world_size()))
    params, main_params = [], {key: [] for key in children}
    for piece in pieces:
        values = gradient_of(piece.param)[piece.begin:piece.end]
        piece_stats = stats(values)  # the param's and its main param's: the same elements
        entry = len(params)
        params.append({
            "name": piece.name,
            "logical_name": piece.logical_name,
            "logical_shape": piece.logical_shape,
            "offsets": piece.offsets,
            "extents": piece.extents,
            "attributes": piece.attributes,
            "stats": piece_stats,
        })
        record = {
            "param": entry,
            "begin": 0,
            "end": int(piece.end - piece.begin),
            "attributes": piece.attributes,
            "kept": True if stats_groups is not None else first_replica(piece.param),
            "kept_zeros": False,
            "stats": piece_stats,
        }
        key = child_of(piece.param)
        if clips is not None and key in clips and clipped_of is not None:
            record["clipped_stats"] = stats(clipped_of(piece.param)[piece.begin:piece.end])
        if key not in main_params:
            raise ValueError(f"a param of child {key!r}, which is not among the children {list(children)!r}")
        main_params[key].append(record)
    optimizers = [optimizer_child(child_names(key), everyone if stats_groups is None else sorted(stats_groups[key]),
                                  main_params[key], clip=(clips or {}).get(key))
                  for key in children]
    return rank_manifest(producer=producer, parallel=parallel, groups=dict(groups, world=everyone), params=params,
                         optimizers=optimizers, norm=finite_or_none(reported_norm))
