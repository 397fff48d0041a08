"""tally's GPT family as the Hugging Face architecture of its shape, and where each of tally's
logical params (Megatron's names, the request's gradient index) lies in that model's params.

A dense GPT with RMSNorm, rotary positions and a gated MLP is a Llama (`LlamaConfig`: separate
q/k/v projections, gate and up projections, linear biases on attention and MLP together); with
qk-layernorm it is a Qwen3 (`q_norm`, `k_norm` of one head's width). Each Hugging Face param holds
whole rows of one logical param: q_proj, k_proj and v_proj the query, key and value rows of
`linear_qkv`, gate_proj and up_proj the two halves of `linear_fc1`; the others are one logical
param each. Any such bijection counts every element once; which rows are which is the framework's
business, not the norm's. No torch or transformers import at module level.
"""

from __future__ import annotations

import re
from typing import Dict, List, NamedTuple, Sequence, Tuple

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


class Segment(NamedTuple):
    """Rows [begin, end) of a Hugging Face param (dim 0) are rows [logical_begin, ...) of `logical`."""

    begin: int
    end: int
    logical: str
    logical_begin: int


def architecture(model: Dict) -> str:
    """"qwen3" (qk-layernorm) or "llama"."""
    return "qwen3" if model["qk_layernorm"] else "llama"


def _shapes(index: Sequence[Dict]) -> Dict[str, List[int]]:
    return {p["name"]: list(p["shape"]) for p in index}


def dimensions(model: Dict, index: Sequence[Dict]) -> Dict[str, int]:
    """The sizes a Hugging Face config needs, read from the case's model and checked against the
    shapes of its gradient index."""
    shapes = _shapes(index)
    hidden = int(model["hidden_size"])
    heads = int(model["num_attention_heads"])
    groups = int(model.get("num_query_groups") or heads)
    head_dim = int(model.get("kv_channels") or hidden // heads)
    qkv = shapes.get("decoder.layers.0.self_attention.linear_qkv.weight")
    fc2 = shapes.get("decoder.layers.0.mlp.linear_fc2.weight")
    if qkv is None or fc2 is None:
        raise LookupError("model mismatch: the gradient index has no layer 0 attention or MLP for a Llama to hold")
    if qkv != [(heads + 2 * groups) * head_dim, hidden]:
        raise LookupError(f"model mismatch: linear_qkv is {qkv}, heads {heads}, groups {groups}, head dim {head_dim} "
                         f"give {[(heads + 2 * groups) * head_dim, hidden]}")
    return {
        "hidden": hidden,
        "heads": heads,
        "groups": groups,
        "head_dim": head_dim,
        "ffn": int(fc2[1]),
        "layers": int(model["num_layers"]),
        "vocab": int(shapes["embedding.word_embeddings.weight"][0]),
    }


def hf_config(model: Dict, index: Sequence[Dict]):
    """The transformers config of the case's architecture, fp32."""
    d = dimensions(model, index)
    bias = bool(model["add_bias_linear"])
    common = dict(
        vocab_size=d["vocab"],
        hidden_size=d["hidden"],
        intermediate_size=d["ffn"],
        num_hidden_layers=d["layers"],
        num_attention_heads=d["heads"],
        num_key_value_heads=d["groups"],
        head_dim=d["head_dim"],
        max_position_embeddings=int(model["max_position_embeddings"]),
        attention_bias=bias,
        tie_word_embeddings=not model["untie_embeddings_and_output_weights"],
        torch_dtype="float32",
    )
    if architecture(model) == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common)
    from transformers import LlamaConfig

    return LlamaConfig(mlp_bias=bias, **common)


def segments(model: Dict, index: Sequence[Dict]) -> Dict[str, List[Segment]]:
    """Hugging Face param name -> the logical rows it holds, for every logical param of the index."""
    d = dimensions(model, index)
    q_rows, kv_rows, f = d["heads"] * d["head_dim"], d["groups"] * d["head_dim"], d["ffn"]
    shapes = _shapes(index)
    out: Dict[str, List[Segment]] = {}

    def whole(hf: str, logical: str) -> None:
        out[hf] = [Segment(0, shapes[logical][0], logical, 0)]

    for name in shapes:
        layer = _LAYER.match(name)
        if name == "embedding.word_embeddings.weight":
            whole("model.embed_tokens.weight", name)
        elif name == "decoder.final_layernorm.weight":
            whole("model.norm.weight", name)
        elif name == "output_layer.weight":
            whole("lm_head.weight", name)
        elif layer:
            prefix, rest = f"model.layers.{layer.group(1)}.", layer.group(2)
            kind = rest.rsplit(".", 1)[-1]  # weight | bias
            if rest.startswith("self_attention.linear_qkv."):
                out[prefix + f"self_attn.q_proj.{kind}"] = [Segment(0, q_rows, name, 0)]
                out[prefix + f"self_attn.k_proj.{kind}"] = [Segment(0, kv_rows, name, q_rows)]
                out[prefix + f"self_attn.v_proj.{kind}"] = [Segment(0, kv_rows, name, q_rows + kv_rows)]
            elif rest.startswith("mlp.linear_fc1."):
                out[prefix + f"mlp.gate_proj.{kind}"] = [Segment(0, f, name, 0)]
                out[prefix + f"mlp.up_proj.{kind}"] = [Segment(0, f, name, f)]
            else:
                hf = {
                    "input_layernorm.weight": "input_layernorm.weight",
                    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
                    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
                    "self_attention.linear_proj.bias": "self_attn.o_proj.bias",
                    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
                    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
                    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
                    "mlp.linear_fc2.bias": "mlp.down_proj.bias",
                }.get(rest)
                if hf is None:
                    raise LookupError(f"model mismatch: a {architecture(model)} has no place for {name}")
                whole(prefix + hf, name)
        else:
            raise LookupError(f"model mismatch: a {architecture(model)} has no place for {name}")
    return out


def check_cover(segs: Dict[str, List[Segment]], hf_shapes: Dict[str, Sequence[int]], index: Sequence[Dict]) -> None:
    """Every Hugging Face param is named and fully mapped, and every logical row is held exactly once."""
    shapes = _shapes(index)
    missing = sorted(set(segs) - set(hf_shapes))
    unmapped = sorted(set(hf_shapes) - set(segs))
    if missing or unmapped:
        raise LookupError(f"model mismatch: the model lacks {missing[:4]} and has no logical param for {unmapped[:4]}")
    held: Dict[str, List[Tuple[int, int]]] = {}
    for hf, pieces in segs.items():
        shape = list(hf_shapes[hf])
        rows = sum(s.end - s.begin for s in pieces)
        if rows != shape[0]:
            raise LookupError(f"model mismatch: {hf} has {shape[0]} rows, its segments {rows}")
        for s in pieces:
            if list(shapes[s.logical][1:]) != shape[1:]:
                raise LookupError(f"model mismatch: {hf} rows are {shape[1:]} wide, {s.logical}'s {shapes[s.logical][1:]}")
            held.setdefault(s.logical, []).append((s.logical_begin, s.logical_begin + s.end - s.begin))
    for logical, shape in shapes.items():
        spans = sorted(held.get(logical, []))
        at = 0
        for lo, hi in spans:
            if lo != at:
                raise LookupError(f"model mismatch: rows {at} to {lo} of {logical} are held {'twice' if lo < at else 'by no param'}")
            at = hi
        if at != shape[0]:
            raise LookupError(f"model mismatch: {logical} has {shape[0]} rows, the model holds {at}")


def full_gradient(segs: Sequence[Segment], shape: Sequence[int], tensors: Dict):
    """A Hugging Face param's whole gradient (numpy, float32) from tally's logical values."""
    import numpy as np

    out = np.empty(tuple(shape), dtype=np.float32)
    for s in segs:
        out[s.begin:s.end] = tensors[s.logical][s.logical_begin:s.logical_begin + s.end - s.begin]
    return out


def boxes(segs: Sequence[Segment], offsets: Sequence[int], extents: Sequence[int]) -> List[Tuple[int, int, str, List[int], List[int]]]:
    """Where this rank's shard (the box `offsets`, `extents` of the Hugging Face param) lies in the
    logical params: (begin, end) of the shard's flattened elements, the logical param, and the box of
    it they are. Each segment is whole rows, so its part of a shard is contiguous."""
    row = 1
    for e in extents[1:]:
        row *= int(e)
    lo_shard, hi_shard = int(offsets[0]), int(offsets[0]) + int(extents[0])
    out = []
    for s in segs:
        lo, hi = max(lo_shard, s.begin), min(hi_shard, s.end)
        if lo >= hi:
            continue
        logical_offsets = [s.logical_begin + lo - s.begin] + [int(o) for o in offsets[1:]]
        out.append(((lo - lo_shard) * row, (hi - lo_shard) * row, s.logical, logical_offsets,
                    [hi - lo] + [int(e) for e in extents[1:]]))
    return out
