#!/usr/bin/env python3
"""Cases per minute before against after the reduction, from one sweep's state file.

A sweep runs, on every layout, a variant whose gradients enter before the reduction ("...-unreduced")
beside its twin after it (the same id without "-unreduced"): tally's model and megatron-core
("plain-unreduced" beside "plain", "distributed-unreduced" beside "distributed"), torchtitan and
Automodel (each clip and backend with and without "-unreduced"). This pairs them case by case, so
both sides ran the same layouts in the same run, and prints each side's seconds and cases per minute
and the ratio before / after.

    bench/sweep_stage_rate.py STATE_FILE [STATE_FILE ...]

STATE_FILE: a sweep's state (CORPUS/sweep-state.json), as `tally sweep` writes it after each case.
"""
import json
import statistics
import sys


def pairs(results):
    by_id = {r["id"]: r for r in results}
    for r in results:
        if "-unreduced" not in r["id"]:
            continue
        twin = by_id.get(r["id"].replace("-unreduced", "", 1))
        if twin is not None:
            yield twin, r


def main(paths):
    if not paths:
        sys.exit(__doc__)
    for path in paths:
        with open(path) as f:
            state = json.load(f)
        found = list(pairs(state["results"]))
        if not found:
            sys.exit(f"{path}: no '-unreduced' case with its twin after the reduction")
        after = [a["seconds"] for a, _ in found]
        before = [b["seconds"] for _, b in found]
        outcomes = {}
        for a, b in found:
            for side, r in (("after", a), ("before", b)):
                outcomes.setdefault(side, {}).setdefault(r["outcome"], 0)
                outcomes[side][r["outcome"]] += 1
        total_a, total_b = sum(after), sum(before)
        print(f"{path}: {state['target']} {state['version']}, world {state['world']}: {len(found)} pairs")
        for side, seconds, total in (("after the reduction", after, total_a), ("before it", before, total_b)):
            rate = 60 * len(seconds) / total if total > 0 else float("inf")
            print(f"  {side}: {total:.2f} s, median {statistics.median(seconds) * 1000:.2f} ms a case, "
                  f"{rate:.0f} cases/min; {outcomes[side.split()[0]]}")
        if total_a > 0:
            print(f"  before/after (total seconds): {total_b / total_a:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
