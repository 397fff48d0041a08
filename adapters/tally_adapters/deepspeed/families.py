"""A preset case as DeepSpeed's users train it: the Hugging Face transformers model class of the
preset's family (tally_adapters.hf_families), given to `deepspeed.initialize` as it is, sharded by
AutoTP from the class's own tensor-parallel plan where the case has `deepspeed.autotp` (the
engine configuration then names only `autotp_size`: run/deepspeed/engine.cpp).

Which of tally's elements each shard holds is read back from the shard, not assumed: before
DeepSpeed sees the model, every element of each param holds its own position in the param (1, 2,
...), exact in the case's dtype, so after AutoTP cut it each rank's shard names the positions it
kept, and the family's element map (hf_families.element_map) turns them into tally's logical
elements. The values never matter otherwise: the loss is sum(param * its share of tally's gradient).

The case takes this path where uses_family says (run/deepspeed/rules.cpp's `builds_family` is the
same rule): a preset with a family, without PP or AutoEP, TP only through AutoTP, experts only at
EP 1 (the family's fused experts are then plain params DeepSpeed reduces over DP, as a user's
ZeRO run of the class has them), below ZeRO 3.
"""

from .. import hf_families

# The largest integer each dtype holds exactly, with every smaller one: a param's positions must fit.
_EXACT = {"float32": 1 << 24, "bfloat16": 1 << 8, "float16": 1 << 11}


def uses_family(case):
    """Whether the worker builds the case as its preset's transformers class (rules.cpp builds_family)."""
    m, t, d = case["model"], case["topology"], case.get("deepspeed") or {}
    return (m.get("preset") in hf_families.FAMILIES and t["pp"] == 1 and not d.get("autoep")
            and (t["tp"] == 1 or bool(d.get("autotp"))) and (not m.get("num_experts") or t["ep"] == 1)
            and d.get("zero_stage") != 3)


def build_family_model(case, index, dtype):
    """The preset's transformers model in `dtype`, each param's elements numbered 1, 2, ... in it,
    and its element map."""
    import torch

    model, limit = case["model"], _EXACT[str(dtype).replace("torch.", "")]
    module = hf_families.build_model(model, index, dtype)
    emap = hf_families.element_map(model, index)
    hf_families.check_bijection(emap, {n: list(p.shape) for n, p in module.named_parameters()}, index)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.numel() > limit:
                raise LookupError(f"model mismatch: {name} has {p.numel()} elements; the worker reads a shard's "
                                  f"positions back from its values, exact in {dtype} up to {limit}")
            p.copy_(torch.arange(1, p.numel() + 1, dtype=torch.float64).reshape(p.shape).to(dtype))
    return module, emap


def _box_pieces(ids, index):
    """A shard's logical elements (`ids`, flat, in its order) as manifest pieces: runs of consecutive
    elements of one row of one logical param, merged into whole-row boxes where they are."""
    import numpy as np

    names = [p["name"] for p in index]
    shapes = [[int(d) for d in p["shape"]] for p in index]
    starts = np.cumsum([0] + [int(np.prod(s, dtype=np.int64)) for s in shapes])
    pieces = []
    for k, element in enumerate(ids.tolist()):
        owner = int(np.searchsorted(starts, element, side="right")) - 1
        at, shape = element - int(starts[owner]), shapes[owner]
        width = shape[-1] if shape else 1
        row, column = divmod(at, width)
        last = pieces[-1] if pieces else None
        if last and last["owner"] == owner and last["row"] == row and last["column"] + last["count"] == column:
            last["count"] += 1
            continue
        pieces.append({"owner": owner, "row": row, "column": column, "count": 1, "begin": k})
    out = []
    for piece in pieces:
        shape = shapes[piece["owner"]]
        width = shape[-1] if shape else 1
        whole_row = piece["column"] == 0 and piece["count"] == width and len(shape) == 2
        prev = out[-1] if out else None
        if (whole_row and prev and prev["logical_name"] == names[piece["owner"]] and prev["whole_rows"]
                and prev["offsets"][0] + prev["extents"][0] == piece["row"]):
            prev["extents"][0] += 1
            prev["local"] = (prev["local"][0], prev["local"][1] + width)
            continue
        if len(shape) == 2:
            offsets, extents = [piece["row"], piece["column"]], [1, piece["count"]]
        else:
            offsets, extents = [piece["column"]], [piece["count"]]
        out.append({"logical_name": names[piece["owner"]], "logical_shape": shape, "offsets": offsets,
                    "extents": extents, "local": (piece["begin"], piece["begin"] + piece["count"]),
                    "whole_rows": whole_row})
    for piece in out:
        del piece["whole_rows"]
    return out


def describe_family(engine_module, emap, index):
    """After deepspeed.initialize: param -> the ids of tally's logical elements it holds (its shape),
    read from the positions each element was given; raises LookupError where a param holds a
    position twice or one its Hugging Face param does not have."""
    import numpy as np

    held = {}
    for name, p in engine_module.named_parameters():
        if name not in emap.params:
            raise LookupError(f"model mismatch: DeepSpeed holds {name}, which the family's class does not have")
        full = emap.params[name].reshape(-1)
        positions = np.rint(p.detach().float().cpu().numpy()).astype(np.int64).reshape(-1) - 1
        if positions.size and (positions.min() < 0 or positions.max() >= full.size
                               or np.unique(positions).size != positions.size):
            raise LookupError(f"model mismatch: {name}'s shard {list(p.shape)} holds positions {positions.tolist()} "
                              f"of its {full.size} elements: not a cut of the param")
        held[id(p)] = full[positions].reshape(tuple(p.shape))
    return held


def family_pieces(held, index):
    """param -> its manifest pieces (recording.build_manifest's describe), from describe_family."""
    return {key: _box_pieces(ids.reshape(-1), index) for key, ids in held.items()}


def flat_values(tensors, index):
    """tally's logical values (name -> array) laid end to end in the index's order: what an id indexes."""
    import numpy as np

    return np.concatenate([np.asarray(tensors[p["name"]]).reshape(-1) for p in index])
