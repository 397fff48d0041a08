"""The catalog's faults planted in Megatron, for the real mutation score.

A catalog fault (`tally run --list-faults`) with a counterpart in Megatron is planted for one case
by replacing, in every loaded megatron module that imported it, the function that decides the
rule; the original is put back after the case. Megatron's files are never touched. The adapter
reads the same functions when it records what was kept, so the manifests show the planted rule.
NOT_PLANTED says why each other fault has no counterpart here.
"""


def _plant_no_dedup_filter(orig):
    return lambda param, *args, **kwargs: True


def _plant_expert_dedup_on_dense_tp(orig):
    # Megatron-LM #6099: no TP groups reach the filter, which falls back to the dense TP rank.
    return lambda param, *args, **kwargs: orig(param)


def _plant_tied_copy_not_shared(orig):
    return lambda param: True


def _reducing_all_reduce(orig, how):
    import torch.distributed as dist

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if how == "world":
            group = None
        work = orig(tensor, op=op, group=group, async_op=async_op)
        if how == "average" and op == dist.ReduceOp.SUM:
            tensor.div_(dist.get_world_size(group))
        return work

    return all_reduce


def _plant_reduction(orig, how):
    """get_grad_norm_fp32 whose all-reduces average the group's sums (`average`) or run over the
    whole world instead of the stats group (`world`)."""
    import torch.distributed as dist

    def get_grad_norm_fp32(*args, **kwargs):
        saved = dist.all_reduce
        dist.all_reduce = _reducing_all_reduce(saved, how)
        try:
            return orig(*args, **kwargs)
        finally:
            dist.all_reduce = saved

    return get_grad_norm_fp32


def _plant_skipped(orig):
    return lambda *args, **kwargs: None


def _plant_twice(orig):
    def twice(*args, **kwargs):
        orig(*args, **kwargs)
        return orig(*args, **kwargs)

    return twice


_FINALIZE = "megatron.core.distributed.finalize_model_grads"

# fault -> ([(the module of the function it replaces, the function, how to make the replacement)], how)
PLANTS = {
    # The reduction of gradients that enter before it: finalize_model_grads calls each step by name.
    "tied-embedding-not-synced": (
        [(_FINALIZE, "_allreduce_word_embedding_grads", _plant_skipped)],
        "finalize_model_grads skips _allreduce_word_embedding_grads (the tied copies' sum across stages)",
    ),
    "tied-embedding-synced-twice": (
        [(_FINALIZE, "_allreduce_word_embedding_grads", _plant_twice)],
        "finalize_model_grads runs _allreduce_word_embedding_grads twice",
    ),
    "tp-replicated-grads-not-summed": (
        [(_FINALIZE, "_allreduce_non_tensor_model_parallel_grads", _plant_skipped)],
        "finalize_model_grads skips _allreduce_non_tensor_model_parallel_grads (q/k layernorms over TP)",
    ),
    "tp-replicated-grads-summed-twice": (
        [(_FINALIZE, "_allreduce_non_tensor_model_parallel_grads", _plant_twice)],
        "finalize_model_grads runs _allreduce_non_tensor_model_parallel_grads twice",
    ),
    "no-dedup-filter": (
        [("megatron.core.tensor_parallel.layers", "param_is_not_tensor_parallel_duplicate", _plant_no_dedup_filter)],
        "param_is_not_tensor_parallel_duplicate keeps every param",
    ),
    "expert-dedup-on-dense-tp": (
        [("megatron.core.tensor_parallel.layers", "param_is_not_tensor_parallel_duplicate", _plant_expert_dedup_on_dense_tp)],
        "param_is_not_tensor_parallel_duplicate called without its TP groups (Megatron-LM #6099)",
    ),
    "tied-copy-not-shared": (
        [("megatron.core.transformer.module", "param_is_not_shared", _plant_tied_copy_not_shared)],
        "param_is_not_shared keeps the last stage's tied copy",
    ),
    "average-rank-norms": (
        [("megatron.core.optimizer.clip_grads", "get_grad_norm_fp32", lambda orig: _plant_reduction(orig, "average"))],
        "get_grad_norm_fp32 averages the stats group's sums of squares instead of adding them",
    ),
    "stats-over-replicas": (
        [("megatron.core.optimizer.clip_grads", "get_grad_norm_fp32", lambda orig: _plant_reduction(orig, "world"))],
        "get_grad_norm_fp32 reduces over the whole world instead of the child's stats group",
    ),
}

_SCALING_INLINE = ("a number DistributedDataParallel.__init__ computes inline (gradient_scaling_factor and "
                   "expert_gradient_scaling_factor, distributed_data_parallel.py:179-213 at 0.19.2): no function "
                   "decides it")

# Catalog faults without a counterpart planted here, and why.
NOT_PLANTED = {
    "allreduce-flag-lost-on-main-params": "megatron-core 0.16 and later copy allreduce to main params "
    "in several places (no one function to replace)",
    "expert-weights-not-tp-marked": "an attribute of the params: the adapter derives each param's box from "
    "the same attributes, so the manifests would describe another model",
    "expert-label-from-ep-only": "decided while the layers are built (the allreduce attribute): as "
    "expert-weights-not-tp-marked",
    "expert-label-ignores-gtp": "needs generalized TP, which needs Transformer Engine",
    "muon-expert-stats-without-egtp": "needs generalized TP, which needs Transformer Engine",
    "expert-stats-over-dense-mp": "the param grouping of get_megatron_muon_optimizer, not one function",
    # The clip itself is recorded (each child's coefficient, its clipped gradients): these wrong
    # norms are decided inside the optimizers' step(), with no function of their own to replace.
    "clip-per-child-norm": "the norm each child clips with is chosen inside ChainedOptimizer.step, not one function",
    "clip-per-stage-norm": "the norm each stage clips with is chosen inside the optimizer's step, not one function",
    "clip-per-ep-group-norm": "the norm each EP group clips with is chosen inside the optimizer's step, not one function",
    "tp-sharded-param-unmarked": "the releases miscount attention sinks themselves (no fault to plant): "
    "the local DotProductAttention's softmax_offset is never marked tensor_model_parallel",
    "replicated-marked-tp": "an attribute of the params: the adapter derives each param's box from it",
    "expert-norm-dropped": "the chained optimizer's combination of children, not one function",
    "missing-ep-reduction": "the stats group is the child's (one ProcessGroup): no EP part to drop alone",
    "missing-pp-reduction": "the stats group is the child's (one ProcessGroup): no PP part to drop alone",
    "zero-count-in-float32": "needs a tensor of 2^24 elements, beyond the worker's small models",
    "empty-rank-skips-collective": "a hang: the worker would be stopped, not judged",
    "inf-norm-combined-by-l2": "the worker reports the L2 norm only",
    "distopt-padding-counted": "the DistributedOptimizer's buffer layout, not one function",
    "distopt-overlapping-shards": "the DistributedOptimizer's buffer layout, not one function",
    "average-local-norms-over-dp": "two reductions of one rank's norm: not one function",
    "tp-marking-unseen-by-filter": "param_is_not_tensor_parallel_duplicate reads the param's own mark, which "
    "the adapter reads too to describe its box",
    "norm-of-scaled-gradients": "the worker runs Megatron in bf16, without a loss scale",
    "layer-wise-unsharded-at-dp-cp-1": "megatron-core 0.16.1 and 0.19.2 do it already "
    "(LayerWiseDistributedOptimizer.shard_params returns early at DP x CP 1)",
    "grads-averaged-twice": _SCALING_INLINE,
    "grads-not-averaged": _SCALING_INLINE,
    "expert-grads-averaged-over-edp": _SCALING_INLINE,
}
