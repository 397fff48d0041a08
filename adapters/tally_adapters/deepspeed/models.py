"""The case's model as DeepSpeed is given it: tally's logical params sharded over TP as a
Megatron-DeepSpeed model presents them (build_model, with real `deepspeed.moe.layer.MoE` layers),
or whole `nn.Linear` layers for AutoTP to cut (build_autotp_model); and, after
`deepspeed.initialize`, which piece of which logical param each of the engine's params holds
(describe_dense).
"""

import re

from ..module_keys import module_key, name_of_module_key

EXPERT_PARAM_NAME = re.compile(r"^(.*\.mlp\.)experts\.local_experts\.(\d+)\.(.+)$")


def local_box(shape, split_dim, tp_rank, tp):
    """(offsets, extents, split) of the piece a TP rank holds of a logical param TP splits along
    `split_dim` (the gradient index's, from its class; None: TP replicates it)."""
    dim = split_dim
    offsets, extents = [0] * len(shape), list(shape)
    if dim is None or tp == 1:
        return offsets, extents, None
    if shape[dim] % tp:
        raise ValueError(f"dim {dim} of {list(shape)}, which TP splits, is not divisible by TP {tp}")
    extents[dim] = shape[dim] // tp
    offsets[dim] = tp_rank * extents[dim]
    return offsets, extents, dim


def split_experts(names):
    """(the names of dense params and routers, {MoE layer prefix: {expert param suffix: [experts]}})."""
    dense, moe_layers = [], {}
    for name in names:
        hit = EXPERT_PARAM_NAME.match(name)
        if hit:
            layer = moe_layers.setdefault(hit.group(1), {})
            layer.setdefault(hit.group(3), []).append(int(hit.group(2)))
        else:
            dense.append(name)
    for prefix in moe_layers:
        if f"{prefix}router.weight" not in dense:
            raise LookupError(f"model mismatch: {prefix}experts has no {prefix}router.weight")
    return dense, moe_layers


def moe_settings(case):
    """What every MoE layer of the case is built with."""
    t, m = case["topology"], case["model"]
    tp = t["tp"]
    return {"experts": m["num_experts"], "ep": t["ep"], "hidden": m["hidden_size"], "expert_tp": tp > 1 and t["etp"] == tp}


def moe_layer(prefix, suffixes, shapes, splits, moe, tp_rank, tp, dtype):
    """A deepspeed.moe.layer.MoE for one of tally's MoE layers, and its gate weight's description
    (router name, shape, offsets, extents). Its experts are described once DeepSpeed has made the
    expert groups (describe_experts)."""
    import torch
    import torch.nn as nn
    from deepspeed.moe.layer import MoE

    template = nn.Module()
    template.params = nn.ParameterDict()
    for suffix in suffixes:
        shape = shapes[f"{prefix}experts.local_experts.0.{suffix}"]
        _, extents, dim = local_box(shape, splits[f"{prefix}experts.local_experts.0.{suffix}"], tp_rank,
                                    tp if moe["expert_tp"] else 1)
        param = nn.Parameter(torch.zeros(extents, dtype=dtype))
        if dim is not None:  # marked as Megatron-DeepSpeed's Column/RowParallelLinear marks its shards
            param.tensor_model_parallel, param.partition_dim = True, dim
        template.params[module_key(suffix)] = param
    layer = MoE(moe["hidden"], template, num_experts=moe["experts"], ep_size=moe["ep"], k=1,
                enable_expert_tensor_parallelism=moe["expert_tp"])
    layer.to(dtype)
    router = f"{prefix}router.weight"
    wg = layer.deepspeed_moe.gate.wg.weight
    if list(wg.shape) != shapes[router]:
        raise LookupError(f"model mismatch: DeepSpeed's gate is {list(wg.shape)}, {router} {shapes[router]}")
    return layer, wg, (router, shapes[router], [0, 0], shapes[router])


def dense_param(name, shapes, splits, tp_rank, tp, dtype):
    """This TP rank's piece of a dense param (marked tensor_model_parallel where it is split), and
    its description (logical name, shape, offsets, extents)."""
    import torch
    import torch.nn as nn

    offsets, extents, dim = local_box(shapes[name], splits[name], tp_rank, tp)
    p = nn.Parameter(torch.zeros(extents, dtype=dtype))
    if dim is not None:
        p.tensor_model_parallel, p.partition_dim = True, dim
    return p, (name, shapes[name], offsets, extents)


def weighted_sum_model():
    """An empty module whose forward() is sum(param * weights[its path]) over every param of its
    own and its submodules', `weights` the dict in its attribute `term_weights` (not an input:
    AutoTP checks that every TP rank's inputs are equal). Each param is read by attribute, which
    under ZeRO 3 gathers it (its `_parameters` fetch on access), so at ZeRO 3 the loss is this
    forward. A param without a weight is left out."""
    import torch.nn as nn

    class WeightedSum(nn.Module):
        def forward(self):
            weights, total = self.term_weights, 0
            for path, module in self.named_modules():
                for name in list(module._parameters):
                    key = f"{path}.{name}" if path else name
                    if key in weights:
                        total = total + (getattr(module, name) * weights[key]).sum()
            return total

    return WeightedSum()


def build_model(case, index, mpu, moe, dtype):
    """The module DeepSpeed wraps, and param -> (logical name, shape, offsets, extents)."""
    import torch.nn as nn

    tp = case["topology"]["tp"]
    tp_rank = mpu.get_model_parallel_rank()
    splits = {p["name"]: p["split_dim"] for p in index}
    shapes = {p["name"]: list(p["shape"]) for p in index}
    dense, moe_layers = split_experts(splits)

    module = weighted_sum_model()
    module.dense = nn.ParameterDict()
    module.moe = nn.ModuleDict()
    described = {}
    for name in dense:
        if any(name == f"{prefix}router.weight" for prefix in moe_layers):
            continue
        p, described[id(p)] = dense_param(name, shapes, splits, tp_rank, tp, dtype)
        module.dense[module_key(name)] = p
    layers = {}
    for prefix, suffixes in moe_layers.items():
        layer, wg, router = moe_layer(prefix, suffixes, shapes, splits, moe, tp_rank, tp, dtype)
        module.moe[module_key(prefix)] = layers[prefix] = layer
        described[id(wg)] = router
    return module, described, layers, shapes, splits


# AutoTP's layer specs for the modules build_autotp_model makes (column., row., tp_summed.) are in
# tally's engine configuration (run/deepspeed/engine.cpp).
_AUTOTP_WEIGHT = {"column": "column", "vocab": "column", "row": "row"}
_AUTOTP_BIAS = {"column": "column-bias", "row": "replicated"}


def autotp_plan(index):
    """tally's params as the modules AutoTP shards: {"column"|"row": {module: {leaf: name}}}, the
    q/k norms whose gradients AutoTP sums over TP, and the params it leaves whole. The word
    embedding stays whole (AutoTP's spec-matched nn.Embedding is split over hidden and unmarked,
    an inference layout); the output layer is a column-parallel linear."""
    classes = {p["name"]: p["class"] for p in index}
    linears, tp_summed = {"column": {}, "row": {}}, []
    for name, cls in classes.items():
        module, leaf = name.rsplit(".", 1)
        kind = _AUTOTP_WEIGHT.get(cls) if leaf == "weight" and module != "embedding.word_embeddings" else None
        if kind:
            bias = f"{module}.bias"
            if bias in classes and classes[bias] != _AUTOTP_BIAS[kind]:
                raise LookupError(f"model mismatch: {bias} is {classes[bias]}; a {kind}-parallel linear's "
                                  f"bias is {_AUTOTP_BIAS[kind]}")
            linears[kind][module] = {"weight": name, **({"bias": bias} if bias in classes else {})}
        elif re.search(r"\.[qk]_layernorm\.", name):
            tp_summed.append(name)
    in_linear = {n for kind in linears.values() for leaves in kind.values() for n in leaves.values()}
    whole = [n for n in classes if n not in in_linear and n not in tp_summed]
    return linears, tp_summed, whole


def whole_params(names, shapes, dtype):
    """A ParameterDict of the named params of tally's model, whole (keys: the names with "__" for ".")."""
    import torch
    import torch.nn as nn

    return nn.ParameterDict({module_key(name): nn.Parameter(torch.zeros(shapes[name], dtype=dtype))
                             for name in names})


def build_autotp_model(index, tensors, dtype):
    """The module AutoTP shards (deepspeed.initialize with tensor_parallel.autotp_size = TP): tally's
    column and row params as whole nn.Linear layers holding tally's gradient values (so the shards
    AutoTP cuts can be checked against the boxes the worker describes), everything else whole."""
    import torch
    import torch.nn as nn

    linears, tp_summed, whole = autotp_plan(index)
    shapes = {p["name"]: list(p["shape"]) for p in index}
    module = weighted_sum_model()
    for kind, layers in linears.items():
        setattr(module, kind, nn.ModuleDict())
        for prefix, leaves in layers.items():
            out_features, in_features = shapes[leaves["weight"]]
            linear = nn.Linear(in_features, out_features, bias="bias" in leaves, dtype=dtype)
            with torch.no_grad():
                for leaf, name in leaves.items():
                    getattr(linear, leaf).copy_(torch.from_numpy(tensors[name].copy()).to(dtype))
            getattr(module, kind)[module_key(prefix)] = linear
    module.tp_summed = whole_params(tp_summed, shapes, dtype)
    module.dense = whole_params(whole, shapes, dtype)
    return module


def describe_dense(engine_module, index, tensors, tp_rank, tp):
    """The params outside AutoEP's layers of a module AutoTP sharded (or, at TP 1, a plain one):
    param -> (logical name, shape, offsets, extents), each of AutoTP's shards checked against the
    box tally expects (its values are the logical param's), every other param whole."""
    import torch

    splits = {p["name"]: p["split_dim"] for p in index}
    shapes = {p["name"]: list(p["shape"]) for p in index}
    described = {}
    for path, p in engine_module.named_parameters():
        attr, rest = path.split(".", 1)
        if attr == "moe":  # AutoEP's layers: describe_autoep's
            continue
        if attr in ("column", "row"):
            prefix, leaf = rest.rsplit(".", 1)
            name = f"{prefix.replace('__', '.')}.{leaf}"
            split = splits[name]  # vocab (the output layer) splits dim 0, as a column
        else:
            name, split = name_of_module_key(rest), None
        offsets, extents, _ = local_box(shapes[name], split, tp_rank, tp)
        if list(p.shape) != extents:
            raise LookupError(f"model mismatch: AutoTP holds {list(p.shape)} of {name} {shapes[name]} on TP rank "
                              f"{tp_rank}; tally expects {extents} (split along dim {split} over TP {tp})")
        if attr in ("column", "row"):
            want = tensors[name][tuple(slice(o, o + e) for o, e in zip(offsets, extents))]
            if not torch.equal(p.detach().cpu(), torch.from_numpy(want.copy()).to(p.dtype)):
                raise LookupError(f"model mismatch: AutoTP's shard of {name} on TP rank {tp_rank} is not elements "
                                  f"{offsets} + {extents} of it")
        described[id(p)] = (name, shapes[name], offsets, extents)
    return described
