#!/usr/bin/env python3
"""Standalone reproducer: with several distributed-optimizer instances, megatron-core 0.19.2's own
DistributedDataParallel reduces the dense gradients over the wrong ranks in a rank order outside
Megatron-LM's two. Each instance reduce-scatters a dense bucket over its slice of the DP-CP group
and then all-reduces its shard with the other instances over
`get_inter_distributed_optimizer_instance_group()` (param_and_grad_buffer.py:729-755), which is
built from the expert grid (parallel_state.py:1481-1496, 2457-2467) and handed to the dense bucket
groups too (distributed_data_parallel.py:292-301). In `tp-cp-dp-ep-pp` with EP 2 that group is
[0, 2], [1, 3], [4, 6], [5, 7] where [0, 4], [1, 5], [2, 6], [3, 7] are needed: shard 0 is added
to shard 2 of the same instance, and neither instance's dense update sees the other's data (so
too `cp-ep-dp-tp-pp` with ETP 2, EP 1). The expert buffers, split over the expert grid's own
slices, come out right. (docs/findings/megatron-core-0.19.2-dist-opt-instances-split-their-shards.md:
the same groups miscount the norm.)

Needs torch, megatron-core 0.19.2 (numpy, packaging) and einops (instances > 1), and a GPU:
DDP keeps its buffers on CUDA (param_and_grad_buffer.py:1177-1188) and makes a CUDA stream for
the instances (distributed_data_parallel.py:297). One GPU serves all 8 ranks with gloo:

    torchrun --standalone --nproc-per-node 8 \\
        megatron_0_19_2_dist_opt_instances_split_their_gradients.py [--order tp-cp-dp-ep-pp] \\
        [--tp 1] [--ep 2] [--etp 1] [--instances 2] [--backend gloo]

The model is one dense fp32 param and one expert param (`allreduce = False`, as
ColumnParallelLinear marks expert weights, tensor_parallel/layers.py:1017), 128 elements each, so
each buffer is one bucket of exactly that param (no padding: param_layout.py:24-42), wrapped in
megatron's DDP for the distributed optimizer (fp32 grads, overlap off). Rank r sets element i of
both params' `main_grad` to 2**r * (i + 1) (small integers: every sum below is exact in fp32),
then calls DDP's `finish_grad_sync()`. On gloo, whose coalesced all-reduce takes no CUDA tensors,
the script lets each collective DDP issues inside torch's `_coalescing_manager` run by itself
(same ops, tensors and groups). With `average_in_collective` off DDP scales every gradient
by 1 / |DP-CP| before reducing (distributed_data_parallel.py:209-213), so the shard a rank owns
must hold, per element, the mean over its whole DP-CP group of the contributions (dense), or the
sum over its whole expert-DP group divided by |DP-CP| (expert). Every rank checks its shard of
both buffers and prints one line (gathered, printed by rank 0 in rank order); rank 0 prints
DEFECT SHOWN (exit 1) when any dense or expert shard is wrong, else DEFECT ABSENT (exit 0).
"""

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist

ELEMENTS = 128  # one bucket, unpadded: lcm(shard count, 128) divides it


@contextlib.contextmanager
def one_collective_at_a_time(group=None, device=None, async_ops=False):
    """Stands in for torch's `_coalescing_manager` on gloo, whose coalesced all-reduce takes CPU tensors
    only: each collective DDP issues inside runs by itself, synchronously (DDP's ops are synchronous
    here: overlap off, param_and_grad_buffer.py:676-679), on DDP's own tensors and groups."""
    assert not async_ops
    yield None


def contributions(rank):
    return (2.0 ** rank) * torch.arange(1, ELEMENTS + 1, dtype=torch.float64)


def check(name, param, buffers, intra, whole, inter, divisor):
    """This rank's shard of `param`'s reduced gradient against the contributions of `whole`."""
    assert len(buffers) == 1 and len(buffers[0].buckets) == 1, "expected one buffer of one bucket"
    bucket = buffers[0].buckets[0]
    assert bucket.grad_data.numel() == ELEMENTS and param.main_grad.data_ptr() == bucket.grad_data.data_ptr()
    share, index = ELEMENTS // intra.size(), intra.rank()
    lo, hi = index * share, (index + 1) * share
    got = param.main_grad.detach().view(-1)[lo:hi].double().cpu()
    whole_ranks = dist.get_process_group_ranks(whole)
    want = (sum(contributions(r) for r in whole_ranks) / divisor)[lo:hi]
    wrong = int((~torch.isclose(got, want, rtol=1e-6, atol=0.0)).sum())
    line = (f"{name} shard {index} of {dist.get_process_group_ranks(intra)} (elements {lo}-{hi - 1}), "
            f"then all-reduced over {dist.get_process_group_ranks(inter)}: element {lo} = {float(got[0])}, "
            f"expected from {whole_ranks}: {float(want[0])}: "
            + ("ok" if wrong == 0 else f"WRONG ({wrong} of {share} elements)"))
    return wrong == 0, line


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--order", default="tp-cp-dp-ep-pp", help="initialize_model_parallel's rank order")
    p.add_argument("--tp", type=int, default=1, help="tensor-model-parallel size")
    p.add_argument("--ep", type=int, default=2, help="expert-model-parallel size")
    p.add_argument("--etp", type=int, default=1, help="expert-tensor-parallel size")
    p.add_argument("--instances", type=int, default=2, help="num_distributed_optimizer_instances")
    p.add_argument("--backend", default="gloo", help="gloo (any number of ranks per GPU) or nccl")
    args = p.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if not torch.cuda.is_available():
        if rank == 0:
            print("megatron-core's DDP keeps its gradient buffers on CUDA: this needs a GPU", flush=True)
        dist.destroy_process_group()
        return 2
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())

    from megatron.core import parallel_state as ps
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=args.etp,
        num_distributed_optimizer_instances=args.instances,
        order=args.order,
        create_gloo_process_groups=False,
    )
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)

    class TwoParams(MegatronModule):
        def __init__(self):
            super().__init__(config)
            self.dense = torch.nn.Parameter(torch.zeros(ELEMENTS, device="cuda"))
            self.expert = torch.nn.Parameter(torch.zeros(ELEMENTS, device="cuda"))
            self.expert.allreduce = False  # the expert-data-parallel buffers

    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True,
        overlap_grad_reduce=False,
        grad_reduce_in_fp32=True,
        num_distributed_optimizer_instances=args.instances,
    )
    module = TwoParams()
    intra_dp = ps.get_data_parallel_group(with_context_parallel=True, with_gtp_remat=False, partial_data_parallel=True)
    intra_edp = ps.get_expert_data_parallel_group(with_gtp_remat=False, partial_expert_data_parallel=True)
    layout = DistributedOptimizer.compute_full_param_layout(  # as DDP would, distributed_data_parallel.py:143-149
        list(module.parameters()), None, intra_dp.size(), ddp_config, expert_data_parallel_world_size=intra_edp.size())
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=module, full_param_layout=layout)
    model.zero_grad_buffer()
    if dist.get_backend() == "gloo":
        param_and_grad_buffer._coalescing_manager = one_collective_at_a_time
    for param in (module.dense, module.expert):
        param.main_grad.copy_(contributions(rank).float())  # what a backward pass accumulates
    model.finish_grad_sync()  # overlap off: reduce-scatter, then the inter-instance all-reduce
    torch.cuda.synchronize()

    dp_cp = ps.get_data_parallel_group(with_context_parallel=True, with_gtp_remat=False)
    inter = ps.get_inter_distributed_optimizer_instance_group()
    dense_ok, dense_line = check("dense", module.dense, model.buffers, intra_dp, dp_cp, inter, dp_cp.size())
    expert_ok, expert_line = check("expert", module.expert, model.expert_parallel_buffers, intra_edp,
                                   ps.get_expert_data_parallel_group(with_gtp_remat=False), inter, dp_cp.size())
    line = f"rank {rank}: order {args.order}, {args.instances} instances: {dense_line}; {expert_line}"

    results = [None] * world
    dist.all_gather_object(results, (dense_ok, expert_ok, line))
    dense_shown = not all(r[0] for r in results)
    expert_shown = not all(r[1] for r in results)
    if rank == 0:
        for _, _, text in results:
            print(text, flush=True)
        if dense_shown:
            print("DEFECT SHOWN: DDP's dense gradient shards are not reduced over the whole DP-CP group: the "
                  "inter-instance all-reduce, the expert grid's group, adds shards of the same instance; the "
                  f"expert shards are {'wrong too' if expert_shown else 'right'}", flush=True)
        elif expert_shown:
            print("DEFECT SHOWN: DDP's expert gradient shards are not reduced over the whole expert-DP group "
                  "(the dense shards are right)", flush=True)
        else:
            print("DEFECT ABSENT: every rank's dense and expert gradient shard is reduced over its whole "
                  "data-parallel group", flush=True)
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return 1 if (dense_shown or expert_shown) else 0


if __name__ == "__main__":
    sys.exit(main())
