"""The one order of a case (tally_adapters.worker.Worker.execute), on a stand-in framework and a
stand-in torch.distributed: no torch, no framework."""

import os
import sys
import tempfile
import unittest
from unittest import mock

from fakes import FakeDistributed, modules_with
from tally_adapters import worker as base
from tally_adapters.queue import FrameworkRefused


class StandInRequest:
    """A request as Worker.execute reads it (tally_adapters.queue.Request's fields): two logical
    params of two elements each, the manifests written into `folder`."""

    def __init__(self, folder, names):
        self.case = {"faults": [], "topology": {"world": 1}}
        self.faults = []
        self.manifests_dir = os.path.join(folder, "case-1")
        self.case_digest = "0123456789abcdef"
        self.names = names

    def gradient_index(self):
        return [{"name": n, "class": "replicated", "shape": [2], "offset": 2 * i, "stage": 0, "split_dim": None}
                for i, n in enumerate(self.names)]

    def gradients(self):
        return {n: [0.0, 0.0] for n in self.names}


class StandIn(base.Worker):
    """A framework whose steps say when they run; `holds` is what set_gradients says it holds."""

    framework = "stand-in"
    package = "standin"

    def __init__(self, world=1, holds=("a", "b"), fail_in=None):
        super().__init__("gloo", 0, world)
        self.holds, self.fail_in, self.steps = holds, fail_in, []

    def device(self):
        return "cpu"

    def step(self, name):
        self.steps.append(name)
        if self.fail_in == name:
            raise RuntimeError(f"the stand-in fails in {name}")

    def build(self, run):
        self.step("build")

    def set_gradients(self, run):
        self.step("set_gradients")
        if isinstance(self.holds, Exception):
            raise self.holds
        return list(self.holds)

    def norm_step(self, run):
        self.step("norm_step")
        run.norm = 2.0

    def manifest(self, run):
        self.step("manifest")
        return {"tally_manifest": 1, "producer": "stand-in", "rank": 0, "world": self.world, "parallel": {},
                "groups": {"world": list(range(self.world))}, "params": [], "optimizers": [],
                "reported": {"norm": run.norm, "inf_norm": None, "zeros": None}}

    def release(self, run, failed):
        self.steps.append(("release", failed))


def peer_holding(names, error=None):
    """Rank 1 of world 2, which holds `names` (or fails with `error`) and leads no group of its own."""
    return lambda mine: (error, list(names)) if isinstance(mine, tuple) else []


class Execute(unittest.TestCase):
    def run_case(self, worker, peers_answer=lambda mine: mine, names=("a", "b")):
        dist = FakeDistributed(worker.world, peers_answer)
        with tempfile.TemporaryDirectory() as folder, mock.patch.dict(sys.modules, modules_with(dist)):
            request = StandInRequest(folder, names)
            try:
                worker.execute(request)
            finally:
                self.written = sorted(os.listdir(request.manifests_dir)) if os.path.isdir(request.manifests_dir) else []
        return dist

    def test_the_steps_run_in_the_one_order_and_the_manifest_is_written(self):
        worker = StandIn()
        self.run_case(worker)
        self.assertEqual(worker.steps, ["build", "set_gradients", "norm_step", "manifest", ("release", False)])
        self.assertEqual(self.written, ["groups.json", "rank-0.json"])

    def test_release_runs_and_is_told_of_a_failure_in_any_step(self):
        for step in ("build", "set_gradients", "norm_step", "manifest"):
            with self.subTest(step=step):
                worker = StandIn(fail_in=step)
                with self.assertRaisesRegex(RuntimeError, f"fails in {step}"):
                    self.run_case(worker)
                self.assertEqual(worker.steps[-1], ("release", True))
                self.assertEqual(self.written, [])

    def test_a_logical_param_no_rank_holds_is_a_model_mismatch_on_every_rank(self):
        worker = StandIn(world=2, holds=("a",))
        with self.assertRaisesRegex(LookupError, r"no rank of stand-in's model holds \['b'\] \(1 of tally's params\)"):
            self.run_case(worker, peers_answer=peer_holding(["a"]))
        self.assertNotIn("norm_step", worker.steps)

    def test_a_param_held_by_another_rank_only_is_held(self):
        worker = StandIn(world=2, holds=("a",))
        self.run_case(worker, peers_answer=peer_holding(["b"]))
        self.assertIn("norm_step", worker.steps)

    def test_one_ranks_mismatch_is_every_ranks_after_the_check(self):
        # This rank's LookupError is sent in the check's collective, which every rank then raises.
        worker = StandIn(world=2, holds=LookupError("model mismatch: the stand-in holds c"))
        with self.assertRaisesRegex(LookupError, "rank 0: model mismatch: the stand-in holds c"):
            self.run_case(worker, peers_answer=peer_holding(["a", "b"]))
        self.assertNotIn("norm_step", worker.steps)

    def test_another_ranks_mismatch_stops_this_rank_too(self):
        worker = StandIn(world=2)
        with self.assertRaisesRegex(LookupError, "rank 1: model mismatch"):
            self.run_case(worker, peers_answer=peer_holding([], error="rank 1: model mismatch: it holds c"))
        self.assertNotIn("norm_step", worker.steps)

    def test_a_check_of_the_framework_in_build_is_a_refusal(self):
        worker = StandIn()

        def declines(run):  # raised in a module of the framework's package, as its own check
            exec(compile("raise ValueError('TP 3 does not divide 8 heads')", "standin/config.py", "exec"),
                 {"__name__": "standin.config"})

        worker.build = declines
        with self.assertRaisesRegex(FrameworkRefused, "TP 3 does not divide 8 heads"):
            self.run_case(worker)
        self.assertEqual(worker.steps, [("release", True)])


if __name__ == "__main__":
    unittest.main()
