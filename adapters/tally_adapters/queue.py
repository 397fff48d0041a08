"""The worker side of tally's queue protocol (docs/real-targets.md), shared by every framework's
worker (tally_adapters.worker). Needs torch.distributed when serving, nothing at import.

A worker is WORLD ranks that stay up across cases. Rank 0 watches the queue folder for
`case-<K>.json` and tells the others (a broadcast at least every IDLE_SECONDS, so no collective
waits longer); every rank runs the case with the framework's `execute(request)` (a Request: the case and the
files that came with it); rank 0
gathers each rank's outcome and writes `case-<K>.result.json`. The worker exits when tally writes
`stop` or tally's process is gone, or retires after a case that left a rank past its thread budget
(THREAD_BUDGET); every rank also watches tally's process from a thread, so a
rank stuck in the middle of a case (in the framework, or in a collective another rank never
joins) ends too once tally is gone.
"""

import collections
import contextlib
import json
import os
import sys
import threading
import time
import traceback

from .manifest import write_atomically

IDLE_SECONDS = 5.0
PARENT_CHECK_SECONDS = 1.0
# A rank past this many threads retires its worker after the case (tally starts a fresh one). A
# gloo group keeps three threads while anything refers to it, destroyed or not: four world-8
# megatron-core workers on one H200 host, their parallel state made anew layout after layout, grew
# to 32,665 threads in three minutes (about 1,000 a rank) and hung at the host's pid_max (32,768).
# 32 ranks at this budget hold half of that.
THREAD_BUDGET = 512


def parent_alive(pid):
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def watch_parent(parent_pid, interval=PARENT_CHECK_SECONDS):
    """Ends this process (os._exit: no cleanup that could block) once tally's process is gone. A
    daemon thread: the queue loop checks only while idle, and a rank busy with a case never would."""

    def watch():
        while parent_alive(parent_pid):
            time.sleep(interval)
        print(f"tally (pid {parent_pid}) is gone: this rank exits", file=sys.stderr, flush=True)
        os._exit(3)

    if parent_pid > 0:
        threading.Thread(target=watch, name="tally-parent-watch", daemon=True).start()


def next_command(queue, k, parent_pid):
    """Rank 0: ("case", K) when case-K.json is there, ("stop",) when tally asks or is gone,
    ("idle",) after IDLE_SECONDS of waiting."""
    start = time.monotonic()
    path = os.path.join(queue, f"case-{k}.json")
    while time.monotonic() - start < IDLE_SECONDS:
        if os.path.exists(os.path.join(queue, "stop")) or not parent_alive(parent_pid):
            return ("stop",)
        if os.path.exists(path):
            return ("case", k)
        time.sleep(0.002)
    return ("idle",)


class Request:
    """Case K of a queue, as tally sent it: the case (docs/case-files.md), the gradient index and
    values (every logical param: name, class, shape, offset into the float32 values), and the
    framework's configuration where tally writes one (`case-<K>.engine.json`). The worker executes
    what the request says; it names nothing tally has not named."""

    def __init__(self, queue, k, case):
        self.queue = queue
        self.k = k
        self.case = case

    def path(self, suffix):
        return os.path.join(self.queue, f"case-{self.k}{suffix}")

    @property
    def manifests_dir(self):
        """Where the worker writes the run's manifests."""
        return self.path("")

    @property
    def faults(self):
        return list(self.case["faults"])

    @property
    def case_digest(self):
        """The request's identity (case-K.gradients.json's case_digest), which every manifest of the
        run echoes (manifest.write_run's case_digest): tally refuses manifests of another case."""
        with open(self.path(".gradients.json")) as f:
            return json.load(f)["case_digest"]

    def gradient_index(self):
        """case-K.gradients.json's params: each logical param's name, class, shape and offset."""
        with open(self.path(".gradients.json")) as f:
            return json.load(f)["params"]

    def gradients(self):
        """tally's values of every logical param: name -> numpy array of its shape."""
        import numpy as np

        with open(self.path(".gradients.json")) as f:
            index = json.load(f)
        values = np.fromfile(self.path(".gradients.f32"), dtype="<f4")
        if values.size != index["elements"]:
            raise ValueError(f"case-{self.k}.gradients.f32 holds {values.size} values, its index says {index['elements']}")
        tensors = {}
        for p in index["params"]:
            n = 1
            for d in p["shape"]:
                n *= d
            tensors[p["name"]] = values[p["offset"] : p["offset"] + n].reshape(p["shape"])
        return tensors

    def shares(self, ranks):
        """Each rank's share of every logical gradient for a reduction group of `ranks` (tally's
        run/contributions.h): name -> numpy array [ranks, *shape], whose sum over the group is the
        gradient times the index's `shares.divisor`, exact in the case's dtype. Raises
        FileNotFoundError naming the file when tally sent none for that size."""
        import numpy as np

        with open(self.path(".gradients.json")) as f:
            index = json.load(f)
        path = self.path(f".shares-{ranks}.f32")
        if not os.path.exists(path):
            sent = index.get("shares", {}).get("group_sizes", [])  # absent: tally dealt no shares
            raise FileNotFoundError(f"{path}: tally sent no shares for a group of {ranks} with case {self.k} "
                                    f"(it sent {sent})")
        values = np.fromfile(path, dtype="<f4")
        elements = index["elements"]
        if values.size != ranks * elements:
            raise ValueError(f"{path} holds {values.size} values, not {ranks} x {elements}")
        values = values.reshape(ranks, elements)
        out = {}
        for p in index["params"]:
            n = int(np.prod(p["shape"], dtype=np.int64))
            out[p["name"]] = values[:, p["offset"] : p["offset"] + n].reshape([ranks] + list(p["shape"]))
        return out

    def engine_config(self):
        """The framework's configuration tally sent with the case; raises FileNotFoundError naming
        the file when tally sent none (a case of another framework)."""
        path = self.path(".engine.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: tally sent no engine configuration with case {self.k}")
        with open(path) as f:
            return json.load(f)


class FrameworkRefused(Exception):
    """The framework declined the case while it was being set up, with a check of its own (raised
    out of framework_setup): the case's result is "refused" with the framework's message, a refusal
    tally counts by reason, not a failure of the worker."""


def raised_in(error, package):
    """Whether the innermost frame of `error`'s traceback is in a module of `package` ("deepspeed"):
    the framework's own code raised it, not code that called into it or code it called."""
    tb, module = error.__traceback__, ""
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        tb = tb.tb_next
    return module == package or module.startswith(package + ".")


def raised_where(error):
    """The framework's file and line that raised `error` ("megatron/core/parallel_state.py:898"),
    from the innermost frame of its traceback: the check a rule of tally's cites once it is written."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "an unknown line"
    module = tb.tb_frame.f_globals.get("__name__", "")
    path = module.replace(".", "/") + ".py" if module else tb.tb_frame.f_code.co_filename
    if os.path.basename(tb.tb_frame.f_code.co_filename) == "__init__.py":
        path = module.replace(".", "/") + "/__init__.py"
    return f"{path}:{tb.tb_lineno}"


# What a framework's validation raises: its asserts, its value checks, what it has not built. A
# TypeError, KeyError or RuntimeError in its code is a call it did not expect (the worker's, or its
# own bug), never a refusal: an error, so that it is seen.
VALIDATION_ERRORS = (ValueError, AssertionError, NotImplementedError)


def is_validation(error, package):
    """Whether `error` is the kind a check raises: one of VALIDATION_ERRORS, or an exception class the
    framework `package` defines for itself."""
    defined_in = type(error).__module__ or ""
    return isinstance(error, VALIDATION_ERRORS) or defined_in == package or defined_in.startswith(package + ".")


@contextlib.contextmanager
def framework_setup(package):
    """The block sets the framework up for a case, before any gradient (its parallel state, model and
    engine). A check of the framework `package` that declines the case there (a validation error,
    is_validation, raised in its own code) is re-raised as FrameworkRefused with its message and the
    file and line that raised it. Any other exception (from the worker, from torch, from a
    collective, a TypeError in the framework) passes unchanged and stays an error."""
    try:
        yield
    except FrameworkRefused:
        raise
    except Exception as error:
        if raised_in(error, package) and is_validation(error, package):
            raise FrameworkRefused(f"{type(error).__name__}: {error} (raised at {raised_where(error)})") from error
        raise


def threads_of_this_process():
    """This process's threads (Linux's /proc/self/status), or None where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def thread_names_of_this_process(most=4):
    """The `most` commonest names of this process's threads with their counts, as "name x N, ..."
    (Linux's /proc/self/task/*/comm): what kind of thread a rank keeps piling up."""
    names = collections.Counter()
    try:
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as f:
                    names[f.read().strip()] += 1
            except OSError:
                continue  # a thread that ended while it was read
    except OSError:
        return "unknown"
    return ", ".join(f"{name} x {n}" for name, n in names.most_common(most))


def retiring_reason(threads_by_rank, budget=THREAD_BUDGET):
    """Why the worker retires after this case (every rank's thread count, None where unknown), or
    None: the rank holding the most threads where it holds `budget` or more."""
    known = [(t, rank) for rank, t in enumerate(threads_by_rank) if t is not None]
    if not known:
        return None
    threads, rank = max(known)
    if threads < budget:
        return None
    return f"rank {rank} holds {threads} threads, the budget is {budget}"


def result_document(outcomes, seconds):
    """case-<K>.result.json (docs/schemas/result.schema.json) from every rank's (status, message):
    "error" with the first failing rank's message when one failed; else "refused" with the first
    refusing rank's message when the framework declined the case; else "ok"."""
    for status in ("error", "refused"):
        messages = [m for s, m in outcomes if s == status]
        if messages:
            return {"status": status, "message": messages[0], "seconds": seconds}
    return {"status": "ok", "message": "", "seconds": seconds}


def serve(queue, parent_pid, hello, execute, thread_budget=THREAD_BUDGET):
    """Writes hello.json (rank 0), then runs cases until told to stop. `execute(request)` runs
    case K on this rank (a Request) and returns, or raises; an exception on any rank makes the
    case's result an error carrying the first failing rank's message. After a case that leaves a
    rank with `thread_budget` threads or more, rank 0 writes `retiring` (the reason) before the
    result and every rank returns: tally waits for this worker to end and starts a fresh one."""
    import torch.distributed as dist

    watch_parent(parent_pid)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        write_atomically(json.dumps(hello) + "\n", os.path.join(queue, "hello.json"))
    k = 1
    while True:
        command = [next_command(queue, k, parent_pid) if rank == 0 else None]
        dist.broadcast_object_list(command, src=0)
        command = command[0]
        if command[0] == "stop":
            break
        if command[0] == "idle":
            continue
        start = time.monotonic()
        status, message = "ok", ""
        try:
            with open(os.path.join(queue, f"case-{k}.json")) as f:
                case = json.load(f)
            execute(Request(queue, k, case))
        except FrameworkRefused as e:  # the framework's own check declined the case at set-up
            status = "refused"
            message = f"rank {rank}: {e}"
            traceback.print_exc()
        except Exception as e:  # the worker or the framework failed on the case
            status = "error"
            message = f"rank {rank}: {type(e).__name__}: {e}"
            traceback.print_exc()
        results = [None] * world
        dist.all_gather_object(results, (status, message, threads_of_this_process()))
        retiring = retiring_reason([threads for _, _, threads in results], thread_budget)
        if rank == 0:
            if retiring:
                write_atomically(retiring + "\n", os.path.join(queue, "retiring"))
            result = result_document([(s, m) for s, m, _ in results], time.monotonic() - start)
            write_atomically(json.dumps(result) + "\n", os.path.join(queue, f"case-{k}.result.json"))
            # Each rank's threads after the case: the log shows a case that keeps some (queue.THREAD_BUDGET).
            threads = " ".join(str(t) for _, _, t in results)
            print(f"case {k}: {result['status']} in {result['seconds']:.2f} s (threads {threads}) {result['message']}",
                  flush=True)
        if retiring:
            print(f"tally's worker retires after case {k}: {retiring}", file=sys.stderr, flush=True)
            return
        k += 1
