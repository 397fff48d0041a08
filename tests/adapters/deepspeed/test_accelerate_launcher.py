"""One case run through both engine builders gives the same verdict (issue 52): each seeds/real case
with `deepspeed.launcher accelerate` or `trainer` is run again with the launcher DeepSpeed's own
(deepspeed.initialize), and both give the same verdict, the same reported norm (accelerate's
clip_grad_norm_, and the Trainer's _get_grad_norm, return the engine's get_global_grad_norm()) and
the same miscounted params. The launcher's side is the case's saved run (`tally check` of its
manifests), which ci/real-deepspeed re-executes through that launcher in the same job and holds to
the verdict the case records; so each case starts one worker here, not two.

Runs the real DeepSpeed and accelerate through $TALLY (ci/real-deepspeed sets it; skips where none).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")  # runs in ci/real-deepspeed's environment, not ci/python-test's
pytest.importorskip("accelerate")

SEEDS = Path(__file__).resolve().parents[3] / "seeds" / "real"
CASES = sorted(p for p in SEEDS.glob("deepspeed-*.json")
               if not p.name.endswith(".finding.json")
               and json.loads(p.read_text()).get("deepspeed", {}).get("launcher") in ("accelerate", "trainer"))


@pytest.fixture
def tally():
    binary = os.environ.get("TALLY")
    if not binary:
        pytest.skip("TALLY names no tally binary")
    return binary


def verdict(tally, case, tmp_path, launcher):
    """`tally run --json` of `case` with its launcher set to `launcher` (its saved manifests and
    expectation left out: a fresh run)."""
    doc = json.loads(case.read_text())
    doc["deepspeed"]["launcher"] = launcher
    for key in ("target", "expect"):
        doc.pop(key, None)
    path = tmp_path / f"{launcher}.json"
    path.write_text(json.dumps(doc))
    run = subprocess.run([tally, "run", str(path), "--target", "deepspeed", "--json", "--case-timeout", "300s"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode in (0, 1), run.stderr[-2000:]
    return json.loads(run.stdout)


def launcher_of(case):
    return json.loads(case.read_text())["deepspeed"]["launcher"]


def test_there_are_cases_through_accelerate_and_the_trainer():
    for launcher in ("accelerate", "trainer"):
        outcomes = {json.loads(p.read_text())["expect"]["outcome"] for p in CASES if launcher_of(p) == launcher}
        assert outcomes == {"pass", "fail"}, f"seeds/real holds a pass and a known-finding fail through {launcher}"


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_accelerate_gives_the_verdict_and_norm_of_deepspeed_initialize(tally, case, tmp_path):
    if json.loads(case.read_text())["gradients"]["dtype"] == "fp16":
        import torch

        if not torch.ops.mkldnn._is_mkldnn_fp16_supported():
            pytest.skip("fp16 on CPUs without fp16 (ci/real-deepspeed skips such seeds too)")
    saved = subprocess.run([tally, "check", str(SEEDS / json.loads(case.read_text())["target"]["manifests"]), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert saved.returncode in (0, 1), saved.stderr[-2000:]
    through_accelerate = json.loads(saved.stdout)
    through_deepspeed = verdict(tally, case, tmp_path, "deepspeed")
    assert through_accelerate["verdict"] == through_deepspeed["verdict"]
    assert through_accelerate["verdict"] == json.loads(case.read_text())["expect"]["outcome"]
    assert through_accelerate["stats"]["l2"]["got"] == through_deepspeed["stats"]["l2"]["got"]
    assert miscounted(through_accelerate) == miscounted(through_deepspeed)


def miscounted(result):
    """Each miscounted param, its class and how often it was counted of how often expected, in name
    order (`tally check` and `tally run` list them from different ranks' views)."""
    return sorted((m["param"], m["class"], m["counted"], m["expected"]) for m in result["miscounted"])
