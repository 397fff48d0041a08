"""The DeepSpeed worker's preset cases as transformers' model classes
(tally_adapters/deepspeed/families.py): which cases take that path, how a shard's positions become
tally's logical elements, and how those become the manifest's pieces. The whole path on DeepSpeed
is seeds/real's deepspeed-0.19.8-gpt-oss-hf-class-*, re-executed by ci/real-deepspeed."""

import json
import pathlib

import pytest

np = pytest.importorskip("numpy")
from tally_adapters import hf_families  # noqa: E402
from tally_adapters.deepspeed.families import _box_pieces, describe_family, uses_family  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def recorded(preset):
    f = json.loads((FIXTURES / f"hf-{preset}.json").read_text())
    return f["model"], [{"name": p["name"], "shape": p["shape"]} for p in f["layout"]]


def case(preset="llama3", tp=1, pp=1, ep=1, experts=0, **deepspeed):
    return {"model": {"preset": preset, "num_experts": experts}, "topology": {"tp": tp, "pp": pp, "ep": ep},
            "deepspeed": {"zero_stage": 1, **deepspeed}}


def test_which_cases_are_built_as_the_family_class():
    assert uses_family(case())
    assert uses_family(case(tp=2, autotp=True))
    assert not uses_family(case(tp=2))  # TP without AutoTP: the Megatron-DeepSpeed model
    assert not uses_family(case(pp=2))
    assert not uses_family(case(autoep=True, experts=2))
    assert not uses_family(case(experts=2, ep=2))  # experts over EP: DeepSpeed's MoE layer
    assert uses_family(case(experts=2, ep=1))
    assert not uses_family(case(zero_stage=3))
    assert not uses_family(case(preset=None))


def test_pieces_of_whole_params_are_their_rows():
    model, index = recorded("llama3")
    emap = hf_families.element_map(model, index)
    k = _box_pieces(emap.params["model.layers.0.self_attn.k_proj.weight"].reshape(-1), index)
    assert k == [{"logical_name": "decoder.layers.0.self_attention.linear_qkv.weight", "logical_shape": [8, 4],
                  "offsets": [4, 0], "extents": [2, 4], "local": (0, 8)}]
    norm = _box_pieces(emap.params["model.norm.weight"].reshape(-1), index)
    assert norm == [{"logical_name": "decoder.final_layernorm.weight", "logical_shape": [4], "offsets": [0],
                     "extents": [4], "local": (0, 4)}]


def test_pieces_of_a_transposed_expert_tile_it_and_hold_each_element_once():
    model, index = recorded("gpt-oss")
    emap = hf_families.element_map(model, index)
    ids = emap.params["model.layers.0.mlp.experts.down_proj"].reshape(-1)
    pieces = _box_pieces(ids, index)
    assert [p["local"] for p in pieces] == [(i, i + 1) for i in range(ids.size)]  # transposed: element by element
    boxes = {(p["logical_name"], tuple(p["offsets"])) for p in pieces}
    assert len(boxes) == ids.size == 16
    assert {name for name, _ in boxes} == {f"decoder.layers.0.mlp.experts.local_experts.{e}.linear_fc2.weight"
                                           for e in (0, 1)}


def test_a_shard_names_the_elements_it_kept():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tally_adapters.deepspeed.families import build_family_model

    model, index = recorded("llama3")
    module, emap = build_family_model({"model": model}, index, torch.bfloat16)

    class Cut(torch.nn.Module):  # rows 2 and 3 of gate_proj, as a TP rank of AutoTP's would hold them
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(dict(module.named_parameters())["model.layers.0.mlp.gate_proj.weight"][2:4])

        def named_parameters(self, *args, **kwargs):
            yield "model.layers.0.mlp.gate_proj.weight", self.p

    cut = Cut()
    held = describe_family(cut, emap, index)
    assert np.array_equal(held[id(cut.p)], emap.params["model.layers.0.mlp.gate_proj.weight"][2:4])
    with torch.no_grad():
        cut.p[1] = cut.p[0]  # a position twice: not a cut of the param
    with pytest.raises(LookupError, match="not a cut"):
        describe_family(cut, emap, index)
