#!/usr/bin/env python3
"""tally's worker for megatron-core: executes tally's cases with Megatron's own, unmodified code
and writes the manifests `tally` judges (`tally fuzz|run|replay --target megatron-core`).

Started by tally, once per world size, under torchrun (one process per rank):

    torchrun --standalone --nproc-per-node WORLD -m tally_adapters.megatron.worker \\
        --queue DIR --parent-pid PID [--backend auto|nccl|gloo]

The ranks stay up across cases. Per case (the files of the queue folder are described in
docs/real-targets.md): rank 0 waits for `case-<K>.json` (a tally case) and tells the others,
which read it too; every rank
rebuilds Megatron's parallel state for the case's topology (`initialize_model_parallel` with its
TP, PP, VPP, CP, EP, ETP, rank order and distributed-optimizer instances), builds the case's GPT
model from Megatron's local layer spec (`get_gpt_decoder_block_spec(use_transformer_engine=
False)`: no Transformer Engine, no Apex), wraps each model chunk in Megatron's
DistributedDataParallel (or, for a case with a `megatron_fsdp` section, in Megatron-FSDP's
FullyShardedDataParallel with its strategies), builds the case's optimizer with `get_megatron_optimizer` (plain:
chained Adam; distributed: the DistributedOptimizer; layerwise: Muon with the layer-wise
distributed optimizer, over megatron-core 0.19's parameter layout where the case's
`optimizer.layer_wise_param_layout` asks for it; muon: Muon without it), sets every param's gradient buffer (`main_grad`)
to the values tally's generator gives the logical element it holds (`case-<K>.gradients.*`),
runs `prepare_grads`, `get_grad_norm` and `count_zeros` (and, for MTP heads with a norm of their
own, megatron-core 0.19's `_compute_grad_norms_by_group`), and builds each rank's manifest with
`tally_adapters.megatron.build_manifest`, which the base writes into `case-<K>/` (the order is
`Worker.execute`'s). Rank 0 then writes `case-<K>.result.json`.

What the worker changes around Megatron, and why (never a Megatron file):
- No forward or backward pass runs: the gradients are set, as after Megatron's own gradient
  reductions (every replica of an element holds the same value), so the norm step sees exactly
  the gradients tally's truth is made of. Where the case's gradients enter before the reduction
  (`gradients.enter`), each rank writes its own share into its DDP bucket instead and
  megatron-core's `finalize_model_grads` reduces them once, unmodified (reduction.py).
- Sequence parallelism is off and the model's TransformerConfig says CP 1 while the parallel
  state has the case's CP: the local spec's torch norms refuse sequence parallelism and its
  attention refuses CP, and neither changes a parameter. DDP and the optimizers read the real CP
  groups from the parallel state.
- With more ranks than GPUs the default process group is gloo (NCCL refuses two ranks of one
  communicator on one GPU); Megatron's groups then use gloo too. Where megatron-core reduces the
  gradients, DDP's coalesced all-reduce, which gloo refuses on CUDA tensors, runs one collective at
  a time (tally_adapters.gloo_shims.coalesced_one_by_one).
- Megatron's parallel state is kept from one case to the next while the topology is the same (a
  sweep runs a layout's cases one after another; a shrink keeps the topology of the case it
  shrinks): making the groups is most of a case's time on gloo. Another topology, or a case that
  raised on any rank, has every rank destroy its groups and make them anew, so hundreds of cases
  do not exhaust sockets or file descriptors.
- Megatron-FSDP: its main gradients are fp32 (`megatron_fsdp_main_grads_dtype`; Megatron-LM's
  default is the params' bf16), each rank writes the range of each param its buffer shard holds,
  and the optimizer gets them through Megatron-FSDP's own `update_main_grads`. Where the case's
  gradients enter before the reduction, each rank writes its share of each whole TP-local param
  where a backward leaves it, and Megatron-FSDP's own hooks and `finish_grad_sync` reduce them
  (reduction.fsdp_backward).
- megatron-core 0.16.1's Muon calls emerging_optimizers with a keyword 0.3.0 renamed
  (`use_nesterov`): translated at construction (muon_compat.py).
"""

import functools
import sys

from .. import worker as base
from ..queue import thread_names_of_this_process, threads_of_this_process
from . import manifest as tally_megatron
from . import reduction
from .build import (
    build_model,
    build_optimizer,
    collect_everything,
    destroy_parallel_state,
    parallel_state_arguments,
    set_gradients,
    transformer_config,
)
from .plants import NOT_PLANTED, PLANTS

# What a rank's CUDA cache keeps from one case to the next.
CUDA_CACHE_KEPT_BYTES = 1 << 30
# A full collection after every case was a fifth of a world-8 case's time (bench/RESULTS.md); a
# case's models take megabytes, so one every CASES_PER_COLLECTION cases holds little for long.
CASES_PER_COLLECTION = 16

class MegatronCoreWorker(base.Worker):
    """tally's worker for megatron-core: executes tally's cases with Megatron's own, unmodified code."""

    framework = "megatron-core"
    package = "megatron."
    plants = PLANTS
    not_planted = NOT_PLANTED
    needs_gpu = True
    # initialize_model_parallel's arguments of the parallel state in place; None: none is.
    parallel_state_of = None
    cases_since_collection = 0

    def framework_version(self):
        try:
            from megatron.core import package_info

            return package_info.__version__
        except Exception:
            return "unknown"

    def cannot_run(self):
        # Megatron-FSDP's adapter lays out its device meshes with einops, which megatron-core's
        # wheel does not require.
        try:
            import einops  # noqa: F401
        except ImportError:
            return {"megatron_fsdp": "einops is not installed, and Megatron-FSDP's adapter needs it (pip install einops)"}
        return {}

    def start(self):
        # Every module that imports a function a fault replaces is loaded before any fault is
        # planted, so none keeps a replacement past its case.
        import megatron.core.distributed  # noqa: F401
        import megatron.core.models.gpt  # noqa: F401
        import megatron.core.optimizer  # noqa: F401
        import megatron.core.optimizer.clip_grads  # noqa: F401

    def use_parallel_state(self, topology):
        """Megatron's parallel state for `topology`: the one in place when every rank has that
        topology's (a rank whose last case raised has none), else made anew on every rank."""
        import os

        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        arguments = parallel_state_arguments(topology)
        in_place = [None] * dist.get_world_size()
        dist.all_gather_object(in_place, ("parallel state in place", arguments == self.parallel_state_of))
        if any(not isinstance(answer, tuple) or answer[0] != "parallel state in place" for answer in in_place):
            # A rank is at another collective: the ranks are out of step, and no later case would
            # be true. The worker ends, and tally starts another.
            print(f"tally's megatron-core worker: ranks out of step at the parallel state's check ({in_place})",
                  file=sys.stderr, flush=True)
            os._exit(3)
        if all(answer[1] for answer in in_place):
            return
        # Every rank destroys what it has (nothing, after a case that raised) and makes it anew,
        # so the ranks make their groups at the same point.
        self.parallel_state_of = None
        threads_before = threads_of_this_process()
        destroy_parallel_state()
        if dist.get_rank() == 0:
            # What the old groups gave back: the log shows a layout change that keeps threads.
            print(f"parallel state anew: rank 0's threads {threads_before} before the old groups were destroyed, "
                  f"{threads_of_this_process()} after ({thread_names_of_this_process()})", file=sys.stderr, flush=True)
        ps.initialize_model_parallel(**arguments)
        self.parallel_state_of = arguments

    def build(self, run):
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        self.use_parallel_state(run.case["topology"])
        model_parallel_cuda_manual_seed(1234)
        run.chunks = build_model(run.case, transformer_config(run.case))
        run.optimizer = build_optimizer(run.case, run.chunks)

    def set_gradients(self, run):
        run.before_reduction = reduction.before_reduction(run.case)
        if not run.before_reduction:
            return set_gradients(run.chunks, run.tensors)
        return set_gradients(run.chunks, run.tensors, share_of=reduction.Contributions(run).of)

    def norm_step(self, run):
        optimizer = run.optimizer
        run.held = {}
        if run.before_reduction:
            reduction.reduce(run.chunks)
            run.held = reduction.held_after_reduction(run.chunks)
        optimizer.prepare_grads()
        run.norm = optimizer.get_grad_norm()
        run.zeros = optimizer.count_zeros()
        # megatron-core 0.19's separate grad-norm groups (MTP with detached heads), as its step
        # computes them to clip each group by its own norm.
        run.group_norms = optimizer._compute_grad_norms_by_group() if run.case["model"]["mtp_detach_heads"] else None

    def manifest(self, run):
        clipping = run.case["statistics"]["max_norm"] > 0
        return tally_megatron.build_manifest(
            run.optimizer,
            run.chunks,
            producer=self.producer(),
            grad_norm=run.norm,
            num_zeros=run.zeros,
            group_norms=run.group_norms,
            held=run.held,
            clip=functools.partial(tally_megatron.release_clip, run.optimizer) if clipping else None,
        )

    def release(self, run, failed):
        import torch

        if failed:
            self.parallel_state_of = None  # no state a failed case leaves is reused: the next case makes it anew
        run.optimizer = run.chunks = None
        self.cases_since_collection += 1
        if self.cases_since_collection >= CASES_PER_COLLECTION:
            collect_everything()
            self.cases_since_collection = 0
        # The ranks share the GPU, but a case's models take megabytes: a rank keeps its cache up
        # to CUDA_CACHE_KEPT_BYTES, so the next case allocates without cudaMalloc.
        if torch.cuda.memory_reserved() > CUDA_CACHE_KEPT_BYTES:
            torch.cuda.empty_cache()


def main(argv=None):
    return base.run(MegatronCoreWorker, argv)


if __name__ == "__main__":
    sys.exit(main())
