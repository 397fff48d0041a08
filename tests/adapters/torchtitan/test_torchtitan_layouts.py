"""The torchtitan worker's Layouts on two gloo ranks with torchtitan's own ParallelDims: a layout
run again reuses its meshes while the ranks' threads allow, and past them the least recently used
layout's groups are destroyed and that layout is built anew when it
comes again."""

import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gloo_ranks import assert_every_rank_passes  # noqa: E402


def _parallelism(dp_shard, tp):
    return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": dp_shard,
            "context_parallel_degree": 1, "tensor_parallel_degree": tp, "pipeline_parallel_degree": 1,
            "expert_parallel_degree": 1, "spmd_backend": "full_dtensor"}


def _layouts(most_threads):
    import torchtitan.distributed.parallel_dims as parallel_dims
    from tally_adapters.torchtitan.worker import Layouts

    parallel_dims.device_type = "cpu"  # as the worker's start sets it without GPUs
    return Layouts(most_threads=most_threads)


def _kept_while_the_threads_allow(rank):
    from tally_adapters.worker import destroy_groups_but_the_world

    layouts = _layouts(most_threads=10**6)
    fsdp = layouts.parallel_dims(_parallelism(2, 1), 2)
    layouts.parallel_dims(_parallelism(1, 2), 2)
    assert layouts.parallel_dims(_parallelism(2, 1), 2) is fsdp, "not reused"
    assert len(layouts.dims) == 2
    destroy_groups_but_the_world()


def _least_recent_destroyed_past_them(rank):
    import torch.distributed as dist
    from tally_adapters.worker import groups_but_the_world

    layouts = _layouts(most_threads=1)  # every rank is past it: only the current layout is kept
    fsdp = layouts.parallel_dims(_parallelism(2, 1), 2)
    fsdp_groups = groups_but_the_world()
    assert fsdp_groups, "the FSDP layout's meshes made no group of their own"
    layouts.parallel_dims(_parallelism(1, 2), 2)
    assert len(layouts.dims) == 1, list(layouts.dims)
    assert not any(g in dist.distributed_c10d._world.pg_map for g in fsdp_groups)
    fsdp_count = [None] * len(fsdp_groups)
    del fsdp_groups
    again = layouts.parallel_dims(_parallelism(2, 1), 2)
    assert again is not fsdp, "reused"
    assert len(layouts.dims) == 1, list(layouts.dims)
    # The FSDP layout's groups, made again, and no more: the TP layout's were destroyed (torch 2.15's
    # gloo starts a group's threads at its first collective, so groups are counted, not threads).
    assert len(groups_but_the_world()) == len(fsdp_count), (len(groups_but_the_world()), len(fsdp_count))


def _both(rank):
    _kept_while_the_threads_allow(rank)
    _least_recent_destroyed_past_them(rank)


# torchtitan.distributed: this folder is a namespace package named torchtitan on the tests' path
@unittest.skipUnless(importlib.util.find_spec("torch") and importlib.util.find_spec("torchtitan.distributed"),
                     "needs torch and torchtitan")
class Layouts(unittest.TestCase):
    def test_layouts_are_reused_while_the_threads_allow_and_the_least_recent_destroyed_past_them(self):
        # One pair of ranks for both (each start imports torchtitan on every rank).
        assert_every_rank_passes(self, _both)


if __name__ == "__main__":
    unittest.main()
