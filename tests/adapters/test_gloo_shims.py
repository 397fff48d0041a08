"""tally_adapters.gloo_shims against torch's own collectives on gloo, two ranks on this CPU: a
PREMUL_SUM(f) reduce-scatter or all-reduce gives what gloo's SUM of each rank's input times f gives,
bit for bit; every other op gives exactly torch's result; the inputs a caller passes are left as
they were (all_reduce's in-place tensor aside); torch's functions are back after the block. A
coalesced block run one collective at a time gives what gloo's coalesced ops give on CPU tensors
(which gloo has there), bit for bit. Needs torch (skipped without it); ci/real-torchtitan and
ci/real-automodel run it in their environments."""

import importlib.util
import unittest

import gloo_ranks

WORLD = gloo_ranks.WORLD


def _inputs(rank):
    """Each rank's input: distinct values whose sums and halves are exact in fp32."""
    import torch

    base = torch.arange(8, dtype=torch.float32) * 0.25 + 1.0
    return base * (rank + 1) - rank * 0.5


def _checks(rank):
    import torch
    import torch.distributed as dist
    from tally_adapters import gloo_shims
    from torch.distributed import ReduceOp

    has_single = hasattr(dist, "reduce_scatter_single")  # torch 2.12 and later
    originals = (dist.reduce_scatter_tensor, getattr(dist, "reduce_scatter_single", None), dist.all_reduce)
    x = _inputs(rank)
    for factor in (1.0, 0.5, 0.125):
        # torch's own: gloo's SUM over each rank's input times the factor.
        want_scatter = torch.empty(8 // WORLD)
        dist.reduce_scatter_tensor(want_scatter, x * factor, op=ReduceOp.SUM)
        want_all = x * factor
        dist.all_reduce(want_all, op=ReduceOp.SUM)
        with gloo_shims.installed():
            got = torch.empty(8 // WORLD)
            given = x.clone()
            dist.reduce_scatter_tensor(got, given, op=ReduceOp.PREMUL_SUM(factor))
            assert torch.equal(got, want_scatter), (factor, got, want_scatter)
            assert torch.equal(given, x), "the caller's input is left as it was"
            if has_single:
                got = torch.empty(8 // WORLD)
                dist.reduce_scatter_single(output=got, input=given, op=ReduceOp.PREMUL_SUM(factor),
                                           async_op=True).wait()
                assert torch.equal(got, want_scatter), (factor, got, want_scatter)
            in_place = x.clone()
            dist.all_reduce(in_place, ReduceOp.PREMUL_SUM(factor))
            assert torch.equal(in_place, want_all), (factor, in_place, want_all)
            # Every other op is torch's, untouched.
            summed, want = torch.empty(8 // WORLD), torch.empty(8 // WORLD)
            dist.reduce_scatter_tensor(summed, x, op=ReduceOp.SUM)
            originals[0](want, x, op=ReduceOp.SUM)
            assert torch.equal(summed, want)
            largest = x.clone()
            dist.all_reduce(largest, op=ReduceOp.MAX)
            assert torch.equal(largest, _inputs(WORLD - 1)), largest
    assert (dist.reduce_scatter_tensor, getattr(dist, "reduce_scatter_single", None), dist.all_reduce) == originals


def _coalesced_checks(rank):
    import sys
    import types

    import torch
    import torch.distributed as dist
    from tally_adapters import gloo_shims
    from torch.distributed import distributed_c10d as c10d

    original = c10d._coalescing_manager
    framework = types.ModuleType("tally_test_framework")  # a module that imported it by name
    framework._coalescing_manager = original
    sys.modules[framework.__name__] = framework
    buckets = [_inputs(rank), _inputs(rank)[:6] * 3 + 0.5]

    def reduced(manager, collective, one_by_one):
        tensors = [b.clone() for b in buckets]
        outputs = [torch.empty(len(t) // WORLD) for t in tensors]
        with manager(dist.group.WORLD):
            for t, out in zip(tensors, outputs):
                if collective == "all_reduce":
                    dist.all_reduce(t)
                else:
                    dist.reduce_scatter_tensor(out, t)
                # Run as issued: nothing queued for a coalesced op (gloo's own manager queues it).
                assert (not c10d._world.pg_coalesce_state.get(dist.group.WORLD)) == one_by_one
        return tensors if collective == "all_reduce" else outputs

    try:
        for collective in ("all_reduce", "reduce_scatter_tensor"):
            want = reduced(original, collective, False)  # gloo's own coalesced op (it has it for CPU tensors)
            with gloo_shims.coalesced_one_by_one():
                assert framework._coalescing_manager is not original, "a module that imported it by name"
                assert dist._coalescing_manager is c10d._coalescing_manager is framework._coalescing_manager
                got = reduced(framework._coalescing_manager, collective, True)
                try:
                    with c10d._coalescing_manager(dist.group.WORLD, async_ops=True):
                        pass
                    raise AssertionError("an async block must be refused")
                except RuntimeError as error:
                    assert "not shimmed" in str(error), error
            for g, w in zip(got, want):
                assert torch.equal(g, w), (collective, g, w)
        assert framework._coalescing_manager is original and c10d._coalescing_manager is original
        assert dist._coalescing_manager is original
    finally:
        del sys.modules[framework.__name__]


@unittest.skipUnless(importlib.util.find_spec("torch"), "needs torch")
class TwoRanksOnGloo(unittest.TestCase):
    def test_a_coalesced_block_run_one_by_one_is_gloos_coalesced_op(self):
        gloo_ranks.assert_every_rank_passes(self, _coalesced_checks)

    def test_premul_sum_is_gloos_sum_of_the_scaled_inputs(self):
        from tally_adapters import gloo_shims

        if not gloo_shims.premul_sum_readable():
            self.skipTest(f"torch {gloo_shims.torch_version()} keeps a PREMUL_SUM's factor out of Python's reach")
        gloo_ranks.assert_every_rank_passes(self, _checks)


if __name__ == "__main__":
    unittest.main()
