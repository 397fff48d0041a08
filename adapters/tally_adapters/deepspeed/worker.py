#!/usr/bin/env python3
"""tally's worker for DeepSpeed: executes tally's cases with DeepSpeed's own, unmodified engine
and optimizers and writes the manifests `tally` judges (`tally fuzz|run|replay --target deepspeed`).

Started by tally, once per world size, under torchrun (one process per rank):

    torchrun --standalone --nproc-per-node WORLD -m tally_adapters.deepspeed.worker \\
        --queue DIR --parent-pid PID [--backend auto|nccl|gloo]

It speaks the queue protocol of tally_adapters.queue (docs/real-targets.md). Per case, on every rank:

1. Process groups for the case's topology, as a Megatron-style `mpu` DeepSpeed is given: TP
   groups of consecutive ranks, DP groups strided by TP (tally's order tp-cp-ep-dp-pp with CP
   and PP 1). DeepSpeed makes its own expert groups from them (`ep_size_<EP>`: EP groups are
   consecutive ranks of a DP group). With PP > 1 the case runs on DeepSpeed's pipeline engine
   instead (build_pipeline, below), whose grid is the mpu.
2. The case's model, as a Megatron-DeepSpeed model presents it to DeepSpeed: every param of
   tally's logical model, sharded by its class over TP (dim 0 for column/vocab, dim 1 for row;
   marked `tensor_model_parallel` with its `partition_dim`) or whole; each MoE layer a real
   `deepspeed.moe.layer.MoE` whose gate weight is the router and whose experts are the routed
   experts (DeepSpeed marks them `allreduce=False`). `etp == tp > 1` turns on DeepSpeed's expert
   tensor parallelism (the experts' FC1/FC2 sharded over TP like the dense MLP, the shards of the
   expert given to the MoE layer marked as Megatron-DeepSpeed marks them; DeepSpeed's copies are
   left as DeepSpeed makes them); `etp == 1` leaves every expert whole on each TP rank,
   DeepSpeed's default.
3. `deepspeed.initialize` with an AdamW at lr 0 (torch's, or DeepSpeed's FusedAdam with
   `deepspeed.fused_adam`) and the DeepSpeed configuration tally sends with the case
   (`case-<K>.engine.json`, from the case's `deepspeed` section: ZeRO stage, fp32 gradient
   accumulation, loss scale; the precision is the case's gradient dtype), then one backward of sum(param * gradient) through
   `engine.backward`: every rank holds tally's values of its pieces, so after DeepSpeed's own
   data-parallel reductions (and ZeRO's partitioning) each gradient is tally's value, exactly
   (the values are representable in the dtype). DeepSpeed sums a gradient over its reduction
   group (DP, or expert-DP for experts) and divides by the DP size: only the group's first rank
   gives the gradient, times the DP size (a power of two), the others 0, so no 16-bit sum rounds.
   A step DeepSpeed skips (an fp16 overflow) is reported as an error, not judged.
4. `engine.step()` inside `recording.Recording`, which records what DeepSpeed's norm code
   kept, and the manifests of `engine.get_global_grad_norm()` into `case-<K>/`.

With `deepspeed.autotp` and `deepspeed.autoep` DeepSpeed shards the model itself instead, as it
does a Hugging Face model: no mpu (AutoTP makes the TP and DP groups), whole `nn.Linear` layers
AutoTP cuts (build_autotp_model), Hugging Face-style MoE blocks AutoEP replaces
(add_autoep_blocks), both together for AutoEP folded over AutoTP, and for AutoEP the engine's own
optimizer (an AdamW at lr 0), since AutoEP makes its params inside `deepspeed.initialize`.
At ZeRO 3 the loss is the module's forward (weighted_sum_model), which makes ZeRO 3 gather every
param.
"""

import contextlib
import gc
import math
import os
import re
import sys

from .. import worker as base
from ..plants import Patches
from ..queue import framework_setup
from . import recording as tally_deepspeed
from .fused_adam import prepare_fused_adam
from .recording import expert_groups_by_name

SPLIT_DIM = {"column": 0, "column-bias": 0, "vocab": 0, "head-sharded": 0, "row": 1,
             "expert-column": 0, "expert-column-bias": 0, "expert-row": 1}
_EXPERT = re.compile(r"^(.*\.mlp\.)experts\.local_experts\.(\d+)\.(.+)$")


# --- planted faults (the real mutation score) -------------------------------------------------
#
# A catalog fault (`tally run --list-faults`) with a counterpart in DeepSpeed is planted for one case
# by replacing the function that decides its rule, in every loaded deepspeed module that imported it
# (or on the class that defines it); the originals are put back after the case. DeepSpeed's files
# are never touched. recording.Recording reads the replaced predicates too, so the manifests
# show a planted filter; a planted reduction shows in the reported norm.


def _keep_every_param(orig):
    return lambda p: True


def _no_param_is_tensor_parallel(orig):
    return lambda p: False


def _expert_norm_dropped_bf16(orig):
    def get_norm_with_moe_layers(non_expert_norm, mpu, expert_tensors, norm_type=2):
        return orig(non_expert_norm, mpu, {}, norm_type)

    return get_norm_with_moe_layers


def _expert_norm_dropped_zero(orig):
    def _average_expert_grad_norms(self, norm_groups):
        for i in range(len(norm_groups)):
            if self.is_moe_param_group[i]:
                norm_groups[i] = norm_groups[i] * 0.0

    return _average_expert_grad_norms


def _no_ep_reduction(orig):
    def get_global_norm_of_tensors(input_tensors, norm_type=2, mpu=None, moe_ep_group=None):
        return orig(input_tensors, norm_type=norm_type, mpu=mpu, moe_ep_group=None)

    return get_global_norm_of_tensors


def _stage3_norm_without_ep(orig):
    def get_grad_norm_direct(self, gradients, params, norm_type=2):
        # only inside the norm: ZeRO 3's gradient averaging reads the same method
        self._autoep_expert_parallel_group = lambda params: None
        try:
            return orig(self, gradients, params, norm_type)
        finally:
            del self._autoep_expert_parallel_group

    return get_grad_norm_direct


def _tied_copies_counted(orig):
    def _index_tied_modules(self):
        comms = orig(self)
        for key in comms:
            for p in self.tied_modules[key].parameters():
                p.ds_pipe_replicated = False
        return comms

    return _index_tied_modules


def _stage_model_group(orig):
    def get_model_parallel_group(self):
        return self.slice_proc_group  # the stage's own TP group, not every stage's

    return get_model_parallel_group


# fault -> ([(module, or "module:Class", the function, how to make the replacement), ...], how)
PLANTS = {
    "no-dedup-filter": (
        [("deepspeed.runtime.utils", "is_model_parallel_parameter", _keep_every_param)],
        "is_model_parallel_parameter holds for every param, so no TP replica is dropped",
    ),
    "tp-marking-unseen-by-filter": (
        [("deepspeed.runtime.utils", "is_model_parallel_parameter", _no_param_is_tensor_parallel)],
        "is_model_parallel_parameter holds for no param, so TP shards count only on TP rank 0",
    ),
    "expert-norm-dropped": (
        [("deepspeed.runtime.utils", "get_norm_with_moe_layers", _expert_norm_dropped_bf16),
         ("deepspeed.runtime.zero.stage_1_and_2:DeepSpeedZeroOptimizer", "_average_expert_grad_norms",
          _expert_norm_dropped_zero)],
        "get_norm_with_moe_layers ignores the expert groups; ZeRO's expert group norms become 0",
    ),
    "missing-ep-reduction": (
        [("deepspeed.runtime.utils", "get_global_norm_of_tensors", _no_ep_reduction),
         ("deepspeed.runtime.zero.stage3:DeepSpeedZeroOptimizer_Stage3", "get_grad_norm_direct", _stage3_norm_without_ep)],
        "get_global_norm_of_tensors is called without its expert-parallel group; ZeRO 3's norm of AutoEP's "
        "experts runs as if they had no expert-parallel group (not summed over EP; folded over TP, not counted "
        "on every TP rank either)",
    ),
    "tied-copy-not-shared": (
        [("deepspeed.runtime.pipe.module:PipelineModule", "_index_tied_modules", _tied_copies_counted)],
        "no tied layer's copy is marked ds_pipe_replicated",
    ),
    "missing-pp-reduction": (
        [("deepspeed.runtime.pipe.topology:PipelineParallelGrid", "get_model_parallel_group", _stage_model_group)],
        "the pipeline grid's model group is the stage's TP group, so norms are not summed over stages",
    ),
}

NOT_PLANTED = {
    "allreduce-flag-lost-on-main-params": "DeepSpeed reads allreduce on the model params themselves",
    "expert-weights-not-tp-marked": "an attribute of the params: the worker's model sets it",
    "expert-label-from-ep-only": "an attribute of the params: DeepSpeed's MoE layer sets allreduce=False",
    "expert-label-ignores-gtp": "generalized TP is megatron-core's",
    "muon-expert-stats-without-egtp": "generalized TP is megatron-core's",
    "expert-stats-over-dense-mp": "Megatron's Muon grouping",
    "expert-dedup-on-dense-tp": "Megatron's duplicate filter with TP groups; DeepSpeed's filter takes none",
    "clip-per-child-norm": "clipping: the manifests record no clip coefficient yet",
    "clip-per-stage-norm": "clipping: the manifests record no clip coefficient yet",
    "clip-per-ep-group-norm": "clipping: the manifests record no clip coefficient yet",
    "tp-sharded-param-unmarked": "an attribute of the params: the worker's model sets it",
    "replicated-marked-tp": "an attribute of the params: the worker's model sets it",
    "average-rank-norms": "DeepSpeed's clip_grad_norm_ averages already (DeepSpeed #8475)",
    "stats-over-replicas": "DeepSpeed's groups are the mpu's and its own: no one stats group to widen",
    "zero-count-in-float32": "DeepSpeed reports no zero count",
    "empty-rank-skips-collective": "a hang: the worker would be stopped, not judged",
    "inf-norm-combined-by-l2": "the worker reports the L2 norm only",
    "distopt-padding-counted": "Megatron's DistributedOptimizer",
    "distopt-overlapping-shards": "Megatron's DistributedOptimizer",
    "average-local-norms-over-dp": "DeepSpeed's clip_grad_norm_ does it already (DeepSpeed #8475)",
    "norm-of-scaled-gradients": "DeepSpeed 0.19.8 never scales an fp16 loss at ZeRO 0 (docs/findings), so "
                                "FP16_UnfusedOptimizer's norm is of unscaled gradients: #8588 shows once it does",
    "layer-wise-unsharded-at-dp-cp-1": "Megatron's layer-wise optimizer",
}


# --- the case's process groups ---------------------------------------------------------------


class Mpu:
    """The Megatron-style model-parallel unit DeepSpeed reads (TP only: PP and CP are 1)."""

    def __init__(self, tp):
        import torch.distributed as dist

        world, rank = dist.get_world_size(), dist.get_rank()
        self.tp, self.rank = tp, rank
        self.tp_ranks = self.dp_ranks = None
        for first in range(0, world, tp):
            ranks = list(range(first, first + tp))
            g = dist.new_group(ranks)
            if rank in ranks:
                self.tp_group, self.tp_ranks = g, ranks
        for i in range(tp):
            ranks = list(range(i, world, tp))
            g = dist.new_group(ranks)
            if rank in ranks:
                self.dp_group, self.dp_ranks = g, ranks

    def get_model_parallel_rank(self):
        return self.tp_ranks.index(self.rank)

    get_tensor_model_parallel_rank = get_model_parallel_rank

    def get_model_parallel_world_size(self):
        return self.tp

    get_tensor_model_parallel_world_size = get_model_parallel_world_size

    def get_model_parallel_group(self):
        return self.tp_group

    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self):
        return self.dp_ranks.index(self.rank)

    def get_data_parallel_world_size(self):
        return len(self.dp_ranks)

    def get_data_parallel_group(self):
        return self.dp_group

    def get_pipeline_model_parallel_world_size(self):
        return 1

    def get_pipeline_model_parallel_rank(self):
        return 0


# --- the case's model -----------------------------------------------------------------------


def local_box(shape, cls, tp_rank, tp):
    """(offsets, extents, split) of the piece a TP rank holds of a logical param of class `cls`."""
    dim = SPLIT_DIM.get(cls)
    offsets, extents = [0] * len(shape), list(shape)
    if dim is None or tp == 1:
        return offsets, extents, None
    if shape[dim] % tp:
        raise ValueError(f"class {cls}: dim {dim} of {list(shape)} is not divisible by TP {tp}")
    extents[dim] = shape[dim] // tp
    offsets[dim] = tp_rank * extents[dim]
    return offsets, extents, dim


def split_experts(names):
    """(the names of dense params and routers, {MoE layer prefix: {expert param suffix: [experts]}})."""
    dense, moe_layers = [], {}
    for name in names:
        hit = _EXPERT.match(name)
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
    tp = t.get("tp", 1)
    return {"experts": int(m.get("num_experts", 0) or 0), "ep": t.get("ep", 1), "hidden": int(m.get("hidden_size", 16)),
            "expert_tp": tp > 1 and t.get("etp", tp) == tp}


def moe_layer(prefix, suffixes, shapes, classes, moe, tp_rank, tp, dtype):
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
        _, extents, dim = local_box(shape, classes[f"{prefix}experts.local_experts.0.{suffix}"], tp_rank,
                                    tp if moe["expert_tp"] else 1)
        param = nn.Parameter(torch.zeros(extents, dtype=dtype))
        if dim is not None:  # marked as Megatron-DeepSpeed's Column/RowParallelLinear marks its shards
            param.tensor_model_parallel, param.partition_dim = True, dim
        template.params[suffix.replace(".", "__")] = param
    layer = MoE(moe["hidden"], template, num_experts=moe["experts"], ep_size=moe["ep"], k=1,
                enable_expert_tensor_parallelism=moe["expert_tp"])
    layer.to(dtype)
    router = f"{prefix}router.weight"
    wg = layer.deepspeed_moe.gate.wg.weight
    if list(wg.shape) != shapes[router]:
        raise LookupError(f"model mismatch: DeepSpeed's gate is {list(wg.shape)}, {router} {shapes[router]}")
    return layer, wg, (router, shapes[router], [0, 0], shapes[router])


def dense_param(name, shapes, classes, tp_rank, tp, dtype):
    """This TP rank's piece of a dense param (marked tensor_model_parallel where it is split), and
    its description (logical name, shape, offsets, extents)."""
    import torch
    import torch.nn as nn

    offsets, extents, dim = local_box(shapes[name], classes[name], tp_rank, tp)
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

    tp = case["topology"].get("tp", 1)
    tp_rank = mpu.get_model_parallel_rank()
    classes = {p["name"]: p["class"] for p in index}
    shapes = {p["name"]: list(p["shape"]) for p in index}
    dense, moe_layers = split_experts(classes)

    module = weighted_sum_model()
    module.dense = nn.ParameterDict()
    module.moe = nn.ModuleDict()
    described = {}
    for name in dense:
        if any(name == f"{prefix}router.weight" for prefix in moe_layers):
            continue
        p, described[id(p)] = dense_param(name, shapes, classes, tp_rank, tp, dtype)
        module.dense[name.replace(".", "__")] = p
    layers = {}
    for prefix, suffixes in moe_layers.items():
        layer, wg, router = moe_layer(prefix, suffixes, shapes, classes, moe, tp_rank, tp, dtype)
        module.moe[prefix.replace(".", "__")] = layers[prefix] = layer
        described[id(wg)] = router
    return module, described, layers, shapes, classes


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

    return nn.ParameterDict({name.replace(".", "__"): nn.Parameter(torch.zeros(shapes[name], dtype=dtype))
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
            getattr(module, kind)[prefix.replace(".", "__")] = linear
    module.tp_summed = whole_params(tp_summed, shapes, dtype)
    module.dense = whole_params(whole, shapes, dtype)
    return module


def describe_dense(engine_module, index, tensors, tp_rank, tp):
    """The params outside AutoEP's layers of a module AutoTP sharded (or, at TP 1, a plain one):
    param -> (logical name, shape, offsets, extents), each of AutoTP's shards checked against the
    box tally expects (its values are the logical param's), every other param whole."""
    import torch

    classes = {p["name"]: p["class"] for p in index}
    shapes = {p["name"]: list(p["shape"]) for p in index}
    described = {}
    for path, p in engine_module.named_parameters():
        attr, rest = path.split(".", 1)
        if attr == "moe":  # AutoEP's layers: describe_autoep's
            continue
        if attr in ("column", "row"):
            prefix, leaf = rest.rsplit(".", 1)
            name = f"{prefix.replace('__', '.')}.{leaf}"
            cls = classes[name]  # vocab (the output layer) splits dim 0, as a column
        else:
            name, cls = rest.replace("__", "."), "replicated"
        offsets, extents, _ = local_box(shapes[name], cls, tp_rank, tp)
        if list(p.shape) != extents:
            raise LookupError(f"model mismatch: AutoTP holds {list(p.shape)} of {name} {shapes[name]} on TP rank "
                              f"{tp_rank}; tally expects {extents} ({cls} over TP {tp})")
        if attr in ("column", "row"):
            want = tensors[name][tuple(slice(o, o + e) for o, e in zip(offsets, extents))]
            if not torch.equal(p.detach().cpu(), torch.from_numpy(want.copy()).to(p.dtype)):
                raise LookupError(f"model mismatch: AutoTP's shard of {name} on TP rank {tp_rank} is not elements "
                                  f"{offsets} + {extents} of it")
        described[id(p)] = (name, shapes[name], offsets, extents)
    return described


# AutoEP's detection, for the module build_autoep_model makes: each MoE layer a `moe.<key>` block
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
        module.moe[prefix.replace(".", "__")] = block


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
            prefix = key.replace("__", ".")  # ends with its dot
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


def describe_experts(layers, described, expert_tp, tp_rank, tp, shapes, classes):
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
                offsets, extents, _ = local_box(shapes[logical], classes[logical], tp_rank, tp if expert_tp else 1)
                if list(p.shape) != extents:
                    raise LookupError(f"model mismatch: {logical} is {list(p.shape)} on this rank, {extents} expected")
                # Its marks are what DeepSpeed left: Experts deep-copies the expert it is given, and a
                # copied torch Parameter has none of the template's (docs/findings).
                described[id(p)] = (logical, shapes[logical], offsets, extents)


# --- the case's pipeline (PP > 1) ------------------------------------------------------------
#
# DeepSpeed's pipeline parallelism is its own engine: a PipelineModule of layer specs, which makes
# its own grid of process groups (PipeModelDataParallelTopology: TP fastest, then DP, then PP,
# tally's default order) and hands it to DeepSpeed as the mpu. Each stage is one layer holding the
# params tally's model places on it; a tied word embedding is a TiedLayerSpec on the first and the
# last stage, so DeepSpeed itself marks the last stage's copy `ds_pipe_replicated` and sums the
# copies' gradients. Each layer adds sum(param * weight) to the activation it passes on, and the
# last stage's loss is that activation (its first entry): the gradient of every param is its weight, reached through
# DeepSpeed's own schedule (train_batch), p2p sends, tied and data-parallel reductions.


def stage_block_class():
    import torch.distributed as dist
    import torch.nn as nn

    class StageBlock(nn.Module):
        """The params tally's model places on one stage (or the tied word embedding), TP-sharded
        as build_model shards them, each MoE layer a deepspeed.moe.layer.MoE; `weights[id(param)]`
        is set to each one's gradient before the step."""

        def __init__(self, entries, moe, tp, dtype):
            super().__init__()
            tp_rank = dist.get_rank() % tp  # TP is the fastest axis of DeepSpeed's grid
            classes = {p["name"]: p["class"] for p in entries}
            shapes = {p["name"]: list(p["shape"]) for p in entries}
            dense, moe_layers = split_experts(classes)
            self.params = nn.ParameterDict()
            self.moe = nn.ModuleDict()
            self.described, self.layers, self.weights = {}, {}, {}
            routers = {f"{prefix}router.weight" for prefix in moe_layers}
            for name in dense:
                if name not in routers:
                    p, self.described[id(p)] = dense_param(name, shapes, classes, tp_rank, tp, dtype)
                    self.params[name.replace(".", "__")] = p
            for prefix, suffixes in moe_layers.items():
                layer, wg, self.described[id(wg)] = moe_layer(prefix, suffixes, shapes, classes, moe, tp_rank, tp,
                                                              dtype)
                self.moe[prefix.replace(".", "__")] = self.layers[prefix] = layer
            self.shapes, self.classes = shapes, classes

        def forward(self, x):
            for p in self.parameters():
                x = x + (p * self.weights[id(p)]).sum()
            return x

    return StageBlock


def pipeline_plan(index, pp):
    """([the gradient index entries of each stage's params], the tied word embedding's or None): a
    param on its `stage`, the one with a last-stage copy on neither (it is a tied layer of the first
    and the last stage)."""
    stages, tied = [[] for _ in range(pp)], None
    for p in index:
        stage = p.get("stage", 0)
        if not 0 <= stage < pp:
            raise LookupError(f"model mismatch: {p['name']} is on stage {stage} of a pipeline of {pp}")
        if p.get("last_stage_copy", False):
            tied = p
        else:
            stages[stage].append(p)
    return stages, tied


def check_pipeline_plan(stages, tied, moe, tp):
    """Raises what building any stage's layers would raise (a split TP does not divide, a router
    that is not DeepSpeed's gate). Each rank builds only its own stage, inside collectives the other
    stages wait in, so the checks run on every rank for every stage first."""
    for entries in stages + ([[tied]] if tied is not None else []):
        classes = {p["name"]: p["class"] for p in entries}
        shapes = {p["name"]: list(p["shape"]) for p in entries}
        _, moe_layers = split_experts(classes)
        for name, cls in classes.items():
            expert = _EXPERT.match(name) is not None
            split = tp if not expert or moe["expert_tp"] else 1
            for tp_rank in range(split):
                local_box(shapes[name], cls, tp_rank, split)
        for prefix in moe_layers:
            gate = [moe["experts"], moe["hidden"]]
            if shapes[f"{prefix}router.weight"] != gate:
                raise LookupError(f"model mismatch: DeepSpeed's gate is {gate}, {prefix}router.weight "
                                  f"{shapes[f'{prefix}router.weight']}")


def build_pipeline(case, index, moe, dtype, world):
    """The PipelineModule of the case (each rank builds only its own stage), and this rank's
    StageBlocks."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    t = case["topology"]
    tp, pp = t.get("tp", 1), t.get("pp", 1)
    StageBlock = stage_block_class()
    stages, tied = pipeline_plan(index, pp)
    check_pipeline_plan(stages, tied, moe, tp)
    # Two layer specs per stage, so DeepSpeed's uniform partition gives each stage its own.
    layers = []
    for s, entries in enumerate(stages):
        specs = [LayerSpec(StageBlock, entries, moe, tp, dtype)]
        if tied is not None and s in (0, pp - 1):
            tied_layer = TiedLayerSpec("word_embeddings", StageBlock, [tied], moe, tp, dtype,
                                       tied_weight_attr=[f"params.{tied['name'].replace('.', '__')}"])
            specs.insert(0 if s == 0 else 1, tied_layer)
        else:
            specs.append(LayerSpec(StageBlock, [], moe, tp, dtype))
        layers += specs
    topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=world // (tp * pp))
    # The loss is the activation's first entry. The activation has TP entries per TP rank, as
    # DeepSpeed splits activations over the TP group between stages (pipe_partitioned). Built
    # without autograd: the tied layers' first broadcast writes into a param, which gloo on a
    # GPU tensor does as an in-place copy autograd would refuse (ranks sharing a GPU use gloo).
    import torch

    with torch.no_grad():
        module = PipelineModule(layers=layers, topology=topology, loss_fn=lambda out, label: out[0],
                                partition_method="uniform")
    blocks = [block for block in module.modules() if isinstance(block, StageBlock)]
    return module, blocks


def make_expert_groups_on_every_stage(module, moe):
    """DeepSpeed's MoE layer makes its expert groups when the engine is built, on the ranks that hold
    one: in a pipeline whose stages do not all hold MoE layers, the other ranks never call
    new_group for them, their count of torch's groups falls behind, and the next group made on
    every rank (the next case's first) waits forever. Made here, before the engine, on every rank,
    with the function and arguments the layer would use; the layers then find them made."""
    from deepspeed.utils import groups

    groups.mpu = module.mpu()  # the pipeline grid, which deepspeed.initialize sets too
    if f"ep_size_{moe['ep']}" in groups._get_expert_parallel_group_dict():
        return
    if moe["expert_tp"]:
        groups._create_expert_data_and_model_parallel(moe["ep"], mpu=groups.mpu)
    else:
        groups._create_expert_and_data_parallel(moe["ep"])


def stage_pipeline_p2p_through_host(p2p):
    """gloo's send and recv fail on GPU tensors ("Bad address"), and ranks that share a GPU use
    gloo: DeepSpeed's pipeline sends (deepspeed.runtime.pipe.p2p.send/recv, which its engine calls
    through the module) are made through host copies for the worker's life. The values are the
    same; only where the bytes travel from changes."""
    import torch

    send, recv = p2p.send, p2p.recv

    def host_send(tensor, dest_stage, async_op=False):
        return send(tensor.detach().cpu() if tensor.is_cuda else tensor, dest_stage, async_op)

    def host_recv(tensor, src_stage, async_op=False):
        if not tensor.is_cuda:
            return recv(tensor, src_stage, async_op)
        staged = torch.empty_like(tensor, device="cpu")
        done = recv(staged, src_stage, async_op)
        with torch.no_grad():
            tensor.copy_(staged)
        return done

    p2p.send, p2p.recv = host_send, host_recv


def pipeline_groups(grid, expert_tp=False):
    """This rank's groups by name, from DeepSpeed's pipeline grid: `mp` is the grid's model
    group (every stage and TP rank of one data-parallel index), the group DeepSpeed's norms sum over."""
    topology = grid.topology()
    mp = sorted(topology.get_axis_list(axis="data", idx=grid.get_data_parallel_rank()))
    tp = sorted(getattr(grid, "slice_group", [grid.get_global_rank()]))
    return {"tp": tp, "mp": mp, "dp": sorted(grid.get_data_parallel_group_ranks()), "pp": sorted(grid.pp_group),
            "expert_tp": expert_tp}


def autotp_groups(mpu):
    """This rank's groups as AutoTP made them (deepspeed.utils.groups, the engine's mpu)."""
    import torch.distributed as dist

    tp = dist.get_process_group_ranks(mpu.get_tensor_model_parallel_group())
    return {"tp": tp, "mp": dist.get_process_group_ranks(mpu.get_model_parallel_group()),
            "dp": dist.get_process_group_ranks(mpu.get_data_parallel_group()), "expert_tp": False}


def groups_of_rank(layers, mpu, expert_tp):
    """This rank's groups by name, as tally_deepspeed.build_manifest reads them."""
    mine = {"tp": list(mpu.tp_ranks), "mp": list(mpu.tp_ranks), "dp": list(mpu.dp_ranks), "expert_tp": expert_tp}
    return expert_groups(mine, layers)


def expert_groups(mine, layers):
    """`mine` with each MoE layer's expert-parallel and expert-data-parallel groups added."""
    return expert_groups_by_name(mine, {layer.expert_group_name for layer in layers.values()})


class CaseGroups:
    """Every process group made while a case is set up (by the worker, DeepSpeed's expert groups,
    its pipeline grid and tied-layer groups), destroyed when the case ends, so a long campaign
    holds no more groups than one case needs."""

    def __init__(self):
        self.made, self.patches = [], None

    def __enter__(self):
        import torch.distributed as dist

        self.patches = Patches()
        original = dist.new_group

        def new_group(*args, **kwargs):
            group = original(*args, **kwargs)
            self.made.append(group)
            return group

        self.patches.replace(dist, "new_group", new_group)
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        if self.patches is not None:
            self.patches.restore()
        for g in self.made:
            if g is None or g == dist.GroupMember.NON_GROUP_MEMBER:
                continue
            try:
                dist.destroy_process_group(g)
            except Exception:  # a group torch already released
                pass
        self.made.clear()
        return False


def release_engines(engines):
    """Destroys the case's engines (the last references to them) and collects what they held."""
    while engines:
        engine = engines.pop()
        if hasattr(engine, "destroy"):
            engine.destroy()
        del engine
    gc.collect()


def forget_deepspeed_groups():
    """DeepSpeed keeps its expert groups and mpu in module globals: each case builds its own."""
    from deepspeed.utils import groups

    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_DATA_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS",
                 "_EXPERT_DATA_PARALLEL_GROUP_RANKS", "_ALL_TO_ALL_GROUP"):
        getattr(groups, name).clear()
    # its clone of the world group (a case without an mpu makes one), destroyed with the case's groups
    groups._WORLD_GROUP = None
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
    groups.mpu = None
    groups.expert_tensor_parallel_world_size = 1
    # AutoTP's TP/DP groups (a DeviceMesh's, made without dist.new_group): the next case makes its own
    import torch.distributed as dist

    for name in ("_TENSOR_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP"):
        group = getattr(groups, name)
        # A mesh dimension spanning every rank is the default group itself: that one stays.
        if group not in (None, dist.GroupMember.NON_GROUP_MEMBER, dist.GroupMember.WORLD):
            try:
                dist.destroy_process_group(group)
            except Exception:  # a group torch already released
                pass
    for name in ("_TENSOR_MODEL_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP",
                 "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_RANK", "mesh_device"):
        setattr(groups, name, None)
    # deepspeed.initialize puts AutoTP's layers into training mode for the whole process
    from deepspeed.module_inject import layers

    layers.set_autotp_mode(training=False)


def check_every_param_held(local_error, held, tensors):
    """Raises a model mismatch on every rank together (after one collective, so no rank is left
    waiting in the next): one rank's own, or a logical param no rank holds."""
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (local_error, held))
    errors = [error for error, _ in everyone if error]
    if errors:
        raise LookupError(errors[0])
    missing = set(tensors) - set().union(*(set(names) for _, names in everyone))
    if missing:
        raise LookupError(f"model mismatch: no rank of DeepSpeed's model holds {sorted(missing)[:5]} "
                          f"({len(missing)} of tally's params)")


def print_gradient_distance(engine, box_of):
    """TALLY_DEBUG_GRADS=1, at ZeRO 0 (where each param's .grad is whole after the backward): how far
    every gradient DeepSpeed holds is from tally's value, so a run's truth is known to be the truth
    of what DeepSpeed holds."""
    import torch
    import torch.distributed as dist

    for path, p in engine.module.named_parameters():
        if p.grad is not None:
            want = torch.from_numpy(box_of(p).copy()).reshape(p.grad.shape)
            distance = float((p.grad.float().cpu() - want).abs().max())
            print(f"rank {dist.get_rank()} {path}: max|grad - tally's value| {distance}", flush=True)


def client_optimizer(module, layers, fused_adam):
    """The AdamW at lr 0 the worker gives DeepSpeed, with DeepSpeed's MoE param groups where the
    module has MoE layers (DeepSpeed requires them): torch's, or with `fused_adam` DeepSpeed's
    FusedAdam (an op DeepSpeed compiles on first use), which makes a 16-bit engine at ZeRO 0 take
    FP16_Optimizer instead of FP16_UnfusedOptimizer."""
    import torch

    params = {"params": list(module.parameters()), "name": "all"}
    if layers:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        groups = split_params_into_different_moe_groups_for_optimizer(params)
    else:
        groups = [{"params": params["params"]}]
    if fused_adam:
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(groups, lr=0.0, weight_decay=0.0)
    return torch.optim.AdamW(groups, lr=0.0, weight_decay=0.0)


def execute(request, planted, producer):
    """Runs the request's case on this rank, its faults planted by `planted`, and writes its
    manifests."""
    import deepspeed
    import torch
    import torch.distributed as dist

    case = request.case
    t = case["topology"]
    world = dist.get_world_size()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        case.get("gradients", {}).get("dtype", "fp32")]
    tp, pp = t.get("tp", 1), t.get("pp", 1)
    autotp = case.get("deepspeed", {}).get("autotp", False)
    autoep = case.get("deepspeed", {}).get("autoep", False)
    fused_adam = case.get("deepspeed", {}).get("fused_adam", False)
    engine = None
    made = CaseGroups()
    try:
        planted.__enter__()
        made.__enter__()
        tensors = request.gradients()
        index = request.gradient_index()
        # The configuration for deepspeed.initialize, as tally's run/deepspeed/engine.cpp wrote it
        # (the one author of it: `tally show` prints the same).
        config = request.engine_config()
        local_error = None
        moe = moe_settings(case)
        expert_tp = moe["expert_tp"]
        case_mpu = None
        # DeepSpeed's own checks of the case (deepspeed.initialize's, AutoTP's, AutoEP's) decline it:
        # a refusal counted by reason, not an error of the worker.
        with framework_setup("deepspeed"):
            if pp > 1:
                module, blocks = build_pipeline(case, index, moe, dtype, world)
                described, layers = {}, {}
                for block in blocks:
                    described.update(block.described)
                    layers.update(block.layers)
                moe_parts = [(block.layers, block.shapes, block.classes) for block in blocks]
                if moe["experts"]:
                    make_expert_groups_on_every_stage(module, moe)
            elif autotp:  # DeepSpeed makes the TP and DP groups and shards the model itself
                moe_names = moe_param_names(index)
                module = build_autotp_model([p for p in index if p["name"] not in moe_names], tensors, dtype)
                if autoep:  # and, folded over TP, replaces the MoE layers
                    add_autoep_blocks(module, index, tensors, moe, dtype)
                described, layers, moe_parts = {}, {}, []
            elif autoep:  # DeepSpeed replaces the MoE layers and makes their expert groups itself
                module, described, layers, moe_parts = build_autoep_model(index, tensors, moe, dtype), {}, {}, []
            else:
                case_mpu = Mpu(tp)
                module, described, layers, shapes, classes = build_model(case, index, case_mpu, moe, dtype)
                moe_parts = [(layers, shapes, classes)]
            if autoep:  # the engine's own optimizer: it splits the params AutoEP makes into MoE groups
                engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=config)
            else:  # no mpu for a pipeline (its grid is one) or AutoTP (whose groups are)
                engine, _, _, _ = deepspeed.initialize(model=module, optimizer=client_optimizer(module, layers, fused_adam),
                                                       mpu=case_mpu, config=config)
        mpu = engine.mpu  # None with AutoEP (TP 1): no model parallelism
        pieces, local_values = {}, {}  # params holding pieces of several logical params (AutoEP's experts)
        # At ZeRO 3 each rank holds a partition: AutoTP's and AutoEP's tensors are checked whole.
        whole = contextlib.nullcontext()
        if engine.zero_optimization_stage() == 3 and (autotp or autoep):
            from deepspeed.runtime.zero.partition_parameters import GatheredParameters

            whole = GatheredParameters(list(engine.module.parameters()))
        with whole:
            try:
                if autoep:
                    described, pieces, local_values = describe_autoep(
                        engine.module, {p["name"]: list(p["shape"]) for p in index}, tensors)
                if autotp or autoep:
                    tp_rank = mpu.get_tensor_model_parallel_rank() if autotp else 0
                    described.update(describe_dense(engine.module, index, tensors, tp_rank, tp))
                for part_layers, shapes, classes in moe_parts:
                    describe_experts(part_layers, described, expert_tp, mpu.get_tensor_model_parallel_rank(), tp, shapes,
                                     classes)
            except LookupError as e:
                local_error = f"rank {dist.get_rank()}: {e}"
        undescribed = [path for path, p in engine.module.named_parameters() if id(p) not in described
                       and id(p) not in pieces]
        if undescribed and not local_error:
            local_error = f"rank {dist.get_rank()}: model mismatch: DeepSpeed holds {undescribed[:3]}, which the " \
                          "worker did not build"
        held = [] if local_error else sorted({described[id(p)][0] for p in engine.module.parameters()
                                              if id(p) in described} |
                                             {piece["logical_name"] for ps in pieces.values() for piece in ps})
        check_every_param_held(local_error, held, tensors)

        def box_of(p):
            if id(p) in local_values:
                return local_values[id(p)]
            name, _, offsets, extents = described[id(p)]
            return tensors[name][tuple(slice(o, o + e) for o, e in zip(offsets, extents))]

        device = next(engine.module.parameters()).device
        # DeepSpeed sums a gradient over its reduction group (DP for dense params, expert-DP for
        # experts) and divides by the DP size. Only the group's first rank gives the gradient, times
        # the DP size (a power of two): every other term is 0, so the 16-bit sums are exact, as
        # sums of equal values (3g) would not be. So does only the first stage's copy of a tied
        # embedding, which the pipeline sums over its copies.
        if mpu is None:
            dp_size, dp_first = world, dist.get_rank() == 0
        else:
            dp_size, dp_first = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank() == 0
        from deepspeed.utils import groups

        def expert_first(p):  # DeepSpeed's MoE and AutoEP name each expert param's group
            return groups._get_expert_data_parallel_rank(p.group_name) == 0

        # AutoTP sums a q/k norm's gradient over TP: only TP rank 0 gives it.
        tp_summed = {id(p) for p in engine.module.tp_summed.parameters()} if autotp else set()
        tp_first = mpu is None or mpu.get_tensor_model_parallel_rank() == 0

        # AutoEP folded over TP divides an expert's gradient by TP: its forward's all-gather back
        # over TP leaves that factor on it, which the worker's loss does not, so it gives it.
        folded = tp if autotp and autoep else 1

        def term_weights(p, first=True):
            expert = not getattr(p, "allreduce", True)
            first = first and (expert_first(p) if expert else dp_first)
            first = first and (tp_first or id(p) not in tp_summed)
            values = box_of(p) * (dp_size * (folded if expert else 1)) if first else box_of(p) * 0
            return torch.from_numpy(values).to(device=device, dtype=p.dtype)

        # fp16 runs scale the loss by the case's static loss scale: the norm codes read the
        # gradients times it, and the manifests record them divided by it.
        grad_scale = float(config["fp16"]["loss_scale"]) if "fp16" in config else 1.0
        if pp > 1:
            first_stage = mpu.get_pipe_parallel_rank() == 0
            for block in blocks:
                copy = block in engine.module.tied_modules.values() and not first_stage
                for p in block.parameters():
                    block.weights[id(p)] = term_weights(p, first=not copy)
            start = torch.zeros(tp * tp, dtype=dtype, device=device)
            with tally_deepspeed.Recording(engine, grad_scale) as recording:
                engine.train_batch(data_iter=iter([(start, start)]))
        else:
            if engine.zero_optimization_stage() == 3:
                # The params are partitioned outside the forward: the loss is the module's forward.
                engine.module.term_weights = {path: term_weights(p) for path, p in engine.module.named_parameters()}
                loss = engine()
            else:
                loss = sum((p * term_weights(p)).sum() for p in engine.module.parameters())
            engine.backward(loss)
            if os.environ.get("TALLY_DEBUG_GRADS") and engine.zero_optimization_stage() == 0:
                print_gradient_distance(engine, box_of)
            with tally_deepspeed.Recording(engine, grad_scale) as recording:
                engine.step()
        norm = engine.get_global_grad_norm()
        if norm is None:
            norm = recording.clip_norm
        norm = float(norm) if norm is not None else None
        # A skipped step (an fp16 overflow) computed no norm to judge: the same on every rank.
        if getattr(engine.optimizer, "overflow", False) or norm is None or not math.isfinite(norm) \
                or not recording.children:
            raise FloatingPointError(
                f"DeepSpeed skipped the step (norm {norm}, overflow "
                f"{getattr(engine.optimizer, 'overflow', None)}): the gradients times the loss scale "
                "do not fit the precision, so there is no norm to judge")
        if pp > 1:
            mine = expert_groups(pipeline_groups(mpu, expert_tp), layers)
        elif autotp or autoep:
            rank = dist.get_rank()
            mine = autotp_groups(mpu) if autotp else {"tp": [rank], "mp": [rank], "dp": list(range(world)),
                                                      "expert_tp": False}
            mine = expert_groups_by_name(mine, {p.group_name for p in engine.module.parameters()
                                                if hasattr(p, "group_name")})
        else:
            mine = groups_of_rank(layers, mpu, expert_tp)
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        manifest = tally_deepspeed.build_manifest(
            engine, recording,
            describe=lambda p: pieces.get(id(p)) or dict(zip(("logical_name", "logical_shape", "offsets", "extents"),
                                                             described[id(p)])),
            gradient_of=box_of,
            groups_by_rank=dict(enumerate(gathered)),
            parallel={"tp": tp, "cp": 1, "pp": pp, "dp": world // (tp * pp), "ep": t.get("ep", 1),
                      "etp": t.get("etp", tp)},
            producer=producer,
            reported_norm=norm,
        )
        tally_deepspeed.dump_manifest(manifest, request.manifests_dir, request.case_digest)
    finally:
        engines = [engine] if engine is not None else []
        engine = None
        # Every step runs, whichever raises: a step left out would leak into the next case.
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(made.__exit__, None, None, None)
            cleanup.callback(forget_deepspeed_groups)
            cleanup.callback(release_engines, engines)
            cleanup.callback(planted.__exit__, None, None, None)


class DeepSpeedWorker(base.Worker):
    """tally's worker for DeepSpeed: executes tally's cases with DeepSpeed's own, unmodified engine."""

    framework = "deepspeed"
    package = "deepspeed"
    plants = PLANTS
    not_planted = NOT_PLANTED
    fused_adam_unavailable = None  # why DeepSpeed's FusedAdam cannot run here (start() finds out)

    def framework_version(self):
        import deepspeed

        return deepspeed.__version__

    def before_process_group(self):
        if self.devices == 0:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        else:
            # DeepSpeed's engine takes its device from LOCAL_RANK: with more ranks than GPUs,
            # each rank's LOCAL_RANK becomes the GPU it shares.
            os.environ["LOCAL_RANK"] = str(int(os.environ.get("LOCAL_RANK", "0")) % self.devices)
        import deepspeed  # noqa: F401

        # Every module that imports a replaced function is loaded before any fault is planted.
        import deepspeed.runtime.bf16_optimizer  # noqa: F401
        import deepspeed.runtime.fp16.fused_optimizer  # noqa: F401
        import deepspeed.runtime.fp16.unfused_optimizer  # noqa: F401
        import deepspeed.runtime.pipe.module  # noqa: F401
        import deepspeed.runtime.pipe.topology  # noqa: F401
        import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401

    def start(self):
        # torch's own init ran (DeepSpeed's passes device_id=cuda:LOCAL_RANK, which one shared GPU
        # refuses); deepspeed.init_distributed adopts the default group.
        import deepspeed

        deepspeed.init_distributed(dist_backend=self.backend)
        if self.backend == "gloo" and self.devices:
            import deepspeed.runtime.pipe.p2p as p2p

            stage_pipeline_p2p_through_host(p2p)
        self.fused_adam_unavailable = prepare_fused_adam(self.devices)

    def cannot_run(self):
        if self.fused_adam_unavailable:
            return {"deepspeed.fused_adam": self.fused_adam_unavailable}
        return {}

    def dtypes(self):
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        return ["fp32"] + [name for name, supported in (("bf16", accelerator.is_bf16_supported),
                                                         ("fp16", accelerator.is_fp16_supported)) if supported()]

    def execute(self, request):
        execute(request, self.planted(request), self.producer())


def main(argv=None):
    return base.run(DeepSpeedWorker, argv)


if __name__ == "__main__":
    sys.exit(main())
