"""The catalog's faults planted in DeepSpeed, for the real mutation score.

A catalog fault (`tally run --list-faults`) with a counterpart in DeepSpeed is planted for one case
by replacing the function that decides its rule, in every loaded deepspeed module that imported it
(or on the class that defines it); the originals are put back after the case. DeepSpeed's files
are never touched. recording.Recording reads the replaced predicates too, so the manifests show a
planted filter; a planted reduction shows in the reported norm. NOT_PLANTED says why each other
fault has no counterpart here.
"""


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


def _averaged_twice(orig):
    def allreduce_bucket(self, bucket, dp_group, dp_world_size=None):
        from deepspeed import comm as dist

        reduced = orig(self, bucket, dp_group, dp_world_size)
        return reduced.div_(dp_world_size or dist.get_world_size(group=dp_group))

    return allreduce_bucket


def _not_averaged(orig):
    def allreduce_bucket(self, bucket, dp_group, dp_world_size=None):
        average, self.gradient_average = self.gradient_average, False
        try:
            return orig(self, bucket, dp_group, dp_world_size)
        finally:
            self.gradient_average = average

    return allreduce_bucket


def _experts_averaged_over_their_group(orig):
    def _reduce_expert_gradients(self, expert_grads, elements_per_buffer):
        # The size the experts' sums are divided by is read from the data-parallel group: here it is
        # their own expert-DP group (Megatron-LM #5956's wrong group).
        from deepspeed.utils import groups

        dense = groups._get_data_parallel_group
        names = list(expert_grads)
        if names:
            groups._get_data_parallel_group = lambda: groups._get_expert_data_parallel_group(names[0])
        try:
            return orig(self, expert_grads, elements_per_buffer)
        finally:
            groups._get_data_parallel_group = dense

    return _reduce_expert_gradients


_ENGINE = "deepspeed.runtime.engine:DeepSpeedEngine"

# fault -> ([(module, or "module:Class", the function, how to make the replacement), ...], how)
PLANTS = {
    # The reduction of the gradients at ZeRO 0 (the engine's bucket all-reduce); ZeRO 1 to 3 divide
    # inline (stage_1_and_2.py:1688, stage3.py:1878 at 0.19.8), with no function to replace.
    "grads-averaged-twice": (
        [(_ENGINE, "allreduce_bucket", _averaged_twice)],
        "ZeRO 0: allreduce_bucket divides its average by the DP size once more",
    ),
    "grads-not-averaged": (
        [(_ENGINE, "allreduce_bucket", _not_averaged)],
        "ZeRO 0: allreduce_bucket sums without dividing by the DP size",
    ),
    "expert-grads-averaged-over-edp": (
        [(_ENGINE, "_reduce_expert_gradients", _experts_averaged_over_their_group)],
        "ZeRO 0: _reduce_expert_gradients divides the experts' sums by their expert-DP size, not the DP size",
    ),
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

_MEGATRON_FINALIZE = "a step of Megatron's finalize_model_grads; DeepSpeed's own pipeline and AutoTP sums are other code"
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
    "tied-embedding-not-synced": _MEGATRON_FINALIZE,
    "tied-embedding-synced-twice": _MEGATRON_FINALIZE,
    "tp-replicated-grads-not-summed": _MEGATRON_FINALIZE,
    "tp-replicated-grads-summed-twice": _MEGATRON_FINALIZE,
}
