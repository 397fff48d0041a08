"""The case's experts: Hugging Face-style MoE blocks for AutoEP to replace (build_autoep_model,
add_autoep_blocks), and which expert and piece each expert param holds once DeepSpeed made its
copies, AutoEP's stacked tensors (describe_autoep) or DeepSpeed's own MoE layers (describe_experts).
"""

from ..module_keys import module_key, name_of_module_key
from .models import local_box, split_experts, weighted_sum_model, whole_params

# whose router is `gate` and whose experts hold gate, up and down projections as 3-D tensors.
# AutoEP's patterns (moe.<name>, gate, experts, gate_proj/down_proj/up_proj) are in tally's engine
# configuration (run/deepspeed/engine.cpp).
# AutoEP's GroupedExperts tensors: name -> (tally's expert param each expert's slice is, which half of
# its rows (None: all of them)). SwiGLU's FC1 is the gate rows, then the up rows (Megatron's order).
_AUTOEP_WEIGHTS = {"w1": ("linear_fc1.weight", 0), "w3": ("linear_fc1.weight", 1), "w2": ("linear_fc2.weight", None)}


def autoep_slices(tensors, shapes, prefix, w, experts):
    """Each expert's slice of AutoEP's tensor `w` of the MoE layer `prefix`: (tally's param, shape,
    offsets, extents, values)."""
    import numpy as np

    suffix, half = _AUTOEP_WEIGHTS[w]
    slices = []
    for e in experts:
        name = f"{prefix}experts.local_experts.{e}.{suffix}"
        shape = shapes[name]
        rows = shape[0] if half is None else shape[0] // 2
        offsets = [0 if half is None else half * rows, 0]
        values = tensors[name][offsets[0]:offsets[0] + rows]
        slices.append((name, shape, offsets, [rows, shape[1]], np.ascontiguousarray(values)))
    return slices


def moe_param_names(index):
    """The names of the routers and routed experts of tally's model (what AutoEP's layers hold)."""
    dense, moe_layers = split_experts([p["name"] for p in index])
    routers = {f"{prefix}router.weight" for prefix in moe_layers}
    return routers | (set(p["name"] for p in index) - set(dense))


def build_autoep_model(index, tensors, moe, dtype):
    """The module AutoEP replaces MoE layers in (deepspeed.initialize with expert_parallel): tally's
    MoE layers as add_autoep_blocks makes them, every other param whole (shared experts too:
    AutoEP keeps only a block's router and experts)."""
    module = weighted_sum_model()
    add_autoep_blocks(module, index, tensors, moe, dtype)
    moe_names = moe_param_names(index)
    module.dense = whole_params([p["name"] for p in index if p["name"] not in moe_names],
                                {p["name"]: list(p["shape"]) for p in index}, dtype)
    return module


def add_autoep_blocks(module, index, tensors, moe, dtype):
    """Each of tally's MoE layers as `module.moe.<layer>`, a block of a router `gate` (nn.Linear)
    and `experts` holding every expert's SwiGLU projections as 3-D tensors of tally's values, as
    Hugging Face's MoE models do."""
    import numpy as np
    import torch
    import torch.nn as nn

    shapes = {p["name"]: list(p["shape"]) for p in index}
    _, moe_layers = split_experts(shapes)
    for prefix, suffixes in moe_layers.items():
        if sorted(suffixes) != ["linear_fc1.weight", "linear_fc2.weight"]:
            raise LookupError(f"model mismatch: {prefix}experts has {sorted(suffixes)}; AutoEP's experts are "
                              "SwiGLU projections without biases")
    module.moe = nn.ModuleDict()

    def stacked(prefix, w):
        slices = autoep_slices(tensors, shapes, prefix, w, range(moe["experts"]))
        return nn.Parameter(torch.from_numpy(np.stack([values for *_, values in slices])).to(dtype))

    for prefix in moe_layers:
        router = f"{prefix}router.weight"
        block = nn.Module()
        block.gate = nn.Linear(shapes[router][1], shapes[router][0], bias=False, dtype=dtype)
        with torch.no_grad():
            block.gate.weight.copy_(torch.from_numpy(tensors[router].copy()).to(dtype))
        block.experts = nn.Module()
        block.experts.gate_proj = stacked(prefix, "w1")
        block.experts.up_proj = stacked(prefix, "w3")
        block.experts.down_proj = stacked(prefix, "w2")
        module.moe[module_key(prefix)] = block


def autoep_expert_tensors(engine_module):
    """AutoEP's expert tensors: (path, param, its MoE layer's prefix, its weight w1/w2/w3, the experts it
    holds, as AutoEP records them for its checkpoints)."""
    out = []
    for path, p in engine_module.named_parameters():
        attr, rest = path.split(".", 1)
        if attr != "moe":
            continue
        key, inner = rest.split(".", 1)
        if inner.startswith("experts."):
            experts = list(getattr(p, "ds_autoep_uc_meta", {}).get("local_experts", []))
            out.append((path, p, name_of_module_key(key), inner.rsplit(".", 1)[1], experts))
    return out


def autoep_values(engine_module, shapes, tensors):
    """param -> the values of `tensors` (logical name -> array) that each of AutoEP's expert tensors
    holds, its experts stacked: for tally's gradients, or a rank's shares of them."""
    import numpy as np

    return {id(p): np.stack([v for *_, v in autoep_slices(tensors, shapes, prefix, w, experts)])
            for _, p, prefix, w, experts in autoep_expert_tensors(engine_module)}


def describe_autoep(engine_module, shapes, tensors):
    """After AutoEP has replaced the MoE blocks (`moe.*`): param -> (logical name, shape, offsets,
    extents) for each router (whole), and, for each of AutoEP's expert tensors, its pieces (one per
    local expert: a slice of tally's expert param, `local` its flat elements) and its values,
    checked against the tensor AutoEP holds. The other params are describe_dense's."""
    import numpy as np
    import torch

    described, pieces, values = {}, {}, {}
    for path, p in engine_module.named_parameters():
        attr, rest = path.split(".", 1)
        if attr == "moe":
            key, inner = rest.split(".", 1)
            prefix = name_of_module_key(key)  # ends with its dot
            if inner.startswith("experts."):
                w = inner.rsplit(".", 1)[1]
                if w not in _AUTOEP_WEIGHTS:
                    raise LookupError(f"model mismatch: AutoEP holds {path}, which is none of w1, w2, w3")
                # the experts AutoEP placed on this rank, as it records them for its checkpoints
                experts = list(getattr(p, "ds_autoep_uc_meta", {}).get("local_experts", []))
                if len(experts) != p.shape[0]:
                    raise LookupError(f"model mismatch: AutoEP's {path} holds {p.shape[0]} experts, its placement "
                                      f"names {experts}")
                slices = autoep_slices(tensors, shapes, prefix, w, experts)
                values[id(p)] = np.stack([v for *_, v in slices])
                if not torch.equal(p.detach().cpu(), torch.from_numpy(values[id(p)].copy()).to(p.dtype)):
                    raise LookupError(f"model mismatch: AutoEP's {path} is not experts {experts} of tally's model")
                size = values[id(p)][0].size
                pieces[id(p)] = [{"logical_name": name, "logical_shape": shape, "offsets": offsets, "extents": extents,
                                  "local": (i * size, (i + 1) * size)}
                                 for i, (name, shape, offsets, extents, _) in enumerate(slices)]
                continue
            if not inner.startswith("router."):
                raise LookupError(f"model mismatch: AutoEP's layer holds {path}, neither router nor experts")
            name = f"{prefix}router.weight"
            described[id(p)] = (name, shapes[name], [0] * len(shapes[name]), shapes[name])
    return described, pieces, values


def describe_experts(layers, described, expert_tp, tp_rank, tp, shapes, splits):
    """Once deepspeed.initialize has made the expert groups: each local expert's logical name
    (global expert = EP rank x local experts + local index) and box. `layers`: prefix -> MoE."""
    from deepspeed.utils import groups

    for prefix, layer in layers.items():
        ep_rank = groups._get_expert_parallel_rank(layer.expert_group_name)
        for i, expert in enumerate(layer.deepspeed_moe.experts.deepspeed_experts):
            e = ep_rank * layer.num_local_experts + i
            for key, p in expert.params.items():
                logical = f"{prefix}experts.local_experts.{e}.{key.replace('__', '.')}"
                if logical not in shapes:
                    raise LookupError(f"model mismatch: DeepSpeed holds expert {e} ({logical}), which tally's "
                                      "model of the case does not have")
                offsets, extents, _ = local_box(shapes[logical], splits[logical], tp_rank, tp if expert_tp else 1)
                if list(p.shape) != extents:
                    raise LookupError(f"model mismatch: {logical} is {list(p.shape)} on this rank, {extents} expected")
                # Its marks are what DeepSpeed left: Experts deep-copies the expert it is given, and a
                # copied torch Parameter has none of the template's (docs/findings).
                described[id(p)] = (logical, shapes[logical], offsets, extents)
