"""torchtitan 0.3.0's own models of tally's presets hold tally's layout of each exactly once.

fixtures/torchtitan-0.3.0-presets.json records, per preset torchtitan has a family for and per
layout, tally's layout (`tally layout --preset P ... --json`) and the params of torchtitan's own model
of it (tally_adapters.torchtitan.families: names, shapes, element counts, the logical rows each
holds). The record is checked three ways: its torchtitan params cover its layout's elements once
each, by the mapping the worker uses (no torch); `tally layout` today gives the recorded layout
($TALLY); torchtitan's model built today has the recorded params (torchtitan's venv,
ci/real-torchtitan). Re-record with fixtures/record_presets.py."""

import json
import os
import subprocess

import pytest
from tally_adapters.hf_models import Segment
from tally_adapters.torchtitan import families

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "torchtitan-0.3.0-presets.json")


def _records():
    with open(FIXTURE) as f:
        return json.load(f)["records"]


RECORDS = _records()
IDS = [f"{r['preset']} {' '.join(r['args'])}" for r in RECORDS]


def _tt_shapes(record):
    return {p["name"]: p["shape"] for p in record["torchtitan"]["params"]}


def test_every_family_and_both_layouts_are_recorded():
    assert sorted({r["preset"] for r in RECORDS}) == sorted(families.FAMILIES)
    assert {r["family"] for r in RECORDS} == set(families.FAMILIES.values())
    assert len(RECORDS) == 2 * len(families.FAMILIES)


@pytest.mark.parametrize("record", RECORDS, ids=IDS)
def test_torchtitans_params_hold_the_layout_once(record):
    layout, tt = record["tally_layout"], record["torchtitan"]
    holds = families.segments(layout["model"], layout["params"])
    assert {name: [list(s) for s in segs] for name, segs in holds.items()} == \
        {p["name"]: p["holds"] for p in tt["params"]}
    families.check_cover(holds, _tt_shapes(record), layout["params"])  # raises on a gap or an overlap
    for p in tt["params"]:
        size = 1
        for s in p["shape"]:
            size *= s
        assert p["numel"] == size, p["name"]
    assert tt["total_elements"] == layout["total_elements"] == sum(p["numel"] for p in layout["params"])


@pytest.mark.parametrize("record", RECORDS[:2] + RECORDS[-2:], ids=IDS[:2] + IDS[-2:])
def test_a_row_held_twice_or_by_none_is_caught(record):
    layout = record["tally_layout"]
    holds = families.segments(layout["model"], layout["params"])
    name = next(n for n, segs in holds.items() if len(segs) == 1 and segs[0].end > 1)
    s = holds[name][0]
    doubled = dict(holds, **{name: [Segment(s.begin, s.end - 1, s.logical, s.logical_begin),
                                    Segment(s.end - 1, s.end, s.logical, s.logical_begin)]})
    with pytest.raises(LookupError, match="twice"):
        families.check_cover(doubled, _tt_shapes(record), layout["params"])
    gap = dict(holds, **{name: [Segment(s.begin, s.end - 1, s.logical, s.logical_begin),
                                Segment(s.end - 1, s.end, s.logical, s.logical_begin + 1)]})
    with pytest.raises(LookupError, match="by no torchtitan param|rows"):
        families.check_cover(gap, _tt_shapes(record), layout["params"])
    fewer = {n: shape for n, shape in _tt_shapes(record).items() if n != name}
    with pytest.raises(LookupError, match="lacks"):
        families.check_cover(holds, fewer, layout["params"])


def test_a_preset_without_a_torchtitan_family_is_named():
    with pytest.raises(LookupError, match="'mixtral'.*deepseek-v3, gpt-oss, llama3, qwen3-moe"):
        families.family_of({"preset": "mixtral"})
    with pytest.raises(LookupError, match="None"):
        families.family_of({})


@pytest.mark.parametrize("record", RECORDS, ids=IDS)
def test_tally_layout_is_the_recorded_one(record, tally):
    out = subprocess.run([tally, "layout", "--preset", record["preset"], *record["args"], "--json"], check=True,
                         capture_output=True, text=True).stdout
    layout = json.loads(out)
    assert layout["model"] == record["tally_layout"]["model"]
    assert [{"name": p["name"], "shape": p["shape"], "numel": p["numel"]} for p in layout["params"]] == \
        record["tally_layout"]["params"]
    # The live layout, mapped afresh, is held once by the recorded torchtitan params.
    families.check_cover(families.segments(layout["model"], layout["params"]), _tt_shapes(record), layout["params"])


@pytest.mark.parametrize("record", RECORDS, ids=IDS)
def test_torchtitans_model_is_the_recorded_one(record):
    # A submodule: under ci/python-test's rootdir this folder imports as a namespace package named
    # torchtitan where the real one is not installed.
    pytest.importorskip("torchtitan.models.common")
    import torchtitan

    layout = record["tally_layout"]
    built = families.model_config(layout["model"], layout["params"]).build()
    assert torchtitan.__version__ == record["torchtitan"]["version"]
    live = families.inventory(built)
    assert live == [{k: p[k] for k in ("name", "shape", "numel")} for p in record["torchtitan"]["params"]]
    families.check_cover(families.segments(layout["model"], layout["params"]),
                         {p["name"]: p["shape"] for p in live}, layout["params"])


@pytest.mark.parametrize("record", RECORDS, ids=IDS)
def test_each_shards_pieces_are_the_logical_boxes_it_holds(record):
    """The worker's manifest pieces of a torchtitan param's shard (split in two along dim 0, or along
    an expert stack's dim 0 or 1, as EP, TP and FSDP split them): each piece's flat elements of the
    shard are the values of the logical box it names, and the boxes of all shards tile every logical
    param once."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    import tally_adapters.torchtitan.worker as torchtitan_worker

    layout = record["tally_layout"]
    shapes = {p["name"]: p["shape"] for p in layout["params"]}
    holds = families.segments(layout["model"], layout["params"])
    values, start = {}, 0
    for name, shape in shapes.items():  # every logical element a distinct value
        size = int(np.prod(shape))
        values[name] = np.arange(start, start + size, dtype=np.float32).reshape(shape)
        start += size
    for split in (0, 1):
        seen = {name: np.zeros(shape, dtype=int) for name, shape in shapes.items()}
        for tt in record["torchtitan"]["params"]:
            name, shape = tt["name"], tt["shape"]
            stacked = families.stacked(name)
            dim = split if stacked else 0
            full = families.assemble(name, shape, holds[name], values.__getitem__)
            param = torch.nn.Parameter(torch.from_numpy(full))
            parts = 2 if shape[dim] % 2 == 0 else 1
            for part in range(parts):
                offsets, extents = [0] * len(shape), list(shape)
                offsets[dim], extents[dim] = part * shape[dim] // parts, shape[dim] // parts
                local = full[tuple(slice(o, o + e) for o, e in zip(offsets, extents))].reshape(-1)
                pieces = torchtitan_worker.pieces_of([(name, param)], {id(param): (full, holds[name], stacked)},
                                                     {id(param): (offsets, extents)}, shapes)
                assert sorted((p.begin, p.end) for p in pieces)[0][0] == 0
                assert sum(p.end - p.begin for p in pieces) == local.size
                for p in pieces:
                    box = tuple(slice(o, o + e) for o, e in zip(p.offsets, p.extents))
                    assert p.logical_shape == shapes[p.logical_name]
                    assert np.array_equal(local[p.begin:p.end], values[p.logical_name][box].reshape(-1)), p.name
                    seen[p.logical_name][box] += 1
        for name, counts in seen.items():
            assert (counts == 1).all(), f"{name} split along {split}: counted {counts.min()} to {counts.max()} times"
