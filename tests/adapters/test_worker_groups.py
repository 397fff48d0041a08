"""tally_adapters.worker.destroy_groups_but_the_world on two gloo ranks: a case's mesh that something
still holds (as torch's DTensor strategies hold a case's meshes) gives its groups' threads back, and
the next case's mesh is built and reduces as before."""

import importlib.util
import unittest

from gloo_ranks import assert_every_rank_passes


def _a_case_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))


def _groups_given_back(rank):
    import torch
    import torch.distributed as dist
    from tally_adapters.queue import threads_of_this_process
    from tally_adapters.worker import destroy_groups_but_the_world

    before = threads_of_this_process()
    kept = [_a_case_mesh()]  # held past the case
    made = [g for g in dist.distributed_c10d._world.pg_map if g is not dist.group.WORLD]
    assert made, "the mesh made no group of its own"
    assert threads_of_this_process() > before, "the mesh's gloo groups started no thread"
    del made
    assert destroy_groups_but_the_world() >= 1
    assert list(dist.distributed_c10d._world.pg_map) == [dist.group.WORLD]
    # The world stays (a mesh dim over every rank is the world's group); none destroyed is held.
    assert all(g is dist.group.WORLD for g in kept[0]._pg_registry.values()), kept[0]._pg_registry
    assert threads_of_this_process() == before, (before, threads_of_this_process())
    # The next case's mesh: its own groups, which reduce.
    mesh = _a_case_mesh()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total, group=mesh.get_group("dp"))
    assert total.item() == 3.0, total


@unittest.skipUnless(importlib.util.find_spec("torch"), "needs torch")
class DestroyGroupsButTheWorld(unittest.TestCase):
    def test_a_kept_mesh_gives_its_groups_threads_back_and_the_next_mesh_reduces(self):
        assert_every_rank_passes(self, _groups_given_back)


if __name__ == "__main__":
    unittest.main()
