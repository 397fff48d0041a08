"""The catalog's faults planted in torchtitan's clip, for the real mutation score.

A catalog fault with a counterpart in torchtitan's clip is planted for one case by replacing
torchtitan.distributed.utils' function that decides it (tally_adapters.plants); the original is
put back after the case. Each replacement is the function with one rule changed. NOT_PLANTED says
why each other fault has no counterpart here.
"""

import math

from ..plants import FSDP2_DIVIDE_FACTORS, fsdp2_divided_again, fsdp2_reduction_not_planted


def _total_norm(grads, norm_type=2.0, foreach=None):
    import torch
    from torch.distributed.tensor import DTensor

    total = torch.nn.utils.get_total_norm(grads, norm_type, False, foreach)
    return total.full_tensor() if isinstance(total, DTensor) else total


def _over_pipeline(total, pp_mesh, op="sum"):
    import torch.distributed as dist

    if pp_mesh is None:
        return total
    total = total ** 2
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_mesh.get_group())
    if op == "mean":
        total = total / pp_mesh.size()
    return total ** 0.5


def _halves(parameters):
    ep, dense = [], []
    for p in parameters:
        if p.grad is None:
            continue
        (ep if "ep" in (p.device_mesh.mesh_dim_names or ()) else dense).append(p)
    return ep, dense


def _clip_halves(parameters, max_norm, total, foreach):
    """Clips by `total` as torchtitan does: the EP and non-EP halves apart (one foreach call may not
    mix meshes)."""
    import torch

    for half in _halves(parameters):
        torch.nn.utils.clip_grads_with_norm_(half, max_norm, total, foreach)


def _pipeline_not_reduced(orig):
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                        pp_mesh=None, ep_enabled=False):
        return orig(parameters, max_norm, norm_type, error_if_nonfinite, foreach, None, ep_enabled)

    return clip_grad_norm_


def _pipeline_averaged(orig):
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                        pp_mesh=None, ep_enabled=False):

        parameters = list(parameters)
        stage = orig(parameters, math.inf, norm_type, error_if_nonfinite, foreach, None, ep_enabled)
        total = _over_pipeline(stage, pp_mesh, op="mean")
        _clip_halves(parameters, max_norm, total, foreach)
        return total

    return clip_grad_norm_


def _clip_by_stage_norm(orig):
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                        pp_mesh=None, ep_enabled=False):
        parameters = list(parameters)
        stage = orig(parameters, max_norm, norm_type, error_if_nonfinite, foreach, None, ep_enabled)
        return _over_pipeline(stage.clone(), pp_mesh)

    return clip_grad_norm_


def _expert_half_dropped(orig):
    def _clip_grad_norm_with_ep(parameters, max_norm, norm_type, error_if_nonfinite, foreach, pp_mesh):

        parameters = list(parameters)
        ep, dense = _halves(parameters)
        total = _over_pipeline(_total_norm([p.grad for p in dense], norm_type, foreach), pp_mesh)
        _clip_halves(parameters, max_norm, total, foreach)
        return total

    return _clip_grad_norm_with_ep


def _expert_norm_not_over_ep(orig):
    def _clip_grad_norm_with_ep(parameters, max_norm, norm_type, error_if_nonfinite, foreach, pp_mesh):
        from torch.distributed.tensor import DTensor, Replicate

        ep, dense = _halves(parameters)
        # The expert gradients as if each EP rank held them all: no sum over EP (NeMo-Automodel #3816).
        local = [DTensor.from_local(p.grad.to_local(), p.grad.device_mesh,
                                    [Replicate() if n == "ep" else pl
                                     for n, pl in zip(p.grad.device_mesh.mesh_dim_names, p.grad.placements)],
                                    run_check=False)
                 for p in ep]
        total = (_total_norm(local, norm_type, foreach) ** 2 +
                 _total_norm([p.grad for p in dense], norm_type, foreach) ** 2) ** 0.5
        total = _over_pipeline(total, pp_mesh)
        _clip_halves(ep + dense, max_norm, total, foreach)
        return total

    return _clip_grad_norm_with_ep


def _each_half_by_its_norm(orig):
    def _clip_grad_norm_with_ep(parameters, max_norm, norm_type, error_if_nonfinite, foreach, pp_mesh):
        import torch

        ep, dense = _halves(parameters)
        ep_norm = _over_pipeline(_total_norm([p.grad for p in ep], norm_type, foreach), pp_mesh)
        dense_norm = _over_pipeline(_total_norm([p.grad for p in dense], norm_type, foreach), pp_mesh)
        torch.nn.utils.clip_grads_with_norm_(ep, max_norm, ep_norm, foreach)
        torch.nn.utils.clip_grads_with_norm_(dense, max_norm, dense_norm, foreach)
        return (ep_norm ** 2 + dense_norm ** 2) ** 0.5

    return _clip_grad_norm_with_ep


_UTILS = "torchtitan.distributed.utils"
# fault -> ([(module, the function, how to make the replacement)], how)
PLANTS = {
    # Where the gradients enter before FSDP2's reduction (torchtitan.gradients_enter).
    "grads-averaged-twice": (
        [(*FSDP2_DIVIDE_FACTORS, fsdp2_divided_again)],
        "FSDP2's sum of the contributions (torchtitan sets the divide factor 1) is divided by its data-parallel "
        "size (torchtitan #2318: divided twice)",
    ),
    "missing-pp-reduction": (
        [(_UTILS, "clip_grad_norm_", _pipeline_not_reduced)],
        "clip_grad_norm_ ignores pp_mesh: each stage's norm is its own (torchtitan #596, before its fix)",
    ),
    "average-rank-norms": (
        [(_UTILS, "clip_grad_norm_", _pipeline_averaged)],
        "clip_grad_norm_ averages the stages' squared norms over the pipeline group instead of summing them",
    ),
    "clip-per-stage-norm": (
        [(_UTILS, "clip_grad_norm_", _clip_by_stage_norm)],
        "clip_grad_norm_ clips each stage by its own norm, then reports the pipeline's",
    ),
    "expert-norm-dropped": (
        [(_UTILS, "_clip_grad_norm_with_ep", _expert_half_dropped)],
        "_clip_grad_norm_with_ep leaves the EP half out of the total norm",
    ),
    "missing-ep-reduction": (
        [(_UTILS, "_clip_grad_norm_with_ep", _expert_norm_not_over_ep)],
        "_clip_grad_norm_with_ep takes the EP half's norm without its sum over EP (each EP rank's own experts)",
    ),
    "clip-per-child-norm": (
        [(_UTILS, "_clip_grad_norm_with_ep", _each_half_by_its_norm)],
        "_clip_grad_norm_with_ep clips the EP and non-EP halves each by its own norm",
    ),
}

_NO_ATTRIBUTES = "DTensor counts through placements: torchtitan's path reads no Megatron attribute"
NOT_PLANTED = {
    "expert-dedup-on-dense-tp": _NO_ATTRIBUTES,
    "allreduce-flag-lost-on-main-params": _NO_ATTRIBUTES,
    "expert-weights-not-tp-marked": _NO_ATTRIBUTES,
    "expert-label-from-ep-only": _NO_ATTRIBUTES,
    "expert-label-ignores-gtp": "no generalized TP",
    "expert-stats-over-dense-mp": "no separate expert stats group: an expert's norm is reduced over its own mesh",
    "tied-copy-not-shared": "torchtitan ties the output only without PP, where it is one param",
    "tp-sharded-param-unmarked": _NO_ATTRIBUTES,
    "replicated-marked-tp": _NO_ATTRIBUTES,
    "no-dedup-filter": _NO_ATTRIBUTES,
    "zero-count-in-float32": "torch reports no zero count",
    "empty-rank-skips-collective": "not planted: a rank that skips a collective hangs the worker",
    "inf-norm-combined-by-l2": "the worker records the L2 norm only",
    "distopt-padding-counted": "no distributed optimizer",
    "distopt-overlapping-shards": "no distributed optimizer",
    "stats-over-replicas": "DTensor reduces over the sharded mesh dims its placements name",
    "clip-per-ep-group-norm": "not planted: clip-per-child-norm is torchtitan's counterpart",
    "average-local-norms-over-dp": "FSDP's shards are summed by DTensor; no per-rank norms to average",
    "muon-expert-stats-without-egtp": "no Muon",
    "tp-marking-unseen-by-filter": _NO_ATTRIBUTES,
    "norm-of-scaled-gradients": "no loss scale: FSDP2 holds fp32 gradients",
    "layer-wise-unsharded-at-dp-cp-1": "no layer-wise optimizer",
    **fsdp2_reduction_not_planted("torchtitan"),
    "grads-not-averaged": "torchtitan sums already: it sets FSDP2's divide factor to 1 (distributed/fsdp.py:41 at "
    "0.3.0) and scales the loss itself",
}
