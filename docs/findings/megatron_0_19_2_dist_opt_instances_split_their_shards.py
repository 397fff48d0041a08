#!/usr/bin/env python3
"""Standalone reproducer: with several distributed-optimizer instances, megatron-core 0.19.2 builds
each instance's grad-stats group from the expert grid's model-parallel groups, while the dense
distributed optimizer shards its buffers over contiguous slices of each DP-CP group
(docs/findings/megatron-core-0.19.2-dist-opt-instances-split-their-shards.md). In a rank order
outside Megatron-LM's two the two sets of ranks differ: a stats group then holds some dense shards
of two instances and none of others, so the norm counts those twice and these not at all, and
the stats groups report different norms.

Needs only torch and megatron-core (with numpy and packaging, its requirements). Runs on CPUs
(gloo), 8 ranks:

    python3 -m torch.distributed.run --standalone --nproc-per-node 8 \\
        megatron_0_19_2_dist_opt_instances_split_their_shards.py [--order tp-cp-dp-ep-pp] [--ep 2] [--etp 1] [--instances 2]

Every rank builds megatron-core's parallel state and reads two groups from it: the dense
optimizer's data-parallel group (`get_data_parallel_group(with_context_parallel=True,
partial_data_parallel=True)`, the group DistributedOptimizer shards over and DDP reduce-scatters
over) and the grad-stats group the optimizer's norm is all-reduced over
(`get_intra_distributed_optimizer_instance_group()`, set as `grad_stats_parallel_group` by
`get_megatron_optimizer`, optimizer/__init__.py:678). It then takes the norm as
`get_grad_norm_fp32` does (clip_grads.py:109-134: the squares of what this rank owns, summed over
the grad-stats group) of one dense buffer of 16 elements whose gradients are 1, 2, ..., 16, each
rank owning the contiguous 1/DP of it at its index in its data-parallel group, as
DistributedOptimizer's ranges split a bucket (distrib_optimizer.py `_build_model_gbuf_range`).
The norm a full run of the optimizer reports is in the write-up (measured on one H200).
Prints one line per rank and DEFECT SHOWN (exit 1) or DEFECT ABSENT (exit 0).
"""

import argparse
import sys

import torch
import torch.distributed as dist

ELEMENTS = 16


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--order", default="tp-cp-dp-ep-pp", help="initialize_model_parallel's rank order")
    p.add_argument("--ep", type=int, default=2, help="expert-model-parallel size")
    p.add_argument("--etp", type=int, default=1, help="expert-tensor-parallel size")
    p.add_argument("--instances", type=int, default=2, help="num_distributed_optimizer_instances")
    args = p.parse_args()

    dist.init_process_group("gloo")
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(
        tensor_model_parallel_size=1,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=args.etp,
        num_distributed_optimizer_instances=args.instances,
        order=args.order,
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    shards_group = ps.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)
    stats_group = ps.get_intra_distributed_optimizer_instance_group()
    shards = dist.get_process_group_ranks(shards_group)
    stats = dist.get_process_group_ranks(stats_group)

    gradients = torch.arange(1, ELEMENTS + 1, dtype=torch.float64)
    share = ELEMENTS // len(shards)
    mine = gradients[shards.index(rank) * share:(shards.index(rank) + 1) * share]
    squares = (mine * mine).sum().reshape(1)
    dist.all_reduce(squares, group=stats_group)
    truth = float((gradients * gradients).sum())

    # TP 1 and PP 1: an instance's grad-stats group must be exactly the ranks its shards are split over.
    ok = float(squares) == truth and sorted(stats) == sorted(shards)
    print(f"rank {rank}: order {args.order}, {args.instances} instances: the dense optimizer shards over "
          f"{shards}, its norm is reduced over {stats}: squared norm {float(squares)}, every element "
          f"counted once gives {truth}: {'ok' if ok else 'MISCOUNTED'}", flush=True)

    verdicts = [None] * world
    dist.all_gather_object(verdicts, ok)
    shown = not all(verdicts)
    if rank == 0:
        if shown:
            print("DEFECT SHOWN: the grad-stats groups of the distributed-optimizer instances do not hold "
                  "the ranks their dense shards are split over", flush=True)
        else:
            print("DEFECT ABSENT: each grad-stats group holds every dense shard of one instance once",
                  flush=True)
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return 1 if shown else 0


if __name__ == "__main__":
    sys.exit(main())
