"""An example of tally in a framework's own tests: each test builds a tiny MoE GPT with
megatron-core, sets gradients that differ per logical element, and asks
`tally_megatron.check_grad_norm` whether the optimizer counted every element exactly once
(it raises GradNormMiscount with tally's diagnosis when not).

Runs under torchrun, with or without pytest (the functions are plain `test_*`):

    TALLY=build/cli/tally torchrun --nproc-per-node 2 \\
        adapters/megatron/examples/test_grad_norm_counts.py [--backend gloo]

With gloo both ranks may share one GPU. Exit 0 when every test passed.
"""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import tally_megatron  # noqa: E402
import tiny_moe_gpt  # noqa: E402

BACKEND = "gloo" if "--backend" in sys.argv and sys.argv[-1] == "gloo" else "nccl"
TALLY = os.environ.get("TALLY", "tally")


def _check(*flags):
    """Builds the driver's model and optimizer for `flags`, sets hashed gradients, and returns
    check_grad_norm's report (raising as it does)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    # Every rank needs the same folder: rank 0 names it.
    name = [tempfile.mkdtemp(prefix="tally-test-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(name, src=0)
    args = tiny_moe_gpt.parse_args(list(flags) + ["--gradients", "hashed", "--out", name[0]])
    try:
        model = tiny_moe_gpt.build(args)
        optimizer = tiny_moe_gpt.build_optimizer(args, model)
        tiny_moe_gpt.set_gradients(model, args.gradients, args.seed)
        optimizer.prepare_grads()
        return tally_megatron.check_grad_norm(
            optimizer, model, name[0], tally=TALLY,
            grad_norm=optimizer.get_grad_norm(), num_zeros=optimizer.count_zeros(),
        )
    finally:
        ps.destroy_model_parallel()


def test_chained_adam_counts_every_expert_bias_once():
    _check("--tp", "2", "--ep", "2", "--etp", "1", "--optimizer", "adam")


def test_layer_wise_muon_drops_the_expert_biases_on_tp_rank_1():
    # megatron-core 0.19.2 and 0.16.1 (docs/findings/megatron-core-0.19.2-layerwise-expert-bias.md)
    try:
        _check("--tp", "2", "--ep", "2", "--etp", "1", "--optimizer", "muon", "--layer-wise")
    except tally_megatron.GradNormMiscount as miscount:
        assert "linear_fc2.bias" in str(miscount), str(miscount)
        return
    raise AssertionError("expected GradNormMiscount: the layer-wise optimizer drops expert biases")


def main():
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(BACKEND)
    failed = 0
    for name, test in sorted(globals().items()):
        if not name.startswith("test_"):
            continue
        try:
            test()
            outcome = "ok"
        except Exception as error:  # noqa: BLE001 (a test's failure, reported and counted)
            failed += 1
            outcome = f"FAILED: {type(error).__name__}: {error}"
        if dist.get_rank() == 0:
            print(f"{name}: {outcome}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
