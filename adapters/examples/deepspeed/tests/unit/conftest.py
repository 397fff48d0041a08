"""The process group of a distributed pytest run, as a framework's suite sets it up: torchrun starts
pytest on every rank, and the first test to need it finds torch.distributed up (gloo on CPUs,
DeepSpeed's CPU accelerator where there is no GPU)."""

import os

import pytest


@pytest.fixture(scope="session")
def distributed():
    """torch.distributed over torchrun's ranks; skips where pytest was not started by torchrun."""
    if "WORLD_SIZE" not in os.environ:
        pytest.skip("a distributed test: run pytest under torchrun (torchrun --nproc-per-node 2 -m pytest ...)")
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    yield dist
    dist.barrier()
