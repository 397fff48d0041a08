"""tally's architecture presets as the Hugging Face transformers model classes of their families,
and which of tally's logical elements each Hugging Face param holds: an element map.

A preset (`tally layout --preset X`) names a family: llama3 is a `LlamaForCausalLM`, mixtral a
`MixtralForCausalLM`, qwen3-moe a `Qwen3MoeForCausalLM`, gpt-oss a `GptOssForCausalLM`,
deepseek-v3 a `DeepseekV3ForCausalLM`. `hf_config` is the family's config at the sizes of tally's
layout of the case (its model section and gradient index); `element_map` gives, for every param of
that model, an integer array of its shape whose entries are tally's logical elements it holds
(`element_ids`: each logical param's elements numbered in index order, row-major). A map that holds
every element of the layout exactly once is a bijection, so a norm over the Hugging Face params
counts each of tally's elements once; `check_bijection` says where it is not.

The dense parts hold whole rows, as tally_adapters.hf_models lays a dense GPT out (q, k, v
projections the query, key and value rows of `linear_qkv`; gate and up projections the two halves
of `linear_fc1`). The experts are transformers 5's fused tensors, one slice per expert:
`gate_up_proj[e]` is expert e's `linear_fc1` (gate rows, then up rows) and `down_proj[e]` its
`linear_fc2`, except in gpt-oss, whose experts compute `x @ W`: its `gate_up_proj[e]` is
`linear_fc1` transposed with gate and up columns interleaved (modeling_gpt_oss.py `_apply_gate`:
`gate_up[..., ::2], gate_up[..., 1::2]`), its `down_proj[e]` `linear_fc2` transposed.
Multi-latent attention maps param for param (q_a_proj is `linear_q_down_proj`, q_a_layernorm the
layernorm of `linear_q_up_proj`, kv_a_proj_with_mqa `linear_kv_down_proj`, ...).

What a family's class does not build is `absent`, not mapped: transformers' DeepseekV3ForCausalLM
has no multi-token-prediction layers (transformers 5.18.0 builds them only for speculative decoding,
in `MtpModel`, modeling_layers.py:360, outside the model that trains), so tally's `mtp.*` params have no
place in it. No torch or transformers import at module level.
"""

from __future__ import annotations

import re
from typing import Dict, List, NamedTuple, Sequence

# preset -> (transformers class, what the class does not build: a pattern over tally's names, why)
FAMILIES = {
    "llama3": ("LlamaForCausalLM", None, ""),
    "mixtral": ("MixtralForCausalLM", None, ""),
    "qwen3-moe": ("Qwen3MoeForCausalLM", None, ""),
    "gpt-oss": ("GptOssForCausalLM", None, ""),
    "deepseek-v3": ("DeepseekV3ForCausalLM", re.compile(r"^mtp\."),
                    "transformers' DeepseekV3ForCausalLM builds no multi-token-prediction layers "
                    "(transformers 5.18.0 builds them in MtpModel, modeling_layers.py:360, for speculative decoding only)"),
}

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.(weight|bias)$")

# tally's name within a layer -> the Hugging Face name within `model.layers.N.`, param for param.
_SAME = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.linear_proj.bias": "self_attn.o_proj.bias",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "self_attention.core_attention.softmax_offset": "self_attn.sinks",
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.linear_q_up_proj.layer_norm_weight": "self_attn.q_a_layernorm.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.linear_kv_up_proj.layer_norm_weight": "self_attn.kv_a_layernorm.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.linear_fc2.bias": "mlp.down_proj.bias",
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.down_proj.weight",
}
_TOP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


class ElementMap(NamedTuple):
    """`params`: Hugging Face param name -> an int64 array of its shape, each entry the id of the
    logical element it holds (element_ids); `absent`: tally's params the family's class does not
    build, and `why`."""

    params: Dict[str, object]
    absent: List[str]
    why: str


def preset_of(model: Dict) -> str:
    """The case's preset, one FAMILIES knows."""
    preset = model.get("preset")
    if preset not in FAMILIES:
        raise LookupError(f"model mismatch: preset {preset!r} has no Hugging Face family here "
                          f"(known: {', '.join(FAMILIES)})")
    return preset


def class_name(model: Dict) -> str:
    return FAMILIES[preset_of(model)][0]


def _shapes(index: Sequence[Dict]) -> Dict[str, List[int]]:
    return {p["name"]: [int(d) for d in p["shape"]] for p in index}


def element_ids(index: Sequence[Dict]) -> Dict[str, object]:
    """Each logical param's elements numbered consecutively in the index's order (row-major)."""
    import numpy as np

    out, at = {}, 0
    for p in index:
        n = int(np.prod(p["shape"], dtype=np.int64))
        out[p["name"]] = np.arange(at, at + n, dtype=np.int64).reshape([int(d) for d in p["shape"]])
        at += n
    return out


def _layers(shapes: Dict[str, List[int]]) -> Dict[int, Dict[str, List[int]]]:
    out: Dict[int, Dict[str, List[int]]] = {}
    for name, shape in shapes.items():
        hit = _LAYER.match(name)
        if hit:
            out.setdefault(int(hit.group(1)), {})[hit.group(2)] = shape
    return out


def dimensions(model: Dict, index: Sequence[Dict]) -> Dict:
    """The sizes a family's config needs, read from the case's model and checked against its index."""
    shapes = _shapes(index)
    layers = _layers(shapes)
    hidden = int(model["hidden_size"])
    heads = int(model["num_attention_heads"])
    d = {
        "hidden": hidden,
        "heads": heads,
        "groups": int(model.get("num_query_groups") or heads),
        "head_dim": int(model.get("kv_channels") or hidden // heads),
        "layers": int(model["num_layers"]),
        "vocab": int(shapes["embedding.word_embeddings.weight"][0]),
        "ffn": int(model["ffn_hidden_size"]),
        "experts": int(model.get("num_experts") or 0),
        "moe_ffn": int(model.get("moe_ffn_hidden_size") or 0),
        "shared_ffn": int(model.get("moe_shared_expert_intermediate_size") or 0),
        "bias": bool(model["add_bias_linear"]),
        "tied": not model["untie_embeddings_and_output_weights"],
        "mtp": int(model.get("mtp_num_layers") or 0),
        # A layer is MoE where tally's layout gives it a router (Megatron's moe_layer_freq, as laid out).
        "moe_layers": sorted(n for n, rest in layers.items() if "mlp.router.weight" in rest),
    }
    if len(layers) != d["layers"]:
        raise LookupError(f"model mismatch: the index has layers {sorted(layers)}, the model {d['layers']}")
    if model.get("multi_latent_attention"):
        d.update(q_lora=int(model["q_lora_rank"]), kv_lora=int(model["kv_lora_rank"]),
                 qk_head=int(model["qk_head_dim"]), qk_rope=int(model["qk_pos_emb_head_dim"]),
                 v_head=int(model["v_head_dim"]))
    else:
        qkv = layers[0].get("self_attention.linear_qkv.weight")
        want = [(heads + 2 * d["groups"]) * d["head_dim"], hidden]
        if qkv != want:
            raise LookupError(f"model mismatch: linear_qkv is {qkv}; heads {heads}, groups {d['groups']}, "
                              f"head dim {d['head_dim']} give {want}")
    return d


def hf_config(model: Dict, index: Sequence[Dict]):
    """The transformers config of the preset's family at the sizes of tally's layout, fp32, one
    expert per token (routing does not change which params there are)."""
    import transformers

    preset = preset_of(model)
    d = dimensions(model, index)
    dense = [n for n in range(d["layers"]) if n not in d["moe_layers"]]
    common = dict(vocab_size=d["vocab"], hidden_size=d["hidden"], num_hidden_layers=d["layers"],
                  num_attention_heads=d["heads"], max_position_embeddings=int(model["max_position_embeddings"]),
                  tie_word_embeddings=d["tied"], torch_dtype="float32")
    gqa = dict(num_key_value_heads=d["groups"], head_dim=d["head_dim"])
    if preset == "llama3":
        return transformers.LlamaConfig(intermediate_size=d["ffn"], attention_bias=d["bias"], mlp_bias=d["bias"],
                                        **gqa, **common)
    if preset in ("mixtral", "gpt-oss") and dense:
        raise LookupError(f"model mismatch: layers {dense} are dense; every layer of a {class_name(model)} is MoE")
    if preset == "mixtral":
        return transformers.MixtralConfig(intermediate_size=d["moe_ffn"], num_local_experts=d["experts"],
                                          num_experts_per_tok=1, **gqa, **common)
    if preset == "qwen3-moe":
        return transformers.Qwen3MoeConfig(intermediate_size=d["ffn"], moe_intermediate_size=d["moe_ffn"],
                                           num_experts=d["experts"], num_experts_per_tok=1, decoder_sparse_step=1,
                                           mlp_only_layers=dense, attention_bias=d["bias"], **gqa, **common)
    if preset == "gpt-oss":
        # rope as plain rotary: the family's YaRN scaling holds no params and warns at these sizes
        return transformers.GptOssConfig(intermediate_size=d["moe_ffn"], num_local_experts=d["experts"],
                                         num_experts_per_tok=1, attention_bias=d["bias"],
                                         rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
                                         **gqa, **common)
    # deepseek-v3: its first k layers dense, the rest MoE with shared experts of n x the expert size
    k = len(dense)
    if dense != list(range(k)):
        raise LookupError(f"model mismatch: dense layers {dense}; a DeepseekV3ForCausalLM's dense layers are its "
                          "first k (first_k_dense_replace)")
    if d["moe_ffn"] == 0 or d["shared_ffn"] % d["moe_ffn"]:
        raise LookupError(f"model mismatch: shared experts of {d['shared_ffn']} are not a whole number of experts "
                          f"of {d['moe_ffn']} (n_shared_experts)")
    return transformers.DeepseekV3Config(
        intermediate_size=d["ffn"], moe_intermediate_size=d["moe_ffn"], n_routed_experts=d["experts"],
        n_shared_experts=d["shared_ffn"] // d["moe_ffn"], num_experts_per_tok=1, n_group=1, topk_group=1,
        first_k_dense_replace=k, num_key_value_heads=d["heads"], q_lora_rank=d["q_lora"],
        kv_lora_rank=d["kv_lora"], qk_nope_head_dim=d["qk_head"], qk_rope_head_dim=d["qk_rope"],
        v_head_dim=d["v_head"], num_mtp_layers=d["mtp"], **common)


def build_model(model: Dict, index: Sequence[Dict], dtype=None):
    """The family's transformers model at tally's sizes (its values transformers' initialization)."""
    import transformers

    cls = getattr(transformers, class_name(model))
    module = cls(hf_config(model, index))
    return module if dtype is None else module.to(dtype)


def element_map(model: Dict, index: Sequence[Dict]) -> ElementMap:
    """Where tally's logical elements lie in the family's params. Raises LookupError for a logical
    param the family has no place for (other than what it is known not to build)."""
    import numpy as np

    preset = preset_of(model)
    _, lacks, why = FAMILIES[preset]
    d = dimensions(model, index)
    ids = element_ids(index)
    gpt_oss = preset == "gpt-oss"
    params: Dict[str, object] = {}
    experts: Dict[str, Dict[int, object]] = {}
    absent: List[str] = []
    q_rows, kv_rows = d["heads"] * d["head_dim"], d["groups"] * d["head_dim"]

    def halves(prefix: str, fc1, rows: int) -> None:
        params[prefix + "gate_proj." + kind] = fc1[:rows]
        params[prefix + "up_proj." + kind] = fc1[rows:2 * rows]

    for name, e in ids.items():
        layer = _LAYER.match(name)
        if name in _TOP:
            params[_TOP[name]] = e
            continue
        if lacks is not None and lacks.match(name):
            absent.append(name)
            continue
        if not layer:
            raise LookupError(f"model mismatch: a {class_name(model)} has no place for {name}")
        prefix, rest = f"model.layers.{layer.group(1)}.", layer.group(2)
        kind = rest.rsplit(".", 1)[-1]
        expert = _EXPERT.match(rest)
        if rest in _SAME:
            params[prefix + _SAME[rest]] = e
        elif rest.startswith("self_attention.linear_qkv."):
            params[prefix + f"self_attn.q_proj.{kind}"] = e[:q_rows]
            params[prefix + f"self_attn.k_proj.{kind}"] = e[q_rows:q_rows + kv_rows]
            params[prefix + f"self_attn.v_proj.{kind}"] = e[q_rows + kv_rows:q_rows + 2 * kv_rows]
        elif rest.startswith("mlp.linear_fc1."):
            halves(prefix + "mlp.", e, d["ffn"])
        elif rest == "mlp.shared_experts.linear_fc1.weight":
            halves(prefix + "mlp.shared_experts.", e, d["shared_ffn"])
        elif rest.startswith("mlp.router."):
            params[prefix + ("mlp.router." if gpt_oss else "mlp.gate.") + kind] = e
        elif expert:
            number, fc, kind = int(expert.group(1)), expert.group(2), expert.group(3)
            if fc == "linear_fc1":
                f = d["moe_ffn"]
                if gpt_oss:  # x @ W, gate and up interleaved: column 2k + s is row s * f + k
                    order = np.stack([np.arange(f), f + np.arange(f)], axis=1).reshape(-1)
                    e = e[order].T if kind == "weight" else e[order]
                hf = "gate_up_proj" if kind == "weight" else "gate_up_proj_bias"
            else:
                if gpt_oss and kind == "weight":
                    e = e.T
                hf = "down_proj" if kind == "weight" else "down_proj_bias"
            experts.setdefault(prefix + "mlp.experts." + hf, {})[number] = e
        else:
            raise LookupError(f"model mismatch: a {class_name(model)} has no place for {name}")
    for hf, by_expert in experts.items():
        if sorted(by_expert) != list(range(d["experts"])):
            raise LookupError(f"model mismatch: {hf} stacks experts {sorted(by_expert)} of {d['experts']}")
        params[hf] = np.stack([by_expert[n] for n in range(d["experts"])])
    return ElementMap({k: np.ascontiguousarray(v) for k, v in params.items()}, absent, why if absent else "")


def check_bijection(emap: ElementMap, hf_shapes: Dict[str, Sequence[int]], index: Sequence[Dict]) -> None:
    """Raises LookupError unless the model's params are exactly the map's, each of its shape, and
    every element of tally's layout outside `absent` is held exactly once."""
    import numpy as np

    missing = sorted(set(emap.params) - set(hf_shapes))
    unmapped = sorted(set(hf_shapes) - set(emap.params))
    if missing or unmapped:
        raise LookupError(f"model mismatch: the model lacks {missing} and holds {unmapped}, which no logical "
                          "param of tally's layout is")
    for name, ids in emap.params.items():
        if list(ids.shape) != [int(s) for s in hf_shapes[name]]:
            raise LookupError(f"model mismatch: {name} is {list(hf_shapes[name])}, its logical elements "
                              f"{list(ids.shape)}")
    names = [p["name"] for p in index]
    starts = np.cumsum([0] + [int(np.prod(p["shape"], dtype=np.int64)) for p in index])
    expected = np.ones(int(starts[-1]), dtype=np.int64)  # how often each element is held: once, or
    for i, name in enumerate(names):                      # never where the family does not build it
        if name in emap.absent:
            expected[starts[i]:starts[i + 1]] = 0
    held = np.bincount(np.concatenate([ids.reshape(-1) for ids in emap.params.values()]), minlength=len(expected))
    wrong = np.flatnonzero(held != expected)
    if wrong.size:
        owners = sorted({names[int(i)] for i in np.searchsorted(starts, wrong, side="right") - 1})
        raise LookupError(f"model mismatch: {wrong.size} elements of {owners[:4]} are held other than once "
                          f"(or held where the family builds nothing)")


def runs(ids, names_and_starts) -> List[List]:
    """A map's entries, flat, as runs [logical name, first element, count, step]: the recorded
    form of an element map (fixtures)."""
    import numpy as np

    names, starts = names_and_starts
    flat = ids.reshape(-1)
    owner = np.searchsorted(starts, flat, side="right") - 1
    out: List[List] = []
    for i, v in enumerate(flat):
        name, at = names[int(owner[i])], int(v - starts[owner[i]])
        if out and out[-1][0] == name:
            last = out[-1]
            step = at - (last[1] + last[3] * (last[2] - 1))
            if last[2] == 1 or step == last[3]:
                last[3] = step if last[2] == 1 else last[3]
                last[2] += 1
                continue
        out.append([name, at, 1, 1])
    return out


def recorded(emap: ElementMap, index: Sequence[Dict]) -> Dict[str, List[List]]:
    """Every Hugging Face param's runs (runs), by name."""
    import numpy as np

    names = [p["name"] for p in index]
    starts = np.cumsum([0] + [int(np.prod(p["shape"])) for p in index])[:-1]
    return {name: runs(ids, (names, starts)) for name, ids in sorted(emap.params.items())}
