#!/usr/bin/env python3
"""tally's worker for the Hugging Face stack: executes tally's cases with transformers' own model
classes laid out by accelerate, then accelerate's or the Trainer's own grad-norm code, unmodified,
and writes the manifests `tally` judges (`tally fuzz|run|replay --target hf`).

Started by tally, once per world size, under torchrun (one process per rank):

    torchrun --standalone --nproc-per-node WORLD -m tally_adapters.hf.worker \\
        --queue DIR --parent-pid PID [--backend auto|nccl|gloo]

It speaks the queue protocol of tally_adapters.queue (docs/real-targets.md). Per case, on every rank:

1. The case's GPT as the transformers architecture of its shape (tally_adapters.hf_models: Llama, or
   Qwen3 with qk-layernorm), transformers' own `LlamaForCausalLM` / `Qwen3ForCausalLM`, fp32; a GPT
   with experts as the MoE class of the family the recipe names (`family`: Mixtral, Qwen3-MoE,
   gpt-oss, DeepSeek-V3; tally_adapters.hf.families over hf_families' element maps).
2. Laid out as an accelerate user lays it out: an `Accelerator` with a `ParallelismConfig`
   (dp_replicate, dp_shard, tp) and, for FSDP2, `FullyShardedDataParallelPlugin(fsdp_version=2)`;
   for TP, the model distributed by transformers' own TP plan on accelerate's `tp` mesh (the two
   steps `from_pretrained(distributed_config=DistributedConfig(tp_size=...))` runs around the
   model's init: `prepare_distribute_model`, `maybe_distribute_model`), and for EP (the recipe's
   `expert_parallel`) the same with `enable_expert_parallel=True`, the class's EP plan: the experts
   sharded on dim 0 over that mesh, the rest plain; then `Accelerator.prepare` of the model and an
   optimizer.
3. Every param's gradient: after the reduction (the default), tally's values placed as the param is;
   before it (`hf.gradients_enter`, FSDP2 only), each rank's share left by a backward under FSDP2's
   hooks and averaged by FSDP2's own reduce-scatter (and HSDP's all-reduce: accelerate sets no
   divide factor), what it leaves recorded (tally_adapters.fsdp2).
4. The norm the case names (`hf.norm`): `Accelerator.clip_grad_norm_` (accelerator.py, which
   dispatches to `_clip_grad_norm_dtensor_aware`), or the Trainer's `_clip_grad_norm` (trainer.py:
   its mixed-mesh path where DTensor and plain gradients mix, else accelerate's), with the case's
   max_norm; where the case does not clip, the Trainer's `_get_grad_norm` (what `train()` calls at
   max_grad_norm 0) and accelerate's clip at infinity. The manifests of what it returned and of the
   gradients after it: each group of the norm (a mesh and placements, the plain gradients) summed
   over the ranks that norm reduces it over on this rank (`stats_group`), every shard kept there.

On CPUs (gloo). accelerate 1.15 sets `DistributedType.FSDP`, and accepts a `ParallelismConfig`, only
on an accelerator device's distributed type (accelerate/state.py:986 lists MULTI_GPU, MULTI_NPU, ...,
not MULTI_CPU; parallelism_config.py:395 raises for MULTI_CPU), although nothing of its layout or
norm computes on the device. So on CPUs the worker starts accelerate's process state on the CPU over
tally's gloo group and names its distributed type MULTI_GPU before the `Accelerator` is made
(`_cpu_ranks_as_devices`): accelerate's own `Accelerator`, `prepare`, FSDP2 wrapping
(`fsdp2_prepare_model`) and clip then run as on GPUs. On GPUs (nccl) nothing is changed.
"""

import math
import os
import sys

from .. import dtensor as tally_dtensor
from .. import fsdp2, hf_models
from .. import worker as base
from ..plants import FSDP2_REDUCTION_PLANTS, fsdp2_reduction_not_planted
from . import families

_ACCELERATOR = "accelerate.accelerator:Accelerator"  # its methods, replaced on the class


# --- planted faults (the real mutation score) -------------------------------------------------
#
# A catalog fault with a counterpart in accelerate's norm is planted for one case by replacing the
# function that decides it (tally_adapters.plants); the original is put back after the case. Each
# replacement is the function with one rule changed.


def _each_mesh_by_its_norm(orig):
    # The total norm is reported, but each of _clip_grad_norm_dtensor_aware's groups (a mesh's
    # DTensor gradients, the plain ones) is clipped by its own norm (Megatron-LM #785's rule, in
    # accelerate's per-mesh clip).
    def _clip_grad_norm_dtensor_aware(self, parameters, max_norm, norm_type=2):
        import torch
        from torch.distributed.tensor import DTensor

        parameters = list(parameters)
        total = orig(self, parameters, math.inf, norm_type)
        groups = {}  # keyed as accelerate keys them: by the mesh itself (DeviceMesh's equality), then the plain ones
        for p in parameters:
            if p.grad is not None:
                key = ("mesh", p.grad.device_mesh) if isinstance(p.grad, DTensor) else ("plain",)
                groups.setdefault(key, []).append(p)
        for params in groups.values():
            own = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type)
            own = own.full_tensor() if isinstance(own, DTensor) else own
            if isinstance(params[0].grad, DTensor):
                own = DTensor.from_local(own, params[0].grad.device_mesh)
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, own)
        return total

    return _clip_grad_norm_dtensor_aware


def _local_norms_averaged(orig):
    # Each rank's norm of its own shards, averaged over the world: per-rank contributions averaged
    # instead of summed (DeepSpeed #8475's rule, in accelerate's norm).
    def _clip_grad_norm_dtensor_aware(self, parameters, max_norm, norm_type=2):
        import torch
        import torch.distributed as dist

        parameters = [p for p in parameters if p.grad is not None]
        squares = sum(float(tally_dtensor.local_values(p.grad).astype("float64") @
                            tally_dtensor.local_values(p.grad).astype("float64")) for p in parameters)
        mean = torch.tensor([squares], dtype=torch.float64)
        dist.all_reduce(mean)
        total = torch.tensor(math.sqrt(float(mean) / dist.get_world_size()), dtype=torch.float32)
        coefficient = min(1.0, max_norm / (float(total) + 1e-6))
        for p in parameters:
            (p.grad.to_local() if tally_dtensor.is_dtensor(p.grad) else p.grad).mul_(coefficient)
        return total

    return _clip_grad_norm_dtensor_aware


def _trainer_mixed_mesh_norm(drop_experts=False, sum_experts=True, clip_with_local=False):
    """A replacement of Trainer._mixed_mesh_grad_norm (transformers/trainer.py:2618) with one of its
    rules changed. Its rules: plain gradients' squares counted on this rank, the DTensor gradients'
    local squares all-reduced over the first one's mesh, the root of the two the norm, every gradient
    clipped by max_norm over it. Under EP its DTensors are the experts: `drop_experts` leaves their
    squares out (DeepSpeed #8613's rule), `sum_experts` False skips the all-reduce over the EP mesh
    (NeMo-Automodel #3816's), `clip_with_local` clips with the norm before that all-reduce while
    reporting the right one (ColossalAI #2192's)."""
    def factory(orig):
        def _mixed_mesh_grad_norm(self, model, max_norm):
            import torch
            import torch.distributed as dist
            from torch.distributed.tensor import DTensor

            grads = [p.grad for p in model.parameters() if p.grad is not None]
            experts = [g for g in grads if isinstance(g, DTensor)]
            plain = [g for g in grads if not isinstance(g, DTensor)]
            plain_sq = sum((g.double().pow(2).sum() for g in plain), torch.zeros((), dtype=torch.float64))
            local_sq = sum((g.to_local().double().pow(2).sum() for g in experts), torch.zeros((), dtype=torch.float64))
            summed_sq = local_sq.clone()
            if experts and sum_experts:
                dist.all_reduce(summed_sq, group=experts[0].device_mesh.get_group())
            total = (plain_sq + (0.0 if drop_experts else summed_sq)).sqrt().float()
            clip_norm = (plain_sq + local_sq).sqrt().float() if clip_with_local else total
            if max_norm != float("inf"):
                coefficient = (max_norm / (clip_norm + 1e-6)).clamp(max=1.0)
                for g in plain:
                    g.mul_(coefficient)
                for g in experts:
                    g.to_local().mul_(coefficient)
            return total

        return _mixed_mesh_grad_norm

    return factory


_TRAINER = "transformers.trainer:Trainer"

# fault -> ([(module, the function, how to make the replacement)], how)
PLANTS = {
    # In the Trainer's mixed-mesh norm, which under EP reduces the experts (DTensors) apart from the
    # plain rest (run/hf/rules.cpp gives these faults EP and the Trainer).
    "expert-norm-dropped": (
        [(_TRAINER, "_mixed_mesh_grad_norm", _trainer_mixed_mesh_norm(drop_experts=True))],
        "_mixed_mesh_grad_norm leaves the experts' (the DTensor gradients') squares out of the norm",
    ),
    "missing-ep-reduction": (
        [(_TRAINER, "_mixed_mesh_grad_norm", _trainer_mixed_mesh_norm(sum_experts=False))],
        "_mixed_mesh_grad_norm does not all-reduce the experts' squares over the EP mesh: each rank's own experts",
    ),
    "clip-per-ep-group-norm": (
        [(_TRAINER, "_mixed_mesh_grad_norm", _trainer_mixed_mesh_norm(clip_with_local=True))],
        "_mixed_mesh_grad_norm reports the right norm but clips with each rank's norm before the all-reduce "
        "over the EP mesh",
    ),
    # Where the gradients enter before FSDP2's reduction (hf.gradients_enter).
    **FSDP2_REDUCTION_PLANTS,
    "average-rank-norms": (
        [(_ACCELERATOR, "_clip_grad_norm_dtensor_aware", _local_norms_averaged)],
        "_clip_grad_norm_dtensor_aware averages the ranks' local sums of squares instead of summing them",
    ),
    "clip-per-child-norm": (
        [(_ACCELERATOR, "_clip_grad_norm_dtensor_aware", _each_mesh_by_its_norm)],
        "each of _clip_grad_norm_dtensor_aware's groups (a mesh, the plain gradients) is clipped by its own "
        "norm, the total reported",
    ),
}

_NO_ATTRIBUTES = "DTensor counts through placements: accelerate's norm reads no Megatron attribute"
NOT_PLANTED = {
    "expert-dedup-on-dense-tp": _NO_ATTRIBUTES,
    "allreduce-flag-lost-on-main-params": _NO_ATTRIBUTES,
    "expert-weights-not-tp-marked": _NO_ATTRIBUTES,
    "expert-label-from-ep-only": _NO_ATTRIBUTES,
    "expert-label-ignores-gtp": "no generalized TP",
    "expert-stats-over-dense-mp": "transformers' EP has no dense model parallelism beside it (its EP plan replaces "
                                  "the TP plan), and its TP counts experts through placements like every param",
    "tied-copy-not-shared": "a tied output is one param without PP, and the worker builds no pipeline",
    "tp-sharded-param-unmarked": _NO_ATTRIBUTES,
    "replicated-marked-tp": _NO_ATTRIBUTES,
    "no-dedup-filter": _NO_ATTRIBUTES,
    "missing-pp-reduction": "the worker builds no pipeline",
    "stats-over-replicas": "accelerate's norm reduces each mesh's DTensor norm by torch's placements, with no "
                           "reduction of its own over HSDP's replicas",
    "zero-count-in-float32": "accelerate reports no zero count",
    "empty-rank-skips-collective": "not planted: a rank that skips a collective hangs the worker",
    "inf-norm-combined-by-l2": "the worker records the L2 norm only",
    "distopt-padding-counted": "no distributed optimizer",
    "distopt-overlapping-shards": "no distributed optimizer",
    "clip-per-stage-norm": "the worker builds no pipeline",
    "average-local-norms-over-dp": "FSDP's shards are summed by DTensor's placements; no per-rank norms over DP",
    "muon-expert-stats-without-egtp": "no Muon",
    "tp-marking-unseen-by-filter": _NO_ATTRIBUTES,
    "norm-of-scaled-gradients": "no loss scale: the worker holds fp32 gradients",
    "layer-wise-unsharded-at-dp-cp-1": "no layer-wise optimizer",
    **fsdp2_reduction_not_planted("accelerate"),
}


# --- one case ----------------------------------------------------------------------------------


def model_class(model_json):
    """transformers' class of the case's architecture."""
    if hf_models.architecture(model_json) == "qwen3":
        from transformers import Qwen3ForCausalLM

        return Qwen3ForCausalLM
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM


def _cpu_ranks_as_devices():
    """accelerate's process state on the CPU over the process group the worker started, its
    distributed type named MULTI_GPU, so the `Accelerator` made next takes FSDP2 and a
    ParallelismConfig as on GPUs (module docstring: accelerate/state.py:986 gates both on an
    accelerator device's type). The device stays the CPU."""
    from accelerate.state import DistributedType, PartialState

    state = PartialState(cpu=True)
    state.distributed_type = DistributedType.MULTI_GPU


def build(run):
    """The case's model, laid out by accelerate as the case's `hf` section and topology say, onto
    `run` (`accelerator`, `model`, `trainer`)."""
    import torch
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.parallelism_config import ParallelismConfig

    run.config = run.request.engine_config()  # run/hf/rules.cpp wrote it; `tally show` prints the same
    # What accelerate writes into the environment (Accelerator sets ACCELERATE_USE_FSDP for a FSDP
    # plugin, accelerator.py:397, and reads it for every Accelerator after): put back after the case.
    run.environ = dict(os.environ)
    sizes = run.config["parallelism_config"]
    trainer_args = None
    if run.config["norm"] == "trainer":
        # Made first: TrainingArguments sets up accelerate's process state as the Trainer does.
        from transformers import TrainingArguments

        trainer_args = TrainingArguments(output_dir=run.request.manifests_dir, report_to=[],
                                         max_grad_norm=float(run.config["max_grad_norm"]),
                                         use_cpu=run.device.type == "cpu")
    if run.device.type == "cpu":
        _cpu_ranks_as_devices()
    fsdp = run.config["fsdp_version"] == 2
    accelerator = Accelerator(
        parallelism_config=ParallelismConfig(dp_replicate_size=sizes["dp_replicate_size"],
                                             dp_shard_size=sizes["dp_shard_size"], tp_size=sizes["tp_size"]),
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2) if fsdp else None,
    )
    family = run.config.get("family")
    run.emap = None
    with torch.device(run.device):
        if family:
            cls, model, run.emap = families.build(run.case["model"], family, run.index)
        else:
            cls = model_class(run.case["model"])
            model = cls(hf_models.hf_config(run.case["model"], run.index))
    if sizes["tp_size"] > 1:
        from transformers.distributed import DistributedConfig

        # Under EP the class's EP plan replaces its TP plan on the same mesh (transformers'
        # distributed/mixin.py:89): the experts sharded on dim 0, every other param plain.
        distributed_config = DistributedConfig(tp_size=sizes["tp_size"],
                                               enable_expert_parallel=bool(run.config.get("expert_parallel")))
        distributed, _, tp_mesh = cls.prepare_distribute_model(distributed_config,
                                                               device_mesh=accelerator.torch_device_mesh)
        model = cls.maybe_distribute_model(model, distributed, tp_mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    run.model, run.optimizer = accelerator.prepare(model, optimizer)
    run.accelerator = accelerator
    run.trainer = None
    if trainer_args is not None:
        # The Trainer's own methods on a Trainer holding this accelerator and these arguments:
        # Trainer.__init__ would make an Accelerator of its own, and train() runs a data loop.
        from transformers import Trainer

        run.trainer = Trainer.__new__(Trainer)
        run.trainer.args = trainer_args
        run.trainer.accelerator = accelerator
        run.trainer._mixed_mesh_grads = None


def local_name(name):
    """A param's name without a wrapper's module names."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_fsdp_wrapped_module.", "")


def contributions_of(run, segments):
    """This rank's share of each param's gradient (path -> numpy array of the param's shape): FSDP2
    averages every gradient over dp_replicate x dp_shard (accelerate sets no divide factor), so tally
    dealt every gradient times that size into one nonzero share per rank of the world
    (run/hf/rules.h: FSDP2 runs at TP 1 only). A rank takes the share at its rank."""
    import torch.distributed as dist

    world = dist.get_world_size()
    at = dist.get_rank()
    mine = {name: values[at] for name, values in run.request.shares(world).items()}
    if run.emap is not None:
        flat = families.flat_values(mine, run.index)
        return {n: flat[run.emap.params[local_name(n)]] for n, p in run.model.named_parameters() if p.requires_grad}
    return {n: hf_models.full_gradient(segments[local_name(n)], p.shape, mine)
            for n, p in run.model.named_parameters() if p.requires_grad}


def set_gradients(run):
    """Every param's gradient (`before`, by param) and the manifest pieces of each (`pieces`);
    returns the logical names held. After the reduction: tally's values placed as the param is.
    Before it: each rank's contribution, reduced by FSDP2 itself (tally_adapters.fsdp2)."""
    import torch

    named = [(local_name(n), p) for n, p in run.model.named_parameters() if p.requires_grad]
    run.params = [p for _, p in named]
    if run.emap is not None:
        return set_family_gradients(run, named)
    segments = hf_models.segments(run.case["model"], run.index)
    hf_models.check_cover(segments, {n: list(p.shape) for n, p in named}, run.index)
    shapes = {p["name"]: list(p["shape"]) for p in run.index}
    run.pieces, run.before = [], {}
    reduced = run.case["hf"].get("gradients_enter") == "before_reduction"
    if reduced:
        fsdp2.backward_through_fsdp2(run.model, fsdp2.local_term(contributions_of(run, segments), run.device))
        boxes, run.before = fsdp2.held_gradients([p for _, p in named])
    for name, p in named:
        if reduced:
            offsets, extents = boxes[id(p)]
        else:
            full = torch.from_numpy(hf_models.full_gradient(segments[name], p.shape, run.tensors)).to(run.device)
            (offsets, extents), run.before[id(p)] = tally_dtensor.place_gradient(p, full, name)
        for begin, end, logical, logical_offsets, logical_extents in hf_models.boxes(segments[name], offsets, extents):
            run.pieces.append(tally_dtensor.Piece(p, name, begin, end, logical, shapes[logical], logical_offsets,
                                                  logical_extents, tally_dtensor.attributes_of(p)))
    return {piece.logical_name for piece in run.pieces}


def set_family_gradients(run, named):
    """set_gradients for a family's class (run.emap, tally_adapters.hf.families): each param's
    gradient is tally's values at its element ids, placed as the param is (or, before the reduction,
    each rank's contribution reduced by FSDP2); its pieces are the ids its shard holds."""
    import numpy as np
    import torch
    from torch.distributed.tensor import distribute_tensor

    run.pieces, run.before = [], {}
    flat = families.flat_values(run.tensors, run.index)
    reduced = run.case["hf"].get("gradients_enter") == "before_reduction"
    if reduced:
        fsdp2.backward_through_fsdp2(run.model, fsdp2.local_term(contributions_of(run, None), run.device))
        boxes, run.before = fsdp2.held_gradients([p for _, p in named])
    for name, p in named:
        ids = run.emap.params[name]
        if reduced:
            offsets, extents = boxes[id(p)]
            held = ids[tuple(slice(o, o + e) for o, e in zip(offsets, extents))].reshape(-1)
        else:
            full = torch.from_numpy(flat[ids]).to(run.device)
            p.grad = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None) \
                if tally_dtensor.is_dtensor(p) else full.clone()
            run.before[id(p)] = tally_dtensor.local_values(p.grad)
            held = families.placed_ids(p, ids)
            if not np.array_equal(flat[held], run.before[id(p)]):
                raise ValueError(f"{name}: its gradient shard is not tally's values at the element ids its placements "
                                 f"{getattr(p, 'placements', None)} give it")
        expert = ".mlp.experts." in name
        for begin, end, logical, shape, offsets, extents in families.pieces(held, run.index):
            run.pieces.append(tally_dtensor.Piece(p, name, begin, end, logical, shape, offsets, extents,
                                                  tally_dtensor.attributes_of(p, expert=expert)))
    return {piece.logical_name for piece in run.pieces}


def clip(run):
    """The norm the case names, over the model's params, with the case's max_norm (infinity where the
    case does not clip): its norm (`norm`) and the gradients after it (`after`)."""
    from torch.distributed.tensor import DTensor

    max_norm = float(run.config["max_grad_norm"])
    if run.trainer is not None:
        # As Trainer's training step calls them (trainer.py: _clip_grad_norm where max_grad_norm > 0,
        # then _get_grad_norm, which returns the norm it was given).
        total = run.trainer._clip_grad_norm(run.model) if max_norm > 0 else None
        total = run.trainer._get_grad_norm(run.model, grad_norm=total)
    else:
        total = run.accelerator.clip_grad_norm_(run.model.parameters(), max_norm if max_norm > 0 else math.inf)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    run.norm = float(total)
    run.after = {id(p): tally_dtensor.local_values(p.grad) for p in run.params}


def group_key(p):
    """accelerate's group of a param (`_clip_grad_norm_dtensor_aware`: a DTensor's mesh, or the plain
    gradients), cut by placements, named the same on every rank."""
    if not tally_dtensor.is_dtensor(p):
        return ("plain",)
    return ("mesh " + ",".join(tally_dtensor.dim_names(p.device_mesh)),) + tally_dtensor.signature(p)


def stats_group(p, rank, mixed_mesh):
    """The ranks the norm sums `p`'s squares over on this rank. accelerate's (torch's get_total_norm
    over each mesh's DTensors, `full_tensor` of each group's norm): a DTensor's mesh dims that are not
    Replicate; a plain gradient, this rank alone. The Trainer's mixed-mesh path
    (`_mixed_mesh_grad_norm`, where DTensor and plain gradients mix; `mixed_mesh` is then the mesh of
    the first DTensor gradient in model.parameters()): every DTensor's local squares all-reduced over
    that mesh's group, whatever its own mesh and placements; a plain one, this rank."""
    if not tally_dtensor.is_dtensor(p):
        return [rank]
    if mixed_mesh is not None:
        return tally_dtensor.ranks_along(mixed_mesh, list(range(mixed_mesh.ndim)))
    mesh = p.device_mesh
    return tally_dtensor.ranks_along(mesh, [d for d, pl in enumerate(p.placements) if not pl.is_replicate()])


def manifest(run, producer):
    """This rank's manifest: one child per accelerate group (a mesh, the plain gradients) and
    placements, each summed over the ranks the norm that ran sums it over on this rank."""
    import torch.distributed as dist

    params, world, rank = run.params, dist.get_world_size(), dist.get_rank()
    max_norm = float(run.config["max_grad_norm"])
    children = tally_dtensor.canonical_children([group_key(p) for p in params], world)
    # The Trainer decided it itself (Trainer._has_mixed_mesh_grads, cached on the first call); its
    # all-reduce is over the group of the first DTensor gradient's mesh (trainer.py:2644).
    mixed = run.trainer is not None and bool(run.trainer._mixed_mesh_grads)
    first = next((p for p in run.model.parameters() if p.grad is not None and tally_dtensor.is_dtensor(p.grad)), None)
    mixed_mesh = first.grad.device_mesh if mixed and first is not None else None
    groups_of = {}
    for p in params:
        groups_of.setdefault(group_key(p), stats_group(p, rank, mixed_mesh))
    missing = [key for key in children if key not in groups_of]
    if missing:
        raise ValueError(f"rank {rank} holds no param of the norm's groups {missing}: the ranks would not reduce "
                         "the same groups")
    clips = tally_dtensor.clip_coefficients(children, params, group_key, run.before, run.after, max_norm, run.norm) \
        if max_norm > 0 else None
    mesh = run.accelerator.torch_device_mesh
    names = tally_dtensor.dim_names(mesh)
    t = run.case["topology"]
    # Under EP accelerate's tp mesh holds the experts alone: no TP group of tally's.
    tp_group = tally_dtensor.ranks_along(mesh, [names.index("tp")]) if "tp" in names and t["tp"] > 1 else [rank]
    code = ("Trainer._mixed_mesh_grad_norm" if mixed else "Trainer._clip_grad_norm") if run.trainer is not None \
        else "Accelerator.clip_grad_norm_"
    return tally_dtensor.build_manifest(
        run.pieces, group_key, children, lambda p: run.before[id(p)],
        child_names=lambda key: f"{code} group {key[0]}" + (f" on ({', '.join(key[1:])})" if len(key) > 1 else ""),
        # The experts are sharded over TP with the rest where the case's ETP is its TP (run/hf/rules.cpp).
        groups={"tp": tp_group, "expt_tp": tp_group if t["etp"] > 1 else [rank]},
        parallel={"tp": t["tp"], "cp": t["cp"], "pp": t["pp"], "dp": world // (t["tp"] * t["cp"] * t["pp"]),
                  "ep": t["ep"], "etp": t["etp"]},
        producer=producer,
        reported_norm=run.norm,
        clips=clips,
        clipped_of=lambda p: run.after[id(p)],
        stats_groups={key: groups_of[key] for key in children},
    )


def release(run):
    """accelerate's process state, environment and process groups forgotten, so the next case's
    Accelerator is made with its own configuration alone (a user's process makes one; accelerate
    keeps one shared state per process, and reads back what it wrote into the environment)."""
    from accelerate.state import AcceleratorState

    for name in ("model", "optimizer", "accelerator", "trainer"):
        if hasattr(run, name):
            setattr(run, name, None)
    AcceleratorState._reset_state(reset_partial_state=True)
    saved = getattr(run, "environ", None)
    if saved is not None:
        for key in [k for k in os.environ if k not in saved]:
            del os.environ[key]
        os.environ.update(saved)
    # accelerate builds its device mesh each case (ParallelismConfig): its gloo groups' threads.
    base.destroy_groups_past(base.GROUP_THREADS)


class HfWorker(base.Worker):
    """tally's worker for transformers and accelerate: transformers' models, accelerate's layout, and
    accelerate's or the Trainer's norm."""

    framework = "hf"
    package = "accelerate"
    plants = PLANTS
    not_planted = NOT_PLANTED

    def framework_version(self):
        import accelerate
        import transformers

        # accelerate's release, which lays the case out and computes the norm, then transformers' (the
        # models and the Trainer), as one release string: "1.15.0+transformers-5.17.0".
        return f"{accelerate.__version__}+transformers-{transformers.__version__}"

    def start(self):
        import accelerate.accelerator  # noqa: F401  (planted faults replace its functions)
        import transformers.trainer  # noqa: F401

    def dtypes(self):
        return ["fp32"]

    def build(self, run):
        build(run)

    def set_gradients(self, run):
        return set_gradients(run)

    def norm_step(self, run):
        clip(run)

    def manifest(self, run):
        return manifest(run, self.producer())

    def release(self, run, failed):
        release(run)


def main(argv=None):
    return base.run(HfWorker, argv)


if __name__ == "__main__":
    sys.exit(main())
