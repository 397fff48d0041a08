"""The manifest format (docs/manifest.md) as every framework's adapter writes it: the current
format version, the run's group table, and one atomic writer. No framework and no torch are
imported here; `write_run` alone runs a collective (torch.distributed, imported when called).

A framework's adapter builds each rank's manifest as a dict whose groups are rank lists (the
`groups`, each optimizer's `stats_group`, `tp_group`, `expert_tp_group`) and calls
`write_run(manifest, out_dir)` on every rank: the ranks agree on the run's group table with one
`all_gather_object` in which each rank sends only the lists it leads (whose smallest rank is
itself), as arithmetic runs; every rank then builds the same sorted table, rank 0 writes
`groups.json`, and each rank writes `rank-<R>.json` with its groups as indices into the table.
Every file is written atomically (a temporary file in the same folder, then os.replace).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

MANIFEST_VERSION = 2  # the format write_run writes (rank files and groups.json)
# The format of one rank's manifest whose groups are rank lists, as a framework's adapter builds
# it (a complete version-1 file on its own); write_run makes it MANIFEST_VERSION.
RANK_LISTS_VERSION = 1


def stats(values) -> Dict[str, Any]:
    """The statistics of a piece's gradient values, in fp64: sum of squares, largest magnitude, zeros."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64).reshape(-1)
    return {
        "sum_squares": float(np.dot(v, v)),
        "abs_max": float(np.abs(v).max()) if v.size else 0.0,
        "zeros": int(v.size - np.count_nonzero(v)),
    }


def finite_or_none(norm: Optional[float]) -> Optional[float]:
    """A reported norm as the manifest states it: null where the framework gave none or one that is
    not finite (JSON has no infinity)."""
    return norm if norm is not None and math.isfinite(norm) else None


def optimizer_child(name: str, stats_group: Sequence[int], main_params: List[Dict[str, Any]], *,
                    tp_group: Optional[Sequence[int]] = None, expert_tp_group: Optional[Sequence[int]] = None,
                    clip: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    """One child of the norm code (docs/manifest.md, `optimizers`): its name, the ranks its statistics
    are summed over, the groups its TP de-duplication reads (None: it reads none), the clip that
    scaled it as (max_norm, coefficient), and its main params' records."""
    return {
        "name": name,
        "stats_group": list(stats_group),
        "tp_group": None if tp_group is None else list(tp_group),
        "expert_tp_group": None if expert_tp_group is None else list(expert_tp_group),
        "clip": None if clip is None else {"max_norm": clip[0], "coefficient": clip[1]},
        "main_params": main_params,
    }


def rank_manifest(*, producer: str, parallel: Dict[str, int], groups: Dict[str, List[int]],
                  params: List[Dict[str, Any]], optimizers: List[Dict[str, Any]], norm: Optional[float],
                  zeros: Optional[int] = None, group_norms: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """This rank's manifest with every group a rank list (RANK_LISTS_VERSION; write_run makes it
    MANIFEST_VERSION): the one place every framework's document is put together. `norm` and `zeros`:
    what the framework reported, as floats and counts already; `group_norms`: the norm of each separate
    grad-norm group it reported beside the main one."""
    import torch.distributed as dist

    reported: Dict[str, Any] = {"norm": norm, "inf_norm": None, "zeros": zeros}
    if group_norms:
        reported["group_norms"] = dict(group_norms)
    return {
        "tally_manifest": RANK_LISTS_VERSION,
        "producer": producer,
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "parallel": parallel,
        "groups": groups,
        "params": params,
        "optimizers": optimizers,
        "reported": reported,
    }


def manifest_text(manifest: Dict[str, Any]) -> str:
    """The file's text: json.dump(indent=2), strict (no NaN/inf), and a final newline."""
    return json.dumps(manifest, indent=2, allow_nan=False) + "\n"


def write_manifest(manifest: Dict[str, Any], out_dir: str) -> str:
    """Writes out_dir/rank-<R>.json atomically (a temporary file, then os.replace)."""
    path = os.path.join(out_dir, f"rank-{int(manifest['rank'])}.json")
    return write_atomically(manifest_text(manifest), path)


def write_atomically(text: str, path: str) -> str:
    """Writes `text` to `path` through a temporary file in the same folder and os.replace, so
    that a reader sees the old file or the whole new one, never part of one."""
    out_dir = os.path.dirname(path) or "."
    os.makedirs(out_dir, exist_ok=True)
    # a hidden name that no reader takes for a manifest, should a crash leave it behind
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 -> what open() would have made
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


# ---------------------------------------------------------------------------------------------
# The run's group table (format version 2): pure helpers, no torch.
# ---------------------------------------------------------------------------------------------


def _ranks_text(ranks: Sequence[Any]) -> str:
    """A rank list for a message: a world-sized one elided in the middle."""
    if len(ranks) <= 12:
        return "[" + ", ".join(repr(r) for r in ranks) + "]"
    head = ", ".join(repr(r) for r in ranks[:6])
    tail = ", ".join(repr(r) for r in ranks[-3:])
    return f"[{head}, ... {len(ranks) - 9} more ..., {tail}]"


def _check_rank_list(what: str, ranks: Any, world: Optional[int] = None) -> None:
    """Raises ValueError naming `what` unless `ranks` is a non-empty list of integers in strictly
    ascending order (sorted, no repeats), each in [0, world) when `world` is given."""
    if not isinstance(ranks, (list, tuple)):
        raise ValueError(f"{what}: {ranks!r} is not a rank list")
    if not ranks:
        raise ValueError(f"{what}: the rank list is empty")
    text = _ranks_text(ranks)
    for r in ranks:
        if not isinstance(r, int) or isinstance(r, bool):
            raise ValueError(f"{what} {text}: rank {r!r} is not an integer")
    for a, b in zip(ranks, ranks[1:]):
        if b == a:
            raise ValueError(f"{what} {text}: rank {a} appears twice")
        if b < a:
            raise ValueError(f"{what} {text}: not sorted ascending ({a} before {b})")
    if world is not None and (ranks[0] < 0 or ranks[-1] >= world):
        bad = ranks[0] if ranks[0] < 0 else ranks[-1]
        raise ValueError(f"{what} {text}: rank {bad} is outside [0, {world})")


def manifest_rank_lists(manifest: Dict[str, Any]) -> List[List[int]]:
    """Every rank list a manifest built by build_manifest refers to: its `groups`, and each
    optimizer's `stats_group` and non-null `tp_group` / `expert_tp_group` (repeats kept)."""
    lists = [list(ranks) for ranks in manifest["groups"].values()]
    for o in manifest["optimizers"]:
        lists.append(list(o["stats_group"]))
        for key in ("tp_group", "expert_tp_group"):
            if o[key] is not None:
                lists.append(list(o[key]))
    return lists


def led_groups(rank: int, lists: Iterable[Sequence[int]]) -> List[List[int]]:
    """The distinct lists among `lists` whose smallest rank is `rank`, sorted: what this rank
    contributes to the gather (each group is sent by one rank only, its leader).

    Lists are passed on as given, not sorted or checked: a bad list then reaches every rank and
    group_table raises the same error everywhere, rather than this rank raising alone before the
    collective and leaving the others waiting in it. An empty list has no leader; refer_to_groups
    names it."""
    led = {tuple(ranks) for ranks in lists if len(ranks) > 0 and min(ranks) == rank}
    return [list(ranks) for ranks in sorted(led)]


def rank_runs(ranks: Sequence[int]) -> List[List[int]]:
    """`ranks` as arithmetic runs [first, step, count], in order; ranks_from_runs inverts it
    exactly (whatever the list). dump_manifest gathers runs, not lists: all_gather_object pads
    every rank's bytes to the largest rank's, so the rank leading the world group would make
    every rank receive world x world ranks; Megatron's groups (contiguous or strided blocks) are
    a few runs each."""
    runs: List[List[int]] = []
    i, n = 0, len(ranks)
    while i < n:
        step = ranks[i + 1] - ranks[i] if i + 1 < n else 1
        j = i + 1
        while j < n and ranks[j] - ranks[j - 1] == step:
            j += 1
        runs.append([int(ranks[i]), int(step), j - i])
        i = j
    return runs


def ranks_from_runs(runs: Sequence[Sequence[int]]) -> List[int]:
    """The rank list of rank_runs' runs."""
    return [first + k * step for first, step, count in runs for k in range(count)]


def group_table(gathered: Sequence[Sequence[Sequence[int]]]) -> List[List[int]]:
    """The run's group table from every rank's led lists (`gathered[i]`: the lists rank i
    leads): each distinct list once, in sorted() order, so that every rank that sees the same
    lists builds the same table whatever order they came in. Raises ValueError naming the list if
    one is empty, not sorted ascending or repeats a rank."""
    distinct = set()
    for i, led in enumerate(gathered):
        if not isinstance(led, (list, tuple)):
            raise ValueError(f"group_table: gathered[{i}] is {led!r}, not a list of rank lists")
        for j, ranks in enumerate(led):
            _check_rank_list(f"group_table: gathered[{i}][{j}]", ranks)
            distinct.add(tuple(ranks))
    return [list(ranks) for ranks in sorted(distinct)]


def refer_to_groups(manifest: Dict[str, Any], table: Sequence[Sequence[int]]) -> Dict[str, Any]:
    """The version-2 manifest of `manifest` (as build_manifest builds it: rank lists): the same
    dict with `tally_manifest` MANIFEST_VERSION and every group (`groups`, each optimizer's
    `stats_group`, `tp_group`, `expert_tp_group`; null stays null) an index into `table`. The
    input is left unchanged. Raises ValueError naming the field if a list is not in the table."""
    index = {tuple(ranks): i for i, ranks in enumerate(table)}
    where = f"refer_to_groups: rank {manifest.get('rank')}"

    def ref(field: str, ranks: Any) -> int:
        if not isinstance(ranks, (list, tuple)):
            raise ValueError(f"{where}: {field} is {ranks!r}, not a rank list")
        i = index.get(tuple(ranks))
        if i is None:
            raise ValueError(f"{where}: {field} {_ranks_text(ranks)} is not in the group table")
        return i

    out = dict(manifest)
    out["tally_manifest"] = MANIFEST_VERSION
    out["groups"] = {name: ref(f"groups.{name}", ranks) for name, ranks in manifest["groups"].items()}
    optimizers = []
    for k, o in enumerate(manifest["optimizers"]):
        o = dict(o)
        o["stats_group"] = ref(f"optimizers[{k}].stats_group", o["stats_group"])
        for key in ("tp_group", "expert_tp_group"):
            if o[key] is not None:
                o[key] = ref(f"optimizers[{k}].{key}", o[key])
        optimizers.append(o)
    out["optimizers"] = optimizers
    return out


def groups_file(world: int, table: Sequence[Sequence[int]]) -> Dict[str, Any]:
    """The content of groups.json. Raises ValueError naming the entry unless every list is
    sorted, without repeats, in [0, world), and the table is in sorted() order without a list
    twice (what group_table builds)."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"groups_file: world {world!r} is not a positive integer")
    for i, ranks in enumerate(table):
        _check_rank_list(f"groups_file: groups[{i}]", ranks, world)
    for i in range(1, len(table)):
        a, b = list(table[i - 1]), list(table[i])
        if a == b:
            raise ValueError(f"groups_file: groups[{i}] {_ranks_text(b)} appears twice")
        if b < a:
            raise ValueError(f"groups_file: groups[{i}] {_ranks_text(b)} is not in sorted order")
    return {"tally_groups": MANIFEST_VERSION, "world": world, "groups": [list(r) for r in table]}


def with_case_digest(manifest: Dict[str, Any], case_digest: str) -> Dict[str, Any]:
    """`manifest` echoing a request's case_digest (after its producer line). Raises ValueError unless
    the digest is 16 lowercase hex digits, as tally writes it."""
    if not isinstance(case_digest, str) or re.fullmatch(r"[0-9a-f]{16}", case_digest) is None:
        raise ValueError(f"case_digest {case_digest!r} is not 16 lowercase hex digits")
    out: Dict[str, Any] = {}
    for key, value in manifest.items():
        if key != "case_digest":
            out[key] = value
        if key == "producer":
            out["case_digest"] = case_digest
    return out


def write_groups(world: int, table: Sequence[Sequence[int]], out_dir: str) -> str:
    """Writes out_dir/groups.json atomically, as write_manifest writes a rank file."""
    text = manifest_text(groups_file(world, table))
    return write_atomically(text, os.path.join(out_dir, "groups.json"))


def write_run(manifest: Dict[str, Any], out_dir: str, case_digest: Optional[str] = None) -> str:
    """Collective: every rank calls it with its manifest (groups as rank lists). Writes
    out_dir/rank-<R>.json (format MANIFEST_VERSION) and, on rank 0, out_dir/groups.json; returns
    the rank file's path. `case_digest`: the request's (Request.case_digest) when the run answers one
    of tally's requests; every rank's file echoes it, so tally knows the run is of the case it sent."""
    import torch.distributed as dist

    rank, world = manifest["rank"], manifest["world"]
    led = led_groups(rank, manifest_rank_lists(manifest))
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, [rank_runs(ranks) for ranks in led])
    table = group_table([[ranks_from_runs(runs) for runs in led_runs] for led_runs in gathered])
    # Every rank checks the table (the same everywhere), not only rank 0: a bad one then stops
    # every rank alike, before any file is written.
    groups_file(world, table)
    referred = refer_to_groups(manifest, table)
    if case_digest is not None:
        referred = with_case_digest(referred, case_digest)
    if rank == 0:
        # before rank 0's own file: once every rank file is there, so is groups.json
        write_groups(world, table, out_dir)
    return write_manifest(referred, out_dir)
