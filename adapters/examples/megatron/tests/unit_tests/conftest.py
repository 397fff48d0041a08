"""The process group of a distributed pytest run, set up as Megatron's own unit tests do
(tests/unit_tests/test_utilities.py's Utils): torchrun starts pytest on every rank, each takes its
GPU, and the first test that needs torch.distributed finds it up. `--backend gloo` lets several
ranks share one GPU (NCCL refuses two ranks of one communicator on one GPU)."""

import os
import sys

import pytest

# tiny_moe_gpt.py, the example's model and optimizer, lives two folders up.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def pytest_addoption(parser):
    parser.addoption("--backend", choices=["nccl", "gloo"], default="nccl", help="torch.distributed backend")


@pytest.fixture(scope="session")
def distributed(request):
    if "WORLD_SIZE" not in os.environ:
        pytest.skip("a distributed test: run pytest under torchrun (torchrun --nproc-per-node 2 -m pytest ...)")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("megatron-core builds its models on a CUDA device")
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(request.config.getoption("--backend"))
    yield dist
    dist.barrier()
    dist.destroy_process_group()
