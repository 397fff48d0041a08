#!/usr/bin/env python3
"""tally's worker for NeMo-Automodel: executes tally's cases with Automodel's own model classes,
meshes, parallelizer and gradient clipping, unmodified, and writes the manifests `tally` judges
(`tally fuzz|run|replay --target automodel`).

Started by tally, once per world size, under torchrun (one process per rank):

    torchrun --standalone --nproc-per-node WORLD -m tally_adapters.automodel.worker \\
        --queue DIR --parent-pid PID [--backend auto|nccl|gloo]

It speaks the queue protocol of tally_adapters.queue (docs/real-targets.md). Per case, on every rank:

1. The case's GPT as the Hugging Face architecture of its shape (tally_adapters.hf_models: Llama,
   or Qwen3 with qk-layernorm; a MoE model Automodel's own Qwen3-MoE with qk-layernorm, else its
   GPT-OSS, with sinks and biases: tally_adapters.automodel.moe), built with the class Automodel's
   registry names for it (`nemo_automodel._transformers.registry`: its own Llama, Qwen3, Qwen3-MoE
   and GPT-OSS implementations), fp32. Its MoE models build on a GPU only.
2. Automodel's meshes (`MeshContext.build` with `ParallelismSizes`: pp, dp_replicate, dp_shard, cp,
   tp, as its recipes' `distributed` section gives them) and its parallelizer
   (`parallelize_model`: its TP plan for the architecture, sequence parallelism where the case
   asks, FSDP2 over dp_shard_cp, HSDP over dp_replicate), with fp32 parameters and reductions.
   `NeMoAutoModelForCausalLM.from_config` runs the same two steps for a user, on a CUDA device
   only (it builds its infrastructure on `cuda`), so the worker calls them itself, on CPUs too.
3. Every param's gradient: after the reduction (the default), tally's values placed as the param is
   (`distribute_tensor`), each rank's shard checked against the box its placements describe; before
   it (`automodel.gradients_enter`), each rank's share left by a backward under FSDP2's hooks and
   averaged by FSDP2's own reduce-scatter (and HSDP's all-reduce); what it leaves is recorded.
4. Automodel's `clip_grad_norm` (components/training/utils.py), as its training recipes call it
   after the gradients are synchronized, with the case's max_norm (infinity where the case does
   not clip) and, for a MoE model, its MoE mesh and EP axis as the recipe passes them, and the
   manifests of what it returned and of the gradients after it. Before the reduction, the call the
   recipe makes, `scale_grads_and_clip_grad_norm`, which first divides expert gradients by
   DP / ep_shard (FSDP2 averaged them over ep_shard only) and then calls `clip_grad_norm`, whose
   gradients are recorded as it starts (`clip`). Automodel
   groups params by mesh and placements and sums each group's squares over the group's sharded
   mesh dims (not over its replicated ones), so each group's stats group on this rank is exactly
   those ranks (tally_adapters.dtensor.ranks_along) and every shard counts there.

On a machine without GPUs it runs on the CPUs with gloo (Automodel builds its meshes on `cpu` when
the process group is gloo).
"""

import math
import sys

from .. import dtensor as tally_dtensor
from .. import fsdp2, hf_models
from .. import worker as base
from ..plants import FSDP2_REDUCTION_PLANTS, fsdp2_reduction_not_planted
from . import moe

_UTILS = "nemo_automodel.components.training.utils"


# --- planted faults (the real mutation score) -------------------------------------------------
#
# A catalog fault with a counterpart in Automodel's reducer is planted for one case by replacing the
# function that decides it (tally_adapters.plants); the original is put back after the case. Each
# replacement is the function with one rule changed.


def _averaged_over_shards(orig):
    # Each sharded mesh dim's sum of squares becomes their mean: per-rank contributions averaged
    # instead of summed (DeepSpeed #8475's rule, in Automodel's scalar reduction).
    def _all_reduce_scalar(scalar, op, mesh, mesh_dim=None):
        import torch.distributed as dist

        total = orig(scalar, op, mesh, mesh_dim)
        if op != dist.ReduceOp.SUM:
            return total
        size = mesh.size() if mesh_dim is None else mesh.size(mesh_dim)
        return total / size

    return _all_reduce_scalar


def _over_replicas_too(orig):
    # A reduction over dp_shard also runs over dp_replicate, where HSDP's replicas hold the same
    # shard: each is counted once per replica.
    def _all_reduce_scalar(scalar, op, mesh, mesh_dim=None):
        total = orig(scalar, op, mesh, mesh_dim)
        names = list(mesh.mesh_dim_names or ())
        if mesh_dim is not None and names[mesh_dim] == "dp_shard" and "dp_replicate" in names:
            total = orig(total, op, mesh, names.index("dp_replicate"))
        return total

    return _all_reduce_scalar


def _without_ep(orig):
    # The scalar is not reduced over the EP axis: each EP group's "global" norm is its own
    # (NeMo-Automodel #3816's rule): the EP dim of the MoE mesh, or the flat EP mesh of EP-local
    # experts, left out.
    def _all_reduce_scalar(scalar, op, mesh, mesh_dim=None):
        names = tally_dtensor.dim_names(mesh)
        if (mesh_dim is not None and names[mesh_dim] == "ep") or (mesh_dim is None and names == ["ep"]):
            return scalar
        return orig(scalar, op, mesh, mesh_dim)

    return _all_reduce_scalar


def _on_ep(p):
    """Whether `p` lives on the EP axis (Automodel's experts: a DTensor on the MoE mesh)."""
    return tally_dtensor.is_dtensor(p) and "ep" in tally_dtensor.dim_names(p.device_mesh)


def _sharding_groups(parameters):
    """The params with gradients in each of Automodel's sharding groups (mesh and placements), as its
    impl groups them to clip."""
    from torch.distributed.tensor import DTensor

    by_group = {}
    for p in parameters:
        key = (id(p.device_mesh), tuple(str(pl) for pl in p.placements)) if isinstance(p, DTensor) else None
        if p.grad is not None:
            by_group.setdefault(key, []).append(p)
    return list(by_group.values())


def _clip_by(parameters, max_norm, norm, foreach):
    """Each of Automodel's sharding groups clipped by `norm`, as its impl clips."""
    import torch

    for params in _sharding_groups(parameters):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach)


def _experts_left_out(orig):
    # The norm leaves the experts out (DeepSpeed #8613's rule): taken over the other params, and
    # every gradient clipped by it.
    def _clip_grad_norm_impl(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                             pp_mesh=None, ep_mesh=None, ep_param_ids=None, **kwargs):
        import torch

        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        total = orig([p for p in parameters if not _on_ep(p)], math.inf, norm_type, error_if_nonfinite, foreach,
                     pp_mesh, ep_mesh, ep_param_ids, **kwargs)
        _clip_by(parameters, max_norm, total, foreach)
        return total

    return _clip_grad_norm_impl


def _clip_norm_without_ep(orig):
    # The norm reported is right, but the one the gradients are clipped by is not reduced over EP
    # (ColossalAI #2192's rule): each EP position clips by its own.
    def _clip_grad_norm_impl(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                             pp_mesh=None, ep_mesh=None, ep_param_ids=None, **kwargs):
        import torch

        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        total = orig(parameters, math.inf, norm_type, error_if_nonfinite, foreach, pp_mesh, ep_mesh, ep_param_ids,
                     **kwargs)
        utils = sys.modules[_UTILS]
        reduce = utils._all_reduce_scalar
        utils._all_reduce_scalar = _without_ep(reduce)
        try:
            clip_norm = orig(parameters, math.inf, norm_type, error_if_nonfinite, foreach, pp_mesh, ep_mesh,
                             ep_param_ids, **kwargs)
        finally:
            utils._all_reduce_scalar = reduce
        _clip_by(parameters, max_norm, clip_norm, foreach)
        return total

    return _clip_grad_norm_impl


def _each_group_by_its_norm(orig):
    # The total norm is reported, but each sharding group (mesh and placements, as Automodel groups)
    # is clipped by its own (Megatron-LM #785's rule, in Automodel's per-group clip).
    def _clip_grad_norm_impl(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                             pp_mesh=None, ep_mesh=None, ep_param_ids=None, **kwargs):
        import torch
        from torch.distributed.tensor import DTensor

        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        total = orig(parameters, math.inf, norm_type, error_if_nonfinite, foreach, pp_mesh, ep_mesh, ep_param_ids,
                     **kwargs)
        for params in _sharding_groups(parameters):
            own = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type, False, foreach)
            own = own.full_tensor() if isinstance(own, DTensor) else own
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, own, foreach)
        return total

    return _clip_grad_norm_impl


# fault -> ([(module, the function, how to make the replacement)], how)
PLANTS = {
    # Where the gradients enter before FSDP2's reduction (automodel.gradients_enter).
    **FSDP2_REDUCTION_PLANTS,
    "average-rank-norms": (
        [(_UTILS, "_all_reduce_scalar", _averaged_over_shards)],
        "_all_reduce_scalar averages each sharded mesh dim's sum of squares instead of summing it",
    ),
    "stats-over-replicas": (
        [(_UTILS, "_all_reduce_scalar", _over_replicas_too)],
        "_all_reduce_scalar also reduces dp_shard's sums over dp_replicate, where HSDP's replicas are",
    ),
    "clip-per-child-norm": (
        [(_UTILS, "_clip_grad_norm_impl", _each_group_by_its_norm)],
        "each of _clip_grad_norm_impl's sharding groups is clipped by its own norm, the total reported",
    ),
    # Experts on the MoE mesh (Automodel's Qwen3-MoE and GPT-OSS, on a GPU).
    "missing-ep-reduction": (
        [(_UTILS, "_all_reduce_scalar", _without_ep)],
        "_all_reduce_scalar skips the EP axis: each EP group's norm is its own (NeMo-Automodel #3816)",
    ),
    "expert-norm-dropped": (
        [(_UTILS, "_clip_grad_norm_impl", _experts_left_out)],
        "_clip_grad_norm_impl takes the norm without the experts on the EP axis and clips every gradient by it",
    ),
    "clip-per-ep-group-norm": (
        [(_UTILS, "_clip_grad_norm_impl", _clip_norm_without_ep)],
        "_clip_grad_norm_impl reports the total norm but clips by one not reduced over EP",
    ),
}

_NO_ATTRIBUTES = "DTensor counts through placements: Automodel's reducer reads no Megatron attribute"
NOT_PLANTED = {
    "expert-dedup-on-dense-tp": _NO_ATTRIBUTES,
    "allreduce-flag-lost-on-main-params": _NO_ATTRIBUTES,
    "expert-weights-not-tp-marked": _NO_ATTRIBUTES,
    "expert-label-from-ep-only": _NO_ATTRIBUTES,
    "expert-label-ignores-gtp": "no generalized TP",
    "expert-stats-over-dense-mp": "no Muon: Automodel groups its experts by their own MoE mesh",
    "tied-copy-not-shared": "a tied output is one param without PP, and the worker builds no pipeline",
    "tp-sharded-param-unmarked": _NO_ATTRIBUTES,
    "replicated-marked-tp": _NO_ATTRIBUTES,
    "no-dedup-filter": _NO_ATTRIBUTES,
    "missing-pp-reduction": "the worker builds no pipeline (Automodel's AutoPipeline is not run)",
    "zero-count-in-float32": "Automodel reports no zero count",
    "empty-rank-skips-collective": "not planted: a rank that skips a collective hangs the worker",
    "inf-norm-combined-by-l2": "the worker records the L2 norm only",
    "distopt-padding-counted": "no distributed optimizer",
    "distopt-overlapping-shards": "no distributed optimizer",
    "clip-per-stage-norm": "the worker builds no pipeline",
    "average-local-norms-over-dp": "FSDP's shards are summed over their mesh dims; no per-rank norms to average",
    "muon-expert-stats-without-egtp": "no Muon",
    "tp-marking-unseen-by-filter": _NO_ATTRIBUTES,
    "norm-of-scaled-gradients": "no loss scale: the worker holds fp32 gradients",
    "layer-wise-unsharded-at-dp-cp-1": "no layer-wise optimizer",
    **fsdp2_reduction_not_planted("Automodel"),
}


# --- one case ----------------------------------------------------------------------------------


def is_moe(model_json):
    return int(model_json["num_experts"]) > 0


def build_model(model_json, index):
    """The case's architecture as Automodel builds it: the class its registry names (its own Llama,
    Qwen3, Qwen3-MoE and GPT-OSS), fp32, with Automodel's default backends."""
    from nemo_automodel._transformers.registry import get_registry

    if is_moe(model_json):
        arch, config_of = moe.ARCHITECTURES[moe.family(model_json)]
        config = config_of(model_json, index)
    else:
        config = hf_models.hf_config(model_json, index)
        arch = "Qwen3ForCausalLM" if hf_models.architecture(model_json) == "qwen3" else "LlamaForCausalLM"
    cls = get_registry().get_model_cls_from_model_arch(arch)
    return cls(config)


class Mapping:
    """Where tally's logical params lie in the model's params: `held[name]` the parts a param holds,
    and the functions of hf_models (a dense model: whole rows) or moe (Qwen3-MoE, GPT-OSS: rows, stacks
    of transposed experts and of expert biases) that read them."""

    def __init__(self, case, index, shapes_here):
        model = case["model"]
        self.module = moe if is_moe(model) else hf_models
        self.held = moe.parts(model, index) if is_moe(model) else hf_models.segments(model, index)
        self.module.check_cover(self.held, shapes_here, index)

    def full_gradient(self, name, shape, tensors):
        return self.module.full_gradient(self.held[name], shape, tensors)

    def boxes(self, name, offsets, extents):
        return self.module.boxes(self.held[name], offsets, extents)

    def is_expert(self, name):
        return self.module is moe and moe.is_expert(self.held[name])


def local_name(name):
    """A param's name without the wrappers' own module names (FSDP2 and checkpointing keep them)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_fsdp_wrapped_module.", "")


def group_key(p):
    """Automodel's sharding group of a param (utils.py `_clip_grad_norm_impl`: mesh and placements),
    named the same on every rank."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return ("regular",)
    return tuple(f"{n}:{pl}" for n, pl in zip(tally_dtensor.dim_names(p.device_mesh), p.placements))


def stats_group(p, rank):
    """The ranks Automodel sums `p`'s group over on this rank: its mesh dims that are not Replicate."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return [rank]
    dims = [d for d, pl in enumerate(p.placements) if not pl.is_replicate()]
    return tally_dtensor.ranks_along(p.device_mesh, dims)


def build(run):
    """The case's model as Automodel builds it, parallelized by Automodel's own parallelizer over the
    meshes its configuration makes (`model`, `mesh_context`), onto `run`."""
    import torch
    import torch.distributed as dist
    from nemo_automodel.components.distributed.config import FSDP2Config
    from nemo_automodel.components.distributed.mesh import MeshContext, ParallelismSizes
    from nemo_automodel.components.distributed.model_parallelizer import parallelize_model
    from torch.distributed.fsdp import MixedPrecisionPolicy

    run.config = run.request.engine_config()  # run/automodel/rules.cpp wrote it; `tally show` prints the same
    sizes = run.config["distributed"]
    model = build_model(run.case["model"], run.index)
    strategy = FSDP2Config(
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32),
        sequence_parallel=bool(sizes["sequence_parallel"]),
    )
    parallelism = ParallelismSizes(dp_replicate_size=sizes["dp_replicate_size"], tp_size=sizes["tp_size"],
                                   cp_size=sizes["cp_size"], pp_size=sizes["pp_size"], ep_size=sizes["ep_size"])
    run.mesh_context = MeshContext.build(strategy, parallelism, world_size=dist.get_world_size())
    run.model = parallelize_model(model, run.mesh_context)


def contributions_of(run, mapping):
    """This rank's share of each param's gradient (path in `named_parameters` -> numpy array of the
    param's shape, its parts of the logical shares: `mapping`): FSDP2 averages every gradient over
    dp_replicate x dp_shard x cp (Automodel sets no divide factor), so tally dealt every gradient
    times that size into one nonzero share per rank of such a group (run/automodel/rules.h). A rank
    takes the share at its position among the group's ranks in Automodel's mesh. With sequence
    parallelism a param TP replicates has a Partial gradient over TP, which FSDP2 sums before it
    averages: its group is the FSDP group times TP. An expert on the MoE mesh's EP axis is FSDP2's
    over ep_shard alone, and the recipe's scale_grads_and_clip_grad_norm divides what FSDP2 leaves by
    DP / ep_shard: tally dealt it times DP over ep_shard's ranks."""
    import torch.distributed as dist

    values_of = {}  # group size -> every rank's shares of every logical gradient
    mine = {}  # the group's ranks -> this rank's share of every logical gradient

    def shares_over(mesh, axes):
        names = tally_dtensor.dim_names(mesh)
        ranks = tuple(tally_dtensor.ranks_along(mesh, [d for d, name in enumerate(names) if name in axes]))
        if ranks not in mine:
            if len(ranks) not in values_of:
                values_of[len(ranks)] = run.request.shares(len(ranks))
            at = ranks.index(dist.get_rank())
            mine[ranks] = {name: values[at] for name, values in values_of[len(ranks)].items()}
        return mine[ranks]

    device_mesh, moe_mesh = run.mesh_context.device_mesh, run.mesh_context.moe_mesh
    out = {}
    for n, p in run.model.named_parameters():
        if not p.requires_grad:
            continue
        if moe_mesh is not None and mapping.is_expert(local_name(n)):
            out[n] = mapping.full_gradient(local_name(n), p.shape, shares_over(moe_mesh, ("ep_shard",)))
            continue
        partial = run.config["distributed"]["sequence_parallel"] and fsdp2.replicated_over(p, "tp")
        axes = ("dp_replicate", "dp_shard", "cp") + (("tp",) if partial else ())
        out[n] = mapping.full_gradient(local_name(n), p.shape, shares_over(device_mesh, axes))
    return out


def set_gradients(run):
    """Every param's gradient (`before`, by param) and the manifest pieces of each (`pieces`; a fused
    param holds segments of several logical gradients); returns the logical names held. After the
    reduction: its segments of tally's logical gradients placed as the param is. Before it: each
    rank's contribution, reduced by FSDP2 itself (tally_adapters.fsdp2); the judge checks what it
    left against tally's gradient."""
    import torch

    named = [(local_name(n), p) for n, p in run.model.named_parameters() if p.requires_grad]
    mapping = Mapping(run.case, run.index, {n: list(p.shape) for n, p in named})
    shapes = {p["name"]: list(p["shape"]) for p in run.index}
    run.pieces, run.before = [], {}
    reduced = run.case["automodel"].get("gradients_enter") == "before_reduction"
    if reduced:
        partial_over = ("tp",) if run.config["distributed"]["sequence_parallel"] else ()
        fsdp2.backward_through_fsdp2(run.model, fsdp2.local_term(contributions_of(run, mapping), run.device,
                                                                 partial_over))
        boxes, run.before = fsdp2.held_gradients([p for _, p in named])
    for name, p in named:
        if reduced:
            offsets, extents = boxes[id(p)]
        else:
            full = torch.from_numpy(mapping.full_gradient(name, p.shape, run.tensors)).to(run.device)
            (offsets, extents), run.before[id(p)] = tally_dtensor.place_gradient(p, full, name)
        attributes = tally_dtensor.attributes_of(p, expert=mapping.is_expert(name))
        for begin, end, logical, logical_offsets, logical_extents in mapping.boxes(name, offsets, extents):
            run.pieces.append(tally_dtensor.Piece(p, name, begin, end, logical, shapes[logical], logical_offsets,
                                                  logical_extents, attributes))
    run.params = [p for _, p in named]
    return {piece.logical_name for piece in run.pieces}


def dp_group_size(device_mesh):
    """The data-parallel size the recipe passes scale_grads_and_clip_grad_norm: its flat "dp" mesh's,
    or "dp_cp"'s where CP > 1 (BaseRecipe._get_dp_group_size(include_cp=True), recipes/base_recipe.py:749-759)."""
    from nemo_automodel.components.distributed.mesh_utils import get_flat_mesh

    return get_flat_mesh(device_mesh, "dp_cp" if device_mesh["cp"].size() > 1 else "dp").size()


def clip(run):
    """Automodel's clip over the model, with the case's max_norm (infinity where the case does not
    clip): its norm (`norm`) and the gradients after it (`after`). After FSDP2's reduction,
    clip_grad_norm; before it, what the recipe calls after the backward,
    scale_grads_and_clip_grad_norm, which first divides the experts by DP / ep_shard and then calls
    clip_grad_norm: the gradients that call gets are the ones the case's truth holds them to
    (`before`, recorded as it starts; nothing else of it changes)."""
    from nemo_automodel.components.training import utils as automodel_utils
    from torch.distributed.tensor import DTensor

    max_norm = float(run.config["clip_grad"]["max_norm"])
    max_norm = max_norm if max_norm > 0 else math.inf
    # The MoE mesh and its EP axis as Automodel's recipe passes them (recipes/llm/train_ft.py:1501-1515).
    moe_mesh = run.mesh_context.moe_mesh
    ep_axis = "ep" if moe_mesh is not None and "ep" in tally_dtensor.dim_names(moe_mesh) else None
    device_mesh = run.mesh_context.device_mesh
    if run.case["automodel"].get("gradients_enter") != "before_reduction":
        total = automodel_utils.clip_grad_norm(max_norm, [run.model], device_mesh=device_mesh, moe_mesh=moe_mesh,
                                               ep_axis_name=ep_axis)
    else:
        clip_grad_norm = automodel_utils.clip_grad_norm

        def recorded(*args, **kwargs):
            run.before = {id(p): tally_dtensor.local_values(p.grad) for p in run.params}
            return clip_grad_norm(*args, **kwargs)

        automodel_utils.clip_grad_norm = recorded
        try:
            total = automodel_utils.scale_grads_and_clip_grad_norm(
                max_norm, [run.model], norm_type=2.0, pp_enabled=False, device_mesh=device_mesh, moe_mesh=moe_mesh,
                ep_axis_name=ep_axis, pp_axis_name=None, foreach=True, num_label_tokens=None,
                dp_group_size=dp_group_size(device_mesh),
                expert_tp_replication_factor=automodel_utils.get_expert_tp_replication_factor([run.model], device_mesh))
        finally:
            automodel_utils.clip_grad_norm = clip_grad_norm
    if isinstance(total, DTensor):
        total = total.full_tensor()
    run.norm = float(total)
    run.after = {id(p): tally_dtensor.local_values(p.grad) for p in run.params}


def manifest(run, producer):
    """This rank's manifest: one child per Automodel sharding group, each summed over the ranks
    Automodel reduces it over on this rank."""
    import torch.distributed as dist

    rank, world, params = dist.get_rank(), dist.get_world_size(), run.params
    max_norm = float(run.config["clip_grad"]["max_norm"])
    children = tally_dtensor.canonical_children([group_key(p) for p in params], world)
    groups_of = {}
    for p in params:
        groups_of.setdefault(group_key(p), stats_group(p, rank))
    missing = [key for key in children if key not in groups_of]
    if missing:
        raise ValueError(f"rank {rank} holds no param of Automodel's sharding groups {missing}: the ranks would "
                         "not reduce the same groups")
    clips = tally_dtensor.clip_coefficients(children, params, group_key, run.before, run.after, max_norm, run.norm) \
        if max_norm > 0 else None
    device_mesh = run.mesh_context.device_mesh
    names = tally_dtensor.dim_names(device_mesh)
    tp_group = tally_dtensor.ranks_along(device_mesh, [names.index("tp")]) if "tp" in names else [rank]
    t = run.case["topology"]
    return tally_dtensor.build_manifest(
        run.pieces, group_key, children, lambda p: run.before[id(p)],
        child_names=lambda key: "Automodel clip_grad_norm group on (" + ", ".join(key) + ")",
        groups={"tp": tp_group, "expt_tp": [rank]},
        parallel={"tp": t["tp"], "cp": t["cp"], "pp": t["pp"], "dp": world // (t["tp"] * t["cp"] * t["pp"]),
                  "ep": t["ep"], "etp": t["etp"]},
        producer=producer,
        reported_norm=run.norm,
        clips=clips,
        clipped_of=lambda p: run.after[id(p)],
        stats_groups={key: groups_of[key] for key in children},
    )


class AutomodelWorker(base.Worker):
    """tally's worker for NeMo-Automodel: executes tally's cases with Automodel's models, parallelizer and clip."""

    framework = "automodel"
    package = "nemo_automodel"
    plants = PLANTS
    not_planted = NOT_PLANTED

    def framework_version(self):
        import nemo_automodel

        return nemo_automodel.__version__

    def start(self):
        import nemo_automodel.components.training.utils  # noqa: F401  (planted faults replace its functions)

    def cannot_run(self):
        import torch

        if torch.cuda.is_available():
            return {}
        # Its DeepSeek-V3 builds on CPUs: tally runs MoE with multi-latent attention here all the same
        # (run/automodel/rules.cpp).
        return {"model.num_experts": "Automodel's Qwen3-MoE and GPT-OSS build their rotary embedding on "
                                     "cuda:current_device() (nemo_automodel/components/models/qwen3_moe/model.py:184, "
                                     "gpt_oss/model.py:160), and this worker sees no CUDA device"}

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
        # Automodel builds its meshes each case (MeshContext.build): their gloo groups' threads.
        run.model = run.mesh_context = None
        base.destroy_groups_past(base.GROUP_THREADS)


def main(argv=None):
    return base.run(AutomodelWorker, argv)


if __name__ == "__main__":
    sys.exit(main())
