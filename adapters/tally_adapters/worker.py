"""What every framework's worker shares: its command line, the device and torch.distributed
backend it runs on, its hello, the faults it plants, and the queue loop (tally_adapters.queue).

A framework's worker is a subclass of `Worker` that says what it is (`framework`, the faults it
plants and why it cannot plant the others) and fills in three methods: `framework_version`,
`start` (imports and set-up once the process group is up) and `execute` (one case). tally starts
it under torchrun, once per world size:

    torchrun --standalone --nproc-per-node WORLD -m tally_adapters.<framework>.worker \\
        --queue DIR --parent-pid PID [--backend auto|nccl|gloo]

and speaks the queue protocol of docs/real-targets.md with it.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import re
import sys
from typing import Dict, List, Optional, Tuple

from . import __version__
from .plants import Planted
from .queue import THREAD_BUDGET, Request, serve

# fault -> ([(where, attr, make)], how): what a worker replaces to plant a catalog fault (plants.py)
PlantTable = Dict[str, Tuple[List[Tuple[str, str, object]], str]]


class Worker:
    framework = ""  # as tally's --target names it: "megatron-core", "deepspeed"
    # The framework's module prefix: a planted function is replaced in every loaded module of it.
    package = ""
    plants: PlantTable = {}
    not_planted: Dict[str, str] = {}  # fault -> why the framework has no counterpart
    needs_gpu = False  # the framework builds its models on a CUDA device only

    def __init__(self, backend: str, devices: int, world: int):
        self.backend = backend
        self.devices = devices
        self.world = world

    # --- what a framework fills in ---------------------------------------------------------

    def framework_version(self) -> str:
        raise NotImplementedError

    def before_process_group(self) -> None:
        """Runs before torch.distributed starts (environment a framework reads at import)."""

    def start(self) -> None:
        """Runs once the default process group is up, before the hello: imports every module a
        planted fault replaces a function in (so none keeps a replacement past its case)."""

    def dtypes(self) -> Optional[List[str]]:
        """The gradient dtypes the framework computes in on this machine; None: every one."""
        return None

    def cannot_run(self) -> Dict[str, str]:
        """Case fields (docs/schemas/hello.schema.json names them) whose setting the framework
        cannot run on this machine, each with why; tally refuses such cases with that reason."""
        return {}

    def execute(self, request: Request) -> None:
        """Runs the case on this rank and writes its manifests to request.manifests_dir; raises
        when the framework refuses the case or the worker fails on it."""
        raise NotImplementedError

    # --- shared ----------------------------------------------------------------------------

    def planted(self, request: Request) -> Planted:
        """The case's faults planted in the framework for a `with` block."""
        return Planted(request.faults, self.plants, self.not_planted, self.package)

    def producer(self) -> str:
        return f"tally_adapters {__version__} / {self.framework} {self.framework_version()}"

    def hello(self) -> Dict[str, object]:
        hello: Dict[str, object] = {
            "framework": self.framework,
            "version": self.framework_version(),
            "world": self.world,
            "producer": self.producer(),
            "backend": self.backend,
            "devices": self.devices,
            "plants": {fault: how for fault, (_, how) in self.plants.items()},
            "cannot_plant": dict(self.not_planted),
        }
        dtypes = self.dtypes()
        if dtypes is not None:
            hello["dtypes"] = dtypes
        cannot_run = self.cannot_run()
        if cannot_run:
            hello["cannot_run"] = dict(cannot_run)
        return hello


def parse_args(description: str, argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--queue", required=True, help="the queue folder tally writes cases into")
    p.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    p.add_argument(
        "--backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="torch.distributed backend; auto: nccl when every rank has its own GPU, else gloo "
        "(NCCL refuses two ranks of one communicator on one GPU)",
    )
    return p.parse_args(argv)


def choose_backend(asked: str, world: int, devices: int) -> str:
    """nccl when every rank has a GPU of its own, else gloo; or what was asked."""
    if asked != "auto":
        return asked
    return "nccl" if 0 < devices and world <= devices else "gloo"


def thread_budget(environ) -> int:
    """The threads a rank may hold before its worker retires: TALLY_WORKER_THREAD_BUDGET where set
    (a host with a lower pid_max, or a test), else tally_adapters.queue.THREAD_BUDGET."""
    text = environ.get("TALLY_WORKER_THREAD_BUDGET")
    if text is None:
        return THREAD_BUDGET
    # Decimal ASCII digits only: int() would also take " 512", "5_12" and other scripts' digits.
    budget = int(text) if re.fullmatch(r"[0-9]+", text, flags=re.ASCII) else 0
    if budget < 1:
        raise ValueError(f"TALLY_WORKER_THREAD_BUDGET={text!r}: the threads a rank may hold must be a whole number, 1 or more")
    return budget


def run(worker_class, argv=None) -> int:
    """The main of a worker: parses its arguments, takes this rank's GPU (several ranks share one
    when the world outnumbers the GPUs), starts torch.distributed, and serves tally's queue."""
    args = parse_args((worker_class.__doc__ or "").strip().split("\n\n")[0], argv)
    budget = thread_budget(os.environ)
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    name = f"tally's {worker_class.framework} worker"
    if devices == 0 and worker_class.needs_gpu:
        print(f"{name}: no CUDA device ({worker_class.framework} builds its models on one)", file=sys.stderr)
        return 2
    backend = choose_backend(args.backend, world, devices)
    worker = worker_class(backend, devices, world)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if devices:
        torch.cuda.set_device(local_rank % devices)
    worker.before_process_group()
    import torch.distributed as dist

    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    worker.start()
    # What is loaded by now (torch, the framework) lives as long as the worker: frozen out of every
    # later collection, so the one a worker runs after each case looks only at what the case made.
    gc.collect()
    gc.freeze()
    if dist.get_rank() == 0:
        where = f"{devices} GPU(s)" if devices else "CPU"
        print(f"{name}: world {world} on {where}, {backend}, {worker.framework} {worker.framework_version()}",
              flush=True)
    serve(args.queue, args.parent_pid, worker.hello(), worker.execute, thread_budget=budget)
    dist.destroy_process_group()
    return 0
