"""A case with experts as its family's transformers class, for the hf worker: where tally's logical
elements lie in each param (tally_adapters.hf_families' element map) and in each rank's shard of it.

The shard's elements are read by placing the param's element ids as the param is placed
(`distribute_tensor` of the id array with the param's mesh and placements: Shard, _StridedShard of
transformers' packed columns, Replicate, no communication), so what a rank holds is what its
placements give it, whatever their kind; a shard's ids become manifest pieces, each a run of
consecutive elements of one row of one logical param (whole rows merged into one box). No torch or
transformers import at module level.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from .. import hf_families


def family_model(model: Dict, family: str) -> Dict:
    """The case's model as hf_families reads it: its family named as a preset (a generic MoE model
    is built as the Mixtral or Qwen3-MoE of its size: run/hf/rules.cpp hf_moe_family)."""
    return dict(model, preset=family)


def build(model: Dict, family: str, index: Sequence[Dict]):
    """(the family's transformers class, its model at tally's sizes, the element map), the map
    checked to hold every logical element of the index exactly once."""
    import transformers

    as_family = family_model(model, family)
    cls = getattr(transformers, hf_families.class_name(as_family))
    module = cls(hf_families.hf_config(as_family, index))
    emap = hf_families.element_map(as_family, index)
    hf_families.check_bijection(emap, {n: list(p.shape) for n, p in module.named_parameters()}, index)
    return cls, module, emap


def flat_values(tensors: Dict, index: Sequence[Dict]):
    """tally's logical values laid end to end in the index's order, float32: what an element id indexes."""
    import numpy as np

    return np.concatenate([np.asarray(tensors[p["name"]], dtype=np.float32).reshape(-1) for p in index])


def placed_ids(p, ids):
    """This rank's element ids of param `p` (ids: the whole param's), placed as `p` is: flat int64."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    whole = torch.from_numpy(ids)
    if isinstance(p, DTensor):
        whole = distribute_tensor(whole, p.device_mesh, p.placements, src_data_rank=None).to_local()
    return whole.reshape(-1).numpy().copy()


def pieces(flat_ids, index: Sequence[Dict]) -> List[Tuple[int, int, str, List[int], List[int], List[int]]]:
    """A shard's elements (`flat_ids`, in its flattened order) as (begin, end, logical name, logical
    shape, offsets, extents): runs of consecutive elements of one row of one logical param, merged
    into whole-row boxes where consecutive whole rows follow."""
    import numpy as np

    names = [p["name"] for p in index]
    shapes = [[int(d) for d in p["shape"]] for p in index]
    starts = np.cumsum([0] + [int(np.prod(s, dtype=np.int64)) for s in shapes])
    owners = np.searchsorted(starts, flat_ids, side="right") - 1
    runs: List[List[int]] = []  # [owner, row, column, count, begin]
    for k, (element, owner) in enumerate(zip(flat_ids.tolist(), owners.tolist())):
        shape = shapes[owner]
        if len(shape) > 2:
            raise LookupError(f"model mismatch: {names[owner]} is {shape}; the worker records 1- and 2-D params")
        width = shape[-1] if shape else 1
        row, column = divmod(element - int(starts[owner]), width)
        last = runs[-1] if runs else None
        if last and last[0] == owner and last[1] == row and last[2] + last[3] == column:
            last[3] += 1
        else:
            runs.append([owner, row, column, 1, k])
    out: List[Tuple[int, int, str, List[int], List[int], List[int]]] = []
    for owner, row, column, count, begin in runs:
        shape = shapes[owner]
        if len(shape) == 2:
            prev = out[-1] if out else None
            whole_row = column == 0 and count == shape[1]
            if (whole_row and prev and prev[2] == names[owner] and prev[4][1] == 0 and prev[5][1] == shape[1]
                    and prev[4][0] + prev[5][0] == row and prev[1] == begin):
                out[-1] = (prev[0], begin + count, prev[2], prev[3], prev[4], [prev[5][0] + 1, shape[1]])
                continue
            out.append((begin, begin + count, names[owner], shape, [row, column], [1, count]))
        else:
            out.append((begin, begin + count, names[owner], shape, [column], [count]))
    return out
