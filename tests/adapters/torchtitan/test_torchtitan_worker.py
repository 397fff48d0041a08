"""Unit tests of the torchtitan worker's tables and the DTensor manifest writer's rules that need no
torch: the plant table answers the catalog, placements map to how DTensor reduces. The worker
itself runs on torchtitan in ci/real-torchtitan."""

import importlib.util
import unittest

import fault_catalog
import tally_adapters.dtensor as tally_dtensor
import tally_adapters.torchtitan.plants as torchtitan_plants
import tally_adapters.torchtitan.worker as torchtitan_worker
from tally_adapters.plants import FSDP2_DIVIDE_FACTORS


class Placement:
    def __init__(self, kind):
        self.kind = kind

    def is_replicate(self):
        return self.kind == "R"

    def is_partial(self):
        return self.kind == "P"


class PlantTable(unittest.TestCase):
    def test_every_catalog_fault_is_planted_or_has_a_reason(self):
        fault_catalog.assert_plants_answer_the_catalog(self, torchtitan_plants.PLANTS, torchtitan_plants.NOT_PLANTED)

    def test_every_plant_replaces_a_function_of_torchtitans_clip_or_fsdp2s_divide_rule(self):
        for fault, (targets, how) in torchtitan_plants.PLANTS.items():
            self.assertTrue(how, fault)
            for where, attr, make in targets:
                if fault.startswith("grads-"):  # the reduction, before which the gradients may enter
                    self.assertEqual((where, attr), FSDP2_DIVIDE_FACTORS, fault)
                else:
                    self.assertEqual(where, "torchtitan.distributed.utils", fault)
                    self.assertIn(attr, ("clip_grad_norm_", "_clip_grad_norm_with_ep"), fault)
                self.assertTrue(callable(make(lambda *args: None)), fault)


class Placements(unittest.TestCase):
    def test_a_strided_shard_is_a_shard_a_partial_sum_is_neither(self):
        self.assertEqual(tally_dtensor.placement_kind(Placement("R")), "R")
        self.assertEqual(tally_dtensor.placement_kind(Placement("S")), "S")
        self.assertEqual(tally_dtensor.placement_kind(Placement("P")), "P")

    @unittest.skipUnless(importlib.util.find_spec("numpy"), "the statistics are numpy's")
    def test_the_statistics_are_of_the_values(self):
        self.assertEqual(tally_dtensor.stats([3.0, 0.0, -4.0]), {"sum_squares": 25.0, "abs_max": 4.0, "zeros": 1})
        self.assertEqual(tally_dtensor.stats([]), {"sum_squares": 0.0, "abs_max": 0.0, "zeros": 0})


class Mesh:
    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def get_local_rank(self):
        return self._rank


class Dims:
    """torchtitan's ParallelDims as the worker reads it: no mesh for an axis of size 1."""

    def __init__(self, **meshes):
        self.meshes = meshes

    def get_optional_mesh(self, axis):
        return self.meshes.get(axis)


class GroupPosition(unittest.TestCase):
    """Each rank of a reduction group takes the share at its own position: a bijection onto 0..N-1."""

    def test_positions_read_row_major_over_the_axes(self):
        seen = set()
        for r in range(2):
            for e in range(3):
                at, size = torchtitan_worker.group_position(Dims(dp_replicate=Mesh(2, r), efsdp=Mesh(3, e)),
                                                            ["dp_replicate", "efsdp"])
                self.assertEqual(size, 6)
                seen.add(at)
        self.assertEqual(seen, set(range(6)))

    def test_an_axis_of_size_one_adds_nothing(self):
        self.assertEqual(torchtitan_worker.group_position(Dims(efsdp=Mesh(4, 3)), ["dp_replicate", "efsdp"]), (3, 4))
        self.assertEqual(torchtitan_worker.group_position(Dims(), ["loss"]), (0, 1))


if __name__ == "__main__":
    unittest.main()
