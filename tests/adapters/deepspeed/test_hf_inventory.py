"""Each architecture preset as DeepSpeed's users train it, a Hugging Face transformers model class
of its family (issue 50, item 4): the class's params hold tally's layout of the preset, every
element exactly once, but for what the family is known not to build (deepseek-v3's MTP layers).

Compared, per preset, with the recording in fixtures/hf-<preset>.json (record_hf_inventory.py):
- tally's layout (`tally layout --preset X --json`, where $TALLY names a tally) is the recorded one;
- the element map (tally_adapters.hf_families) of the recorded layout is the recorded one, and a
  bijection onto the layout less `absent`;
- the model transformers builds (where transformers is installed: DeepSpeed's environment,
  ci/real-deepspeed) has exactly the recorded params, names and shapes, and the map covers them;
- the experts' fused tensors put tally's gate rows where the family's forward reads its gate.
"""

import json
import os
import pathlib
import subprocess

import pytest

np = pytest.importorskip("numpy")
from tally_adapters import hf_families, hf_models  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
PRESETS = list(hf_families.FAMILIES)


@pytest.fixture
def tally():
    """The tally binary $TALLY names (ci/python-test, ci/real-deepspeed set it); skips where none."""
    binary = os.environ.get("TALLY")
    if not binary:
        pytest.skip("TALLY names no tally binary")
    return binary


def fixture(preset):
    return json.loads((FIXTURES / f"hf-{preset}.json").read_text())


def index_of(recorded):
    return [{"name": p["name"], "shape": p["shape"]} for p in recorded["layout"]]


def test_every_preset_has_a_fixture():
    assert sorted(f.name for f in FIXTURES.glob("hf-*.json")) == sorted(f"hf-{p}.json" for p in PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_layout_is_the_recorded_one(preset, tally):
    layout = json.loads(subprocess.check_output([tally, "layout", "--preset", preset, "--json"]))
    recorded = fixture(preset)
    assert layout["model"] == recorded["model"]
    assert [{"name": p["name"], "shape": p["shape"]} for p in layout["params"]] == recorded["layout"]
    assert layout["total_elements"] == recorded["elements"]["tally"]


@pytest.mark.parametrize("preset", PRESETS)
def test_element_map_is_the_recorded_bijection(preset):
    recorded = fixture(preset)
    index = index_of(recorded)
    emap = hf_families.element_map(recorded["model"], index)
    hf_families.check_bijection(emap, {p["name"]: p["shape"] for p in recorded["hf"]}, index)
    assert hf_families.recorded(emap, index) == {p["name"]: p["runs"] for p in recorded["hf"]}
    assert emap.absent == recorded["absent"]
    held = sum(int(np.prod(p["shape"])) for p in recorded["hf"])
    lacking = sum(int(np.prod(p["shape"])) for p in index if p["name"] in emap.absent)
    assert held == recorded["elements"]["hf"] == recorded["elements"]["tally"] - lacking


def test_deepseek_v3_lacks_exactly_its_mtp_layers():
    """The one difference between a family's class and tally's layout: transformers'
    DeepseekV3ForCausalLM trains no MTP layer, tally's deepseek-v3 has one (234 elements)."""
    recorded = fixture("deepseek-v3")
    mtp = [p["name"] for p in recorded["layout"] if p["name"].startswith("mtp.")]
    assert recorded["absent"] == mtp and len(mtp) == 20
    assert recorded["elements"] == {"tally": 618, "hf": 384}
    for preset in PRESETS:
        if preset != "deepseek-v3":
            assert fixture(preset)["absent"] == []


def test_a_doubly_held_element_is_found():
    recorded = fixture("llama3")
    index = index_of(recorded)
    emap = hf_families.element_map(recorded["model"], index)
    qkv = "model.layers.0.self_attn.k_proj.weight"
    emap.params[qkv] = emap.params["model.layers.0.self_attn.q_proj.weight"][:2].copy()  # q's rows twice, k's none
    with pytest.raises(LookupError, match="linear_qkv"):
        hf_families.check_bijection(emap, {p["name"]: p["shape"] for p in recorded["hf"]}, index)


def test_llama3_map_is_hf_models_dense_map():
    """The dense family's rows are where tally_adapters.hf_models (the Automodel worker's map) puts them."""
    recorded = fixture("llama3")
    index = index_of(recorded)
    emap = hf_families.element_map(recorded["model"], index)
    ids = hf_families.element_ids(index)
    segments = hf_models.segments(recorded["model"], index)
    assert sorted(segments) == sorted(emap.params)
    for hf, pieces in segments.items():
        rows = np.concatenate([ids[s.logical][s.logical_begin:s.logical_begin + s.end - s.begin] for s in pieces])
        assert np.array_equal(rows, emap.params[hf])


@pytest.mark.parametrize("preset", PRESETS)
def test_transformers_builds_the_recorded_params(preset):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    recorded = fixture(preset)
    assert transformers.__version__ == recorded["transformers"]
    module = hf_families.build_model(recorded["model"], index_of(recorded))
    assert type(module).__name__ == recorded["class"]
    assert [{"name": n, "shape": list(p.shape)} for n, p in module.named_parameters()] == \
        [{"name": p["name"], "shape": p["shape"]} for p in recorded["hf"]]


@pytest.mark.parametrize("preset", ["mixtral", "qwen3-moe", "gpt-oss", "deepseek-v3"])
def test_family_reads_the_gate_from_tally_gate_rows(preset):
    """Expert 1's projections filled from tally's linear_fc1 (gate rows, then up rows) and
    linear_fc2 through the map: the family's own experts module gives act(x W_gate^T) * (x W_up^T)
    W_fc2^T, the SwiGLU of tally's expert, on one token routed to it."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    recorded = fixture(preset)
    index = index_of(recorded)
    module = hf_families.build_model(recorded["model"], index)
    module.config._experts_implementation = "eager"  # the family's own loop over experts, on any CPU
    emap = hf_families.element_map(recorded["model"], index)
    rng = np.random.default_rng(7)
    values = {p["name"]: rng.standard_normal(p["shape"]).astype(np.float32) for p in index}
    flat = np.concatenate([values[p["name"]].reshape(-1) for p in index])
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, ids in emap.params.items():
            params[name].copy_(torch.from_numpy(flat[ids]))
    layer = max(int(p["name"].split(".")[2]) for p in index if p["name"].endswith("mlp.router.weight"))
    prefix = f"decoder.layers.{layer}.mlp.experts.local_experts.1."
    fc1, fc2 = values[prefix + "linear_fc1.weight"], values[prefix + "linear_fc2.weight"]
    experts = module.model.layers[layer].mlp.experts
    x = torch.from_numpy(rng.standard_normal((1, fc1.shape[1])).astype(np.float32))
    f = fc1.shape[0] // 2
    gate, up = x.numpy() @ fc1[:f].T, x.numpy() @ fc1[f:].T
    if preset == "gpt-oss":  # its own gate: clamped, x * sigmoid(1.702 x), times (up + 1), with biases
        bias1, bias2 = values[prefix + "linear_fc1.bias"], values[prefix + "linear_fc2.bias"]
        g, u = np.minimum(gate + bias1[:f], 7.0), np.clip(up + bias1[f:], -7.0, 7.0)
        want = ((u + 1) * g / (1 + np.exp(-1.702 * g))) @ fc2.T + bias2
    else:
        want = (gate / (1 + np.exp(-gate)) * up) @ fc2.T
    got = experts(x, torch.tensor([[1]]), torch.tensor([[1.0]]))
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-5)
