"""Judging a run's manifests with the tally binary, from inside the run: one call on every rank,
one verdict for all (rank 0 runs `tally check`, the others receive what it said). Needs
torch.distributed when called, nothing at import."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, List, Optional


class GradNormMiscount(AssertionError):
    """`tally check` found the run's grad norm or zero count wrong; the message is its report
    (the miscounted params, how often each was counted, on which ranks, the rule that kept or
    dropped it)."""


class TallyCannotJudge(RuntimeError):
    """tally could not judge the manifests: they are bad (exit 2), tally is missing, or it failed."""


def find_tally(tally: Optional[str] = None) -> str:
    """The tally binary: `tally` when given, else $TALLY, else `tally` on the PATH. Raises
    TallyCannotJudge naming where it looked when there is none."""
    candidate = tally or os.environ.get("TALLY") or "tally"
    found = shutil.which(candidate)
    if found is None:
        raise TallyCannotJudge(
            f"no tally binary at {candidate!r} (give its path, or set $TALLY, or put tally on the PATH; "
            "it is build/cli/tally of a tally checkout)"
        )
    return found


def judge_dir(out_dir: str, *, tally: Optional[str] = None, timeout: float = 600.0) -> str:
    """`tally check OUT_DIR` in this process: returns the report when every element was counted
    exactly once, raises GradNormMiscount (exit 1) or TallyCannotJudge (anything else)."""
    binary = find_tally(tally)
    try:
        r = subprocess.run([binary, "check", out_dir], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise TallyCannotJudge(f"{binary} check {out_dir}: {error}") from error
    report = r.stdout + r.stderr
    if r.returncode == 0:
        return report
    if r.returncode == 1:
        raise GradNormMiscount(report)
    raise TallyCannotJudge(f"tally could not judge {out_dir} (exit {r.returncode}):\n{report}")


def judge_run(out_dir: str, *, tally: Optional[str] = None, timeout: float = 600.0) -> str:
    """Collective: every rank calls it once its manifest is written. Rank 0 judges the run
    (judge_dir) after a barrier, and every rank returns its report or raises what it raised."""
    import torch.distributed as dist

    dist.barrier()  # every rank's file is written before rank 0 reads them
    outcome: List[Any] = [None]
    if dist.get_rank() == 0:
        try:
            outcome[0] = ("ok", judge_dir(out_dir, tally=tally, timeout=timeout))
        except GradNormMiscount as error:
            outcome[0] = ("miscount", str(error))
        except Exception as error:  # noqa: BLE001 (every rank must reach the broadcast with a verdict)
            outcome[0] = ("cannot", f"{type(error).__name__}: {error}")
    dist.broadcast_object_list(outcome, src=0)
    kind, report = outcome[0]
    if kind == "ok":
        return report
    if kind == "miscount":
        raise GradNormMiscount(report)
    raise TallyCannotJudge(report)
