#!/usr/bin/env python3
"""Where a real target's case time goes: runs one of tally_adapters' workers with cProfile around
each rank's `execute` (the case), for bench/ only (never a timed test). Give it to tally as the
worker command, e.g.

    tally sweep --target megatron-core --world 8 --worker \\
      "torchrun --standalone --nproc-per-node {world} bench/worker_profile.py \\
       --worker-module tally_adapters.megatron.worker --profile-dir OUT/prof"

Each rank writes OUT/prof/rank-R.prof (pstats of its cases) and rank-R.json (cases, the wall
seconds inside `execute`, the process's CPU seconds and wall seconds since it started) every 10
cases and at stop; `--report OUT/prof` prints the ranks' totals and the functions of most
cumulative time.
"""

import argparse
import cProfile
import importlib
import json
import os
import pstats
import sys
import time


def profiled(worker_class, profile_dir, rank):
    """worker_class with its execute profiled, the totals written every 10 cases."""
    profile = cProfile.Profile()
    started = time.monotonic()
    totals = {"cases": 0, "execute_s": 0.0}

    def write():
        os.makedirs(profile_dir, exist_ok=True)
        profile.dump_stats(os.path.join(profile_dir, f"rank-{rank}.prof"))
        cpu = os.times()
        document = dict(totals, cpu_s=cpu.user + cpu.system, wall_s=time.monotonic() - started)
        with open(os.path.join(profile_dir, f"rank-{rank}.json"), "w") as f:
            json.dump(document, f)

    class Profiled(worker_class):
        def execute(self, request):
            begin = time.monotonic()
            profile.enable()
            try:
                return super().execute(request)
            finally:
                profile.disable()
                totals["cases"] += 1
                totals["execute_s"] += time.monotonic() - begin
                if totals["cases"] % 10 == 0:
                    write()

    return Profiled, write


def report(profile_dir, top):
    ranks = sorted(f for f in os.listdir(profile_dir) if f.endswith(".json"))
    for name in ranks:
        with open(os.path.join(profile_dir, name)) as f:
            t = json.load(f)
        per_case = t["execute_s"] / t["cases"] if t["cases"] else 0.0
        print(f"{name[:-5]}: {t['cases']} cases, {per_case * 1000:.0f} ms a case in execute, "
              f"{t['execute_s']:.1f} s of {t['wall_s']:.1f} s wall in execute, CPU {t['cpu_s']:.1f} s")
    for rank in ("rank-0", "rank-1"):
        path = os.path.join(profile_dir, rank + ".prof")
        if os.path.exists(path):
            print(f"\n--- {rank}: the {top} functions of most cumulative time ---")
            pstats.Stats(path).sort_stats("cumulative").print_stats(top)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker-module", help="the worker, e.g. tally_adapters.megatron.worker")
    p.add_argument("--profile-dir", help="where each rank writes its profile")
    p.add_argument("--report", metavar="DIR", help="print the profiles a run wrote to DIR, and exit")
    p.add_argument("--top", type=int, default=40)
    args, rest = p.parse_known_args()
    if args.report:
        report(args.report, args.top)
        return 0
    if not args.worker_module or not args.profile_dir:
        p.error("--worker-module and --profile-dir are needed to run a worker")
    module = importlib.import_module(args.worker_module)
    from tally_adapters import worker as base

    classes = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, base.Worker) and v is not base.Worker]
    if len(classes) != 1:
        p.error(f"{args.worker_module} defines {len(classes)} workers, not one")
    rank = int(os.environ.get("RANK", "0"))
    worker_class, write = profiled(classes[0], args.profile_dir, rank)
    try:
        return base.run(worker_class, rest)
    finally:
        write()


if __name__ == "__main__":
    sys.exit(main())
