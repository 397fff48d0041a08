"""tally_adapters.fsdp2 on torch's own FSDP2, two ranks on this CPU over gloo: each rank's
contribution, left by the backward under FSDP2's hooks, is reduced by FSDP2 itself (its sum, or its
average where no divide factor is set), every param once (a tied one too), nested units included;
another wrapper's forward hook is set aside for the backward and back after it. Needs torch (skipped
without it); ci/real-torchtitan runs it in the torchtitan environment."""

import importlib.util
import unittest

import gloo_ranks


def _model():
    """Three linear layers, the second nested in its own FSDP2 unit, the third sharing the first's
    weight (a tied param stays in one FSDP2 group)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4)), nn.Linear(4, 4))
    model[2].weight = model[0].weight  # tied
    return model


def _checks(rank):
    import numpy as np
    import torch
    from tally_adapters import dtensor as tally_dtensor
    from tally_adapters import fsdp2, gloo_shims
    from torch.distributed.fsdp import fully_shard

    # A divide factor makes FSDP2 reduce with PREMUL_SUM, which gloo runs through the shim only
    # where torch lets it read the factor (torch 2.12 and later).
    for divide_factor in (None, 1.0) if gloo_shims.premul_sum_readable() else (None,):
        model = _model()
        names = [n for n, _ in model.named_parameters()]
        assert names == ["0.weight", "0.bias", "1.0.weight", "1.0.bias", "2.bias"], names
        fully_shard(model[1])
        fully_shard(model)
        if divide_factor is not None:
            for m in model.modules():
                if hasattr(m, "set_gradient_divide_factor"):
                    m.set_gradient_divide_factor(divide_factor)
        calls = []
        handle = model[1].register_forward_pre_hook(lambda module, args, calls=calls: calls.append(args))
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        # Rank r gives (r + 1) * base: the sum over ranks is 3 * base, the average 1.5 * base.
        base = {n: np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) + 1 for n, s in shapes.items()}
        shares = {n: v * (rank + 1) for n, v in base.items()}
        with gloo_shims.installed():
            fsdp2.backward_through_fsdp2(model, fsdp2.local_term(shares, torch.device("cpu")))
        scale = 3.0 if divide_factor == 1.0 else 1.5
        for name, p in model.named_parameters():
            offsets, extents = tally_dtensor.local_box(p)
            want = (base[name] * scale)[tuple(slice(o, o + e) for o, e in zip(offsets, extents))]
            got = tally_dtensor.local_values(p.grad)
            assert np.array_equal(got, want.reshape(-1)), (divide_factor, name, got, want)
        assert calls == [], "another wrapper's forward hook is set aside for the backward"
        model[1](torch.ones(2, 4))
        assert len(calls) == 1, "and is back after it"
        handle.remove()
        assert "forward" not in model.__dict__ and "forward" not in model[1].__dict__


@unittest.skipUnless(importlib.util.find_spec("torch"), "needs torch")
class TwoRanksOnGloo(unittest.TestCase):
    def test_fsdp2_reduces_each_ranks_contribution(self):
        gloo_ranks.assert_every_rank_passes(self, _checks)


if __name__ == "__main__":
    unittest.main()
