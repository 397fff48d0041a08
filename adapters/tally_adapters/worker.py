"""What every framework's worker shares: its command line, the device and torch.distributed
backend it runs on, its hello, the faults it plants, and the queue loop (tally_adapters.queue).

A framework's worker is a subclass of `Worker` that says what it is (`framework`, the faults it
plants and why it cannot plant the others), how it starts (`framework_version`, `start`), and the
steps of a case that are its own: `build`, `set_gradients`, `norm_step`, `manifest` and `release`.
`Worker.execute` runs them in the one order every case has (plants, build, gradients, the check that
every param is held, the norm step, the manifest), so no framework restates it. tally starts a
worker under torchrun, once per world size:

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
from .manifest import write_run
from .plants import Planted
from .queue import THREAD_BUDGET, Request, framework_setup, serve, threads_of_this_process

# The threads a rank may hold before a worker whose framework builds its meshes each case destroys
# their process groups (destroy_groups_past): half the queue's budget, so no case takes it past.
GROUP_THREADS = THREAD_BUDGET // 2

# fault -> ([(where, attr, make)], how): what a worker replaces to plant a catalog fault (plants.py)
PlantTable = Dict[str, Tuple[List[Tuple[str, str, object]], str]]


class CaseRun:
    """One case on this rank, as a worker's steps share it: the request, its case (every field tally
    writes, read as written: docs/case-files.md), tally's values of every logical param (`tensors`,
    name -> numpy array of its shape) and their index (`index`: each param's name, class, shape,
    split_dim, stage), and the device the framework computes on. Each framework's steps add what
    they make (its model, engine, optimizer, the norm it reported)."""

    def __init__(self, request: Request, device):
        self.request = request
        self.case = request.case
        self.index = request.gradient_index()
        self.tensors = request.gradients()
        self.device = device


def check_every_param_held(framework: str, local_error: Optional[str], held, tensors) -> None:
    """Raises a model mismatch on every rank together, after one collective (so no rank is left
    waiting in the next): one rank's own error, or a logical param no rank holds."""
    import torch.distributed as dist

    everyone: List[object] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (local_error, sorted(held)))
    errors = [error for error, _ in everyone if error]
    if errors:
        raise LookupError(errors[0])
    missing = set(tensors) - set().union(*(set(names) for _, names in everyone))
    if missing:
        raise LookupError(f"model mismatch: no rank of {framework}'s model holds {sorted(missing)[:5]} "
                          f"({len(missing)} of tally's params)")


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

    def build(self, run: CaseRun) -> None:
        """Builds the framework for the case (its groups, model, engine or optimizer) onto `run`.
        Runs inside framework_setup: a check of the framework's own that declines the case here is
        a refusal, counted by its reason."""
        raise NotImplementedError

    def set_gradients(self, run: CaseRun):
        """Gives the framework tally's gradients; returns the logical names this rank holds a piece
        of. A LookupError (the framework holds a param the worker did not build) is told to every
        rank in the check that follows."""
        raise NotImplementedError

    def norm_step(self, run: CaseRun) -> None:
        """Runs the framework's own code that computes (and clips by) the gradient norm, keeping on
        `run` what the manifest reads."""
        raise NotImplementedError

    def manifest(self, run: CaseRun) -> Dict[str, object]:
        """This rank's manifest of what the norm step counted (rank lists: write_run makes them a
        group table)."""
        raise NotImplementedError

    def release(self, run: CaseRun, failed: bool) -> None:
        """Gives back what the case made (engines, groups, caches), whatever happened; `failed`: the
        case raised, so nothing it left may be reused."""

    # --- the one order of a case -----------------------------------------------------------

    def execute(self, request: Request) -> None:
        """Runs the case on this rank and writes its manifests to request.manifests_dir; raises
        when the framework refuses the case or the worker fails on it. The case's faults stay
        planted from the build to the manifest, so the manifest reads what the planted code did."""
        import torch.distributed as dist

        run = CaseRun(request, self.device())
        failed = True
        try:
            with self.planted(request):
                with framework_setup(self.package.rstrip(".")):
                    self.build(run)
                try:
                    held, local_error = self.set_gradients(run), None
                except LookupError as error:
                    held, local_error = [], f"rank {dist.get_rank()}: {error}"
                check_every_param_held(self.framework, local_error, held, run.tensors)
                self.norm_step(run)
                manifest = self.manifest(run)
            write_run(manifest, request.manifests_dir, request.case_digest)
            failed = False
        finally:
            self.release(run, failed)

    # --- shared ----------------------------------------------------------------------------

    def device(self):
        """The device this rank computes on: its GPU (run() set it), else the CPU."""
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self.devices else torch.device("cpu")

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


def destroy_groups(groups) -> None:
    """Destroys `groups` (process groups torch holds, not the default one), takes each out of every
    DeviceMesh still alive, forgets the output specs DTensor cached, and collects. A gloo group keeps
    its threads (three on CPUs) while anything refers to it, destroyed or not, and a DeviceMesh
    holds its groups (its `_pg_registry`); torch keeps a case's meshes past it through its DTensor
    sharding strategies, from somewhere the collector cannot see, so destroying the groups alone
    gave no thread back (bench/RESULTS.md). A mesh left so names no group a later case uses: what
    the framework computes is unchanged, since the next case builds its own."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    groups = list(groups)
    for group in groups:
        dist.destroy_process_group(group)
    # Output specs cached by value name the meshes: no later case is handed one of them.
    _clear_sharding_prop_cache()
    # Only what came since the worker's start (gc.freeze in run): the cases' objects. type(), not
    # isinstance: an object's __class__ may be a property (torch's deprecated reduce_op warns).
    for mesh in [o for o in gc.get_objects() if issubclass(type(o), DeviceMesh)]:
        held = getattr(mesh, "_pg_registry", None) or {}
        for name in [name for name, g in held.items() if any(g is d for d in groups)]:
            del held[name]
    del groups
    gc.collect()


def groups_but_the_world() -> List[object]:
    """Every process group torch holds but the default one (its registry, private: getattr, so a
    torch without it names none)."""
    import torch.distributed as dist

    registry = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    return [g for g in list(getattr(registry, "pg_map", {})) if g is not dist.group.WORLD]


def destroy_groups_but_the_world() -> int:
    """destroy_groups of every group but the default one; returns how many."""
    groups = groups_but_the_world()
    destroy_groups(groups)
    return len(groups)


def most_threads_of_any_rank() -> int:
    """The most threads any rank holds (a collective: every rank calls it at the same point)."""
    import torch.distributed as dist

    threads: List[object] = [None] * dist.get_world_size()
    dist.all_gather_object(threads, threads_of_this_process())
    return max((t for t in threads if isinstance(t, int)), default=0)


def destroy_groups_past(most_threads: int) -> int:
    """After a case, for a worker whose framework builds its meshes anew each case (Automodel's
    MeshContext.build, accelerate's ParallelismConfig) where a user's process builds them once:
    once some rank holds `most_threads` threads or more, destroy_groups_but_the_world; returns how
    many groups it destroyed. Not after every case: destroying forgets DTensor's cached sharding
    strategies too, which later cases of equal meshes would reuse (a world-4 hf campaign ran 254
    cases in 5 minutes destroying after each, where it ran 404 retiring at the budget). Every rank
    decides alike (the most of any rank's)."""
    if most_threads_of_any_rank() < most_threads:
        return 0
    return destroy_groups_but_the_world()


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
