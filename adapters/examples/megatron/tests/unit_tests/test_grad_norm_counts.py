"""An example of tally in megatron-core's own tests: each test builds a tiny MoE GPT
(tiny_moe_gpt.py: Megatron's local layer spec, SequentialMLP experts, DDP), sets gradients that
differ per logical element, and asks the `tally_grad_norm` fixture whether the optimizer's norm
counted every element exactly once.

    torchrun --nproc-per-node 2 -m pytest -q adapters/examples/megatron/tests/unit_tests \\
        --tally build/cli/tally [--backend gloo]

On megatron-core 0.19.2 the chained Adam passes. The layer-wise distributed optimizer does not
(0.16.1 and 0.19.2; docs/findings/megatron-core-0.19.2-layerwise-expert-bias.md): with TP 2 and
ETP 1 it drops the routed experts' FC2 biases on TP rank 1, and the test expects tally to name
them. 0.16.1's chained Adam drops the same biases too (its fp32 main copies lose the experts'
`allreduce=False`, Megatron-LM #6470, fixed by 0.19), and there the test expects that.
"""

import pytest
import tiny_moe_gpt
from tally_adapters.check import GradNormMiscount


def built(*flags):
    """The example's model and optimizer for `flags`, with hashed gradients, after prepare_grads."""
    args = tiny_moe_gpt.parse_args(list(flags) + ["--gradients", "hashed", "--out", "unused"])
    model = tiny_moe_gpt.build(args)
    optimizer = tiny_moe_gpt.build_optimizer(args, model)
    tiny_moe_gpt.set_gradients(model, args.gradients, args.seed)
    optimizer.prepare_grads()
    return model, optimizer


@pytest.fixture
def model_parallel(distributed):
    from megatron.core import parallel_state as ps

    yield
    ps.destroy_model_parallel()


def megatron_older_than(major, minor):
    from megatron.core import package_info

    release = tuple(int(part) for part in package_info.__version__.split(".")[:2])
    return release < (major, minor)


def test_chained_adam_counts_every_expert_bias_once(model_parallel, tally_grad_norm):
    model, optimizer = built("--tp", "2", "--ep", "2", "--etp", "1", "--optimizer", "adam")
    check = lambda: tally_grad_norm.megatron(optimizer, model, grad_norm=optimizer.get_grad_norm(),  # noqa: E731
                                             num_zeros=optimizer.count_zeros())
    if megatron_older_than(0, 19):  # Megatron-LM #6470: main copies lose allreduce=False
        with pytest.raises(GradNormMiscount, match="linear_fc2.bias"):
            check()
    else:
        check()


def test_layer_wise_muon_counts_every_expert_bias_once(model_parallel, tally_grad_norm):
    model, optimizer = built("--tp", "2", "--ep", "2", "--etp", "1", "--optimizer", "muon", "--layer-wise")
    with pytest.raises(GradNormMiscount, match="linear_fc2.bias"):
        tally_grad_norm.megatron(optimizer, model, grad_norm=optimizer.get_grad_norm(),
                                 num_zeros=optimizer.count_zeros())
