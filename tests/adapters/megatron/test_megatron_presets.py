"""The presets megatron-core builds, param for param: tally's layout of each preset at world 1
(`tally layout --preset P --world 1 --json`) is recorded in preset_inventory.json, and both sides are
held against that record. tally's side runs in ci/python-test; megatron-core's side builds each
preset with the worker's own build (Megatron's local layer spec, GPTModel, DDP) on one gloo rank and
needs megatron-core 0.19.2 (Python 3.12) and a GPU: .devbin-style GPU scripts run it, and it is
skipped where megatron.core is not installed.

After a deliberate change to a preset: `TALLY=build/cli/tally python3
tests/adapters/megatron/test_megatron_presets.py --record` rewrites the record.

deepseek-v3 is not here: its multi-latent attention does not build on the local spec
(run/megatron_core/rules.cpp cites the TypeError), so megatron-core refuses every case of it."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RECORD = HERE / "preset_inventory.json"
PRESETS = ("llama3", "mixtral", "qwen3-moe", "gpt-oss")
# What a world-1 case needs beside its model, as the worker reads a case (build.py).
TOPOLOGY = {"world": 1, "tp": 1, "cp": 1, "pp": 1, "ep": 1, "etp": 1, "vpp": 1, "order": "tp-cp-ep-dp-pp",
            "dist_opt_instances": 1}
OPTIMIZER = {"model": "plain", "bucket_elements": 0}


def tally_layout(tally, preset):
    """(model section, [[name, shape], ...] in tally's order) of tally's layout of `preset` at world 1."""
    out = subprocess.run([tally, "layout", "--preset", preset, "--world", "1", "--json"], check=True,
                         capture_output=True, text=True).stdout
    layout = json.loads(out)
    return layout["model"], [[p["name"], p["shape"]] for p in layout["params"]]


def recorded():
    return json.loads(RECORD.read_text())


@pytest.mark.parametrize("preset", PRESETS)
def test_tallys_layout_of_the_preset_is_the_recorded_one(tally, preset):
    model, params = tally_layout(tally, preset)
    record = recorded()[preset]
    assert model == record["model"], f"{preset}'s model section changed: record it again (see the module's doc)"
    assert params == record["params"], f"{preset}'s params changed: record it again (see the module's doc)"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_rank():
    """torch.distributed over gloo with this process as its one rank, on GPU 0."""
    pytest.importorskip("megatron.core.models.gpt")
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        pytest.skip("the worker builds Megatron's model on a GPU")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.set_device(0)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("preset", PRESETS)
def test_megatron_core_builds_exactly_the_recorded_params(one_rank, preset):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from tally_adapters.megatron import build

    record = recorded()[preset]
    case = {"topology": dict(TOPOLOGY), "model": record["model"], "optimizer": dict(OPTIMIZER)}
    ps.initialize_model_parallel(**build.parallel_state_arguments(case["topology"]))
    try:
        model_parallel_cuda_manual_seed(1234)
        chunks = build.build_model(case, build.transformer_config(case))
        gpt = chunks[0].module.module  # DDP -> Float16Module -> GPTModel
        built = sorted([name, list(p.shape)] for name, p in gpt.named_parameters())
    finally:
        ps.destroy_model_parallel()
    assert built == sorted(record["params"]), (
        f"{preset}: megatron-core builds {len(built)} params, tally lays out {len(record['params'])}; "
        f"only megatron's: {[b for b in built if b not in record['params']]}; "
        f"only tally's: {[r for r in record['params'] if r not in built]}")


def record_again(tally):
    inventory = {}
    for preset in PRESETS:
        model, params = tally_layout(tally, preset)
        inventory[preset] = {"model": model, "params": params}
    RECORD.write_text(json.dumps(inventory, indent=1) + "\n")
    print(f"recorded {', '.join(PRESETS)} from {tally} into {RECORD}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"] or not os.environ.get("TALLY"):
        sys.exit("usage: TALLY=build/cli/tally python3 tests/adapters/megatron/test_megatron_presets.py --record")
    record_again(os.environ["TALLY"])
