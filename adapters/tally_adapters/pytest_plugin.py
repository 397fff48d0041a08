"""A pytest plugin (installed with the package: entry point `pytest11`) that gives a framework's own
tests the fixture `tally_grad_norm`: at the step where the framework computes its gradient norm,
write the run's manifests, judge them with tally, and fail the test with tally's diagnosis (which
param was counted how often, on which ranks, by which rule) when an element was not counted
exactly once.

    def test_moe_grad_norm_counts_every_expert_once(tally_grad_norm):
        ...                                   # build the model and optimizer, set gradients
        optimizer.prepare_grads()
        tally_grad_norm.megatron(optimizer, model)       # megatron-core
        tally_grad_norm.judge(lambda out_dir: my_writer(out_dir))   # any framework's writer

In a distributed test (torchrun starting pytest on every rank, as Megatron's and DeepSpeed's
suites run) every rank calls the fixture; rank 0 names one folder for the run's manifests and the
others receive it, rank 0 judges, and every rank gets the same verdict. A rank whose writer raises
fails the test on every rank (the others are told, not left waiting in a collective). The folder
is made under rank 0's temporary folder, so every rank must see rank 0's file system: one node,
or `--basetemp` on a shared file system. The tally binary is
`--tally PATH`, else $TALLY, else `tally` on the PATH; a missing binary fails the test with a
message saying so, unless `--tally-skip-missing` asks to skip it instead.

Nothing here imports torch or a framework until a check runs.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Optional

import pytest

from .check import GradNormMiscount, TallyCannotJudge, find_tally, judge_dir, judge_run


def pytest_addoption(parser):
    group = parser.getgroup("tally", "tally: is the gradient norm counting every parameter exactly once")
    group.addoption("--tally", action="store", default=None, metavar="PATH",
                    help="the tally binary that judges the manifests (default: $TALLY, else tally on the PATH)")
    group.addoption("--tally-skip-missing", action="store_true", default=False,
                    help="skip, rather than fail, a test whose tally binary cannot be found")


def _distributed():
    """torch.distributed when a process group is up, else None (a single-process test)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _is_rank_zero() -> bool:
    dist = _distributed()
    return dist is None or dist.get_rank() == 0


def _from_rank_zero(value):
    """Rank 0's `value`, on every rank."""
    dist = _distributed()
    if dist is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _failed_ranks(failed_here: bool):
    """The ranks that say they failed (every rank calls it)."""
    dist = _distributed()
    if dist is None:
        return [0] if failed_here else []
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, failed_here)
    return [rank for rank, failed in enumerate(everyone) if failed]


class TallyGradNorm:
    """What the fixture gives a test: one call per checked step."""

    def __init__(self, tally: Optional[str], skip_missing: bool, base: str):
        self.tally = tally
        self.skip_missing = skip_missing
        self.base = base
        self.runs = []  # each checked run's manifest folder, in order

    def _folder(self) -> str:
        """A fresh folder every rank of the run agrees on (rank 0 makes it under its tmp path)."""
        dist = _distributed()
        name = [None]
        if dist is None or dist.get_rank() == 0:
            name[0] = tempfile.mkdtemp(prefix=f"run-{len(self.runs)}-", dir=self.base)
        if dist is not None:
            dist.broadcast_object_list(name, src=0)
        self.runs.append(name[0])
        return name[0]

    def judge(self, write: Callable[[str], object], *, timeout: float = 600.0) -> str:
        """Calls `write(out_dir)` on every rank (each rank writes its manifest, docs/manifest.md),
        then judges the run with `tally check`. Returns tally's report when every element was
        counted exactly once; raises GradNormMiscount (an AssertionError: the test fails with
        tally's diagnosis) when not, and fails the test when tally could not judge."""
        # Rank 0 runs tally: its lookup decides for every rank.
        missing = None
        if _is_rank_zero():
            try:
                self.tally = find_tally(self.tally)
            except TallyCannotJudge as error:
                missing = str(error)
        missing = _from_rank_zero(missing)
        if missing is not None:
            if self.skip_missing:
                pytest.skip(missing)
            pytest.fail(missing, pytrace=False)
        out_dir = self._folder()
        failure = None
        try:
            write(out_dir)
        except Exception as error:  # noqa: BLE001 (reported on every rank below)
            failure = error
        failed = _failed_ranks(failure is not None)
        if failure is not None:
            raise failure
        if failed:
            pytest.fail(f"rank(s) {failed} failed to write their manifests into {out_dir} (see their output)",
                        pytrace=False)
        binary = self.tally
        try:
            if _distributed() is None:
                return judge_dir(out_dir, tally=binary, timeout=timeout)
            return judge_run(out_dir, tally=binary, timeout=timeout)
        except GradNormMiscount as miscount:
            raise GradNormMiscount(f"{miscount}\n(the run's manifests: {out_dir})") from None
        except TallyCannotJudge as error:
            pytest.fail(f"{error}\n(the run's manifests: {out_dir})", pytrace=False)

    def megatron(self, optimizer, model, *, grad_norm=None, num_zeros=None, timeout: float = 600.0) -> str:
        """A megatron-core optimizer's step, after `optimizer.prepare_grads()` (the call order of
        tally_adapters.megatron.manifest): writes its manifests with dump_manifest and judges them."""
        from .megatron import dump_manifest

        return self.judge(
            lambda out_dir: dump_manifest(optimizer, model, out_dir, grad_norm=grad_norm, num_zeros=num_zeros),
            timeout=timeout,
        )


@pytest.fixture
def tally_grad_norm(request, tmp_path_factory):
    """Judges a framework's gradient-norm step with tally (see tally_adapters.pytest_plugin). The
    manifests stay in pytest's temporary folders, which pytest keeps for its last few sessions."""
    config = request.config
    return TallyGradNorm(
        tally=config.getoption("--tally"),
        skip_missing=config.getoption("--tally-skip-missing"),
        base=str(tmp_path_factory.mktemp("tally")),
    )


def pytest_report_header(config):
    tally = config.getoption("--tally") or os.environ.get("TALLY") or "tally"
    return f"tally: judging gradient norms with {tally}"
