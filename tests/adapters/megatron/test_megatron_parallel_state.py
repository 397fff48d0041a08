"""The megatron-core worker keeps Megatron's parallel state across cases of one topology
(adapters/tally_adapters/megatron/worker.py: use_parallel_state), with stand-ins for
torch.distributed and megatron.core.parallel_state: no torch, no Megatron, no GPU."""

import sys
import types
import unittest
from unittest import mock

from fakes import FakeDistributed, modules_with
from tally_adapters.megatron import worker as megatron_worker


class FakeParallelState(types.ModuleType):
    def __init__(self):
        super().__init__("megatron.core.parallel_state")
        self.calls = []

    def initialize_model_parallel(self, **arguments):
        self.calls.append(("initialize", arguments["tensor_model_parallel_size"]))

    def destroy_model_parallel(self):
        self.calls.append(("destroy",))


def worker_with(peers_answer, world=2):
    dist = FakeDistributed(world, peers_answer)
    megatron = types.ModuleType("megatron")
    core = types.ModuleType("megatron.core")
    ps = FakeParallelState()
    megatron.core = core
    core.parallel_state = ps
    modules = modules_with(dist, **{"megatron": megatron, "megatron.core": core, "megatron.core.parallel_state": ps})
    return megatron_worker.MegatronCoreWorker("gloo", 1, world), ps, modules


def torch_of(modules):
    return modules["torch.distributed"]


def topology(tp):
    """A topology as the request carries it: every field written."""
    return {"world": 2, "tp": tp, "cp": 1, "pp": 1, "ep": 1, "etp": tp, "vpp": 1, "order": "tp-cp-ep-dp-pp",
            "dist_opt_instances": 1}


TP2 = topology(2)
TP1 = topology(1)


class ParallelStateTest(unittest.TestCase):
    def test_kept_while_every_rank_holds_the_topologys(self):
        worker, ps, modules = worker_with(lambda mine: mine)  # the peers answer as this rank does
        with mock.patch.dict(sys.modules, modules):
            worker.use_parallel_state(TP2)
            worker.use_parallel_state(TP2)
            worker.use_parallel_state(TP1)
        self.assertEqual(ps.calls, [("destroy",), ("initialize", 2), ("destroy",), ("initialize", 1)])

    def test_a_layout_change_destroys_every_group_torch_holds_but_the_world(self):
        # A gloo group keeps its threads until destroyed and unreferenced; a sweep's workers
        # ran out of threads when a case's own groups outlived its layout.
        worker, ps, modules = worker_with(lambda mine: mine)
        dist = torch_of(modules)
        with mock.patch.dict(sys.modules, modules):
            worker.use_parallel_state(TP2)
        self.assertEqual(len(dist.destroyed), 1)
        self.assertIs(dist.destroyed[0], dist.case_group)

    def test_made_anew_when_a_rank_holds_none(self):
        # The peer's last case raised: it holds no state, so every rank makes it anew.
        worker, ps, modules = worker_with(lambda mine: ("parallel state in place", False))
        with mock.patch.dict(sys.modules, modules):
            worker.use_parallel_state(TP2)
            worker.use_parallel_state(TP2)
        self.assertEqual(ps.calls, [("destroy",), ("initialize", 2), ("destroy",), ("initialize", 2)])

    def test_the_worker_ends_when_the_ranks_are_out_of_step(self):
        # The peer is at the queue's result gather, not this check.
        worker, ps, modules = worker_with(lambda mine: ("error", "a message"))
        with mock.patch.dict(sys.modules, modules), mock.patch("os._exit", side_effect=SystemExit(3)) as ended:
            with self.assertRaises(SystemExit):
                worker.use_parallel_state(TP2)
        ended.assert_called_once_with(3)
        self.assertEqual(ps.calls, [])


if __name__ == "__main__":
    unittest.main()
