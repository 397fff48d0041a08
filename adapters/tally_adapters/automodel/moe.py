"""tally's MoE GPT as one of NeMo-Automodel's own MoE models, and where each of tally's logical params
lies in that model's params. Three families (`family`): a MoE GPT with multi-latent attention is
Automodel's DeepSeek-V3 (`nemo_automodel/components/models/deepseek_v3`), one with qk-layernorm its
Qwen3-MoE (`.../models/qwen3_moe`), one with attention sinks and linear biases its GPT-OSS
(`.../models/gpt_oss`).

All keep Hugging Face's names for attention, norms, embeddings and a dense layer's MLP
(`gate_proj`, `up_proj`, `down_proj`), but stack a MoE layer's routed experts into two tensors:
`mlp.experts.gate_and_up_projs` of shape [experts, hidden, 2 x ffn] and `mlp.experts.down_projs` of
[experts, ffn, hidden], each expert's slice the transpose of Megatron's `linear_fc1` ([2 x ffn,
hidden]) and `linear_fc2` ([hidden, ffn]); the router is `mlp.gate.weight`. GPT-OSS adds the
biases: q/k/v/o projections', the router's (`mlp.gate.bias`), and the experts' stacked into
`mlp.experts.gate_up_proj_bias` [experts, 2 x ffn] and `down_proj_bias` [experts, hidden], each
expert's row its whole `linear_fc1.bias` / `linear_fc2.bias`; and a learnable sink per head
(`self_attn.sinks`, Megatron's `core_attention.softmax_offset`). DeepSeek-V3 has transformers'
names for multi-latent attention (`q_a_proj` Megatron's `linear_q_down_proj`, `q_a_layernorm` the
layernorm of `linear_q_up_proj`, `q_b_proj` it, and the same for kv: `kv_a_proj_with_mqa`,
`kv_a_layernorm`, `kv_b_proj`), each one logical param whole, and a shared expert with a dense MLP's
names under `mlp.shared_experts`. So a param here is whole rows of
logical params (`Rows`, as tally_adapters.hf_models maps a dense model), a stack of transposed
experts (`Transposed`), or a stack of whole expert biases (`Stacked`). Any bijection counts every
element once; which of an expert's columns are its gate and which its up projection is the
framework's business, not the norm's. No torch or transformers import at module level.
"""

from __future__ import annotations

import re
from typing import Dict, List, NamedTuple, Sequence, Tuple, Union

from .. import hf_models
from ..hf_models import Segment as Rows  # rows [begin, end) of a param are rows [logical_begin, ...) of `logical`

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.(weight|bias)$")


class Transposed(NamedTuple):
    """The param's slice `expert` (dim 0) is the transpose of the whole 2-D param `logical`."""

    expert: int
    logical: str


class Stacked(NamedTuple):
    """The param's row `expert` (dim 0) is the whole 1-D param `logical` (an expert's bias)."""

    expert: int
    logical: str


Part = Union[Rows, Transposed, Stacked]

QWEN3_MOE, GPT_OSS, DEEPSEEK_V3 = "qwen3-moe", "gpt-oss", "deepseek-v3"


def family(model: Dict) -> str:
    """Which of Automodel's MoE models a MoE case is built as (run/automodel/rules.cpp refuses what
    none is): multi-latent attention makes it DeepSeek-V3, else qk-layernorm Qwen3-MoE, anything else
    GPT-OSS."""
    if model.get("multi_latent_attention"):
        return DEEPSEEK_V3
    return QWEN3_MOE if model.get("qk_layernorm") else GPT_OSS


def _shapes(index: Sequence[Dict]) -> Dict[str, List[int]]:
    return {p["name"]: list(p["shape"]) for p in index}


def dimensions(model: Dict, index: Sequence[Dict]) -> Dict:
    """The sizes a family's config needs, read from the case's model and checked against the shapes
    of its gradient index; `dense_layers`: the layers whose MLP is dense (Qwen3-MoE's
    `mlp_only_layers`, DeepSeek-V3's first k)."""
    shapes = _shapes(index)
    hidden = int(model["hidden_size"])
    heads = int(model["num_attention_heads"])
    groups = int(model.get("num_query_groups") or heads)
    head_dim = int(model.get("kv_channels") or hidden // heads)
    latent = {}
    if model.get("multi_latent_attention"):
        latent = {"q_lora": int(model["q_lora_rank"]), "kv_lora": int(model["kv_lora_rank"]),
                  "qk_head": int(model["qk_head_dim"]), "qk_rope": int(model["qk_pos_emb_head_dim"]),
                  "v_head": int(model["v_head_dim"]),
                  "shared_ffn": int(model.get("moe_shared_expert_intermediate_size") or 0)}
        up = shapes.get("decoder.layers.0.self_attention.linear_kv_up_proj.weight")
        want = [heads * (latent["qk_head"] + latent["v_head"]), latent["kv_lora"]]
        if up != want:
            raise LookupError(f"model mismatch: linear_kv_up_proj is {up}; heads {heads}, kv_lora_rank "
                              f"{latent['kv_lora']}, qk and v head dims give {want}")
    else:
        qkv = shapes.get("decoder.layers.0.self_attention.linear_qkv.weight")
        if qkv != [(heads + 2 * groups) * head_dim, hidden]:
            raise LookupError(f"model mismatch: linear_qkv is {qkv}, heads {heads}, groups {groups}, head dim "
                              f"{head_dim} give {[(heads + 2 * groups) * head_dim, hidden]}")
    layers = int(model["num_layers"])
    dense_layers = [n for n in range(layers) if f"decoder.layers.{n}.mlp.linear_fc2.weight" in shapes]
    moe_layers = [n for n in range(layers) if f"decoder.layers.{n}.mlp.router.weight" in shapes]
    if not moe_layers:
        raise LookupError("model mismatch: the gradient index has no router: not a MoE model")
    expert_fc2 = shapes.get(f"decoder.layers.{moe_layers[0]}.mlp.experts.local_experts.0.linear_fc2.weight")
    if expert_fc2 is None:
        raise LookupError(f"model mismatch: layer {moe_layers[0]} has a router but no expert 0")
    dense_fc2 = shapes.get(f"decoder.layers.{dense_layers[0]}.mlp.linear_fc2.weight") if dense_layers else None
    return {
        "hidden": hidden,
        "heads": heads,
        "groups": groups,
        "head_dim": head_dim,
        "ffn": int(dense_fc2[1]) if dense_fc2 else int(expert_fc2[1]),
        "moe_ffn": int(expert_fc2[1]),
        "experts": int(model["num_experts"]),
        "layers": layers,
        "dense_layers": dense_layers,
        "vocab": int(shapes["embedding.word_embeddings.weight"][0]),
        **latent,
    }


def qwen3_moe_config(model: Dict, index: Sequence[Dict]):
    """transformers' Qwen3MoeConfig of the case's size, fp32: the config Automodel's Qwen3-MoE reads."""
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig

    d = dimensions(model, index)
    return Qwen3MoeConfig(
        vocab_size=d["vocab"],
        hidden_size=d["hidden"],
        intermediate_size=d["ffn"],
        moe_intermediate_size=d["moe_ffn"],
        num_hidden_layers=d["layers"],
        num_attention_heads=d["heads"],
        num_key_value_heads=d["groups"],
        head_dim=d["head_dim"],
        num_experts=d["experts"],
        num_experts_per_tok=min(2, d["experts"]),
        decoder_sparse_step=1,
        mlp_only_layers=d["dense_layers"],
        max_position_embeddings=int(model["max_position_embeddings"]),
        tie_word_embeddings=not model["untie_embeddings_and_output_weights"],
        dtype="float32",
    )


def gpt_oss_config(model: Dict, index: Sequence[Dict]):
    """transformers' GptOssConfig of the case's size, fp32: the config Automodel's GPT-OSS reads. Its
    experts' FFN is the config's intermediate_size (Automodel's GptOssModel, model.py:113-114), and
    every layer is MoE."""
    d = dimensions(model, index)
    if d["dense_layers"]:
        raise LookupError(f"model mismatch: layers {d['dense_layers']} are dense, and every layer of GPT-OSS is MoE")
    from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig

    return GptOssConfig(
        vocab_size=d["vocab"],
        hidden_size=d["hidden"],
        intermediate_size=d["moe_ffn"],
        num_hidden_layers=d["layers"],
        num_attention_heads=d["heads"],
        num_key_value_heads=d["groups"],
        head_dim=d["head_dim"],
        num_local_experts=d["experts"],
        num_experts_per_tok=min(2, d["experts"]),
        layer_types=["sliding_attention" if n % 2 == 0 else "full_attention" for n in range(d["layers"])],
        max_position_embeddings=int(model["max_position_embeddings"]),
        tie_word_embeddings=not model["untie_embeddings_and_output_weights"],
        dtype="float32",
    )


def deepseek_v3_config(model: Dict, index: Sequence[Dict]):
    """transformers' DeepseekV3Config of the case's size, fp32: the config Automodel's DeepSeek-V3
    reads. Its dense layers are its first k (first_k_dense_replace), its shared experts n experts'
    FFN wide (n_shared_experts), and it builds no MTP layer."""
    d = dimensions(model, index)
    k = len(d["dense_layers"])
    if d["dense_layers"] != list(range(k)):
        raise LookupError(f"model mismatch: dense layers {d['dense_layers']}; DeepSeek-V3's dense layers are its "
                          "first k (first_k_dense_replace)")
    if d["shared_ffn"] % d["moe_ffn"]:
        raise LookupError(f"model mismatch: a shared expert of {d['shared_ffn']} is not a whole number of experts of "
                          f"{d['moe_ffn']} (n_shared_experts)")
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=d["vocab"],
        hidden_size=d["hidden"],
        intermediate_size=d["ffn"],
        moe_intermediate_size=d["moe_ffn"],
        num_hidden_layers=d["layers"],
        num_attention_heads=d["heads"],
        num_key_value_heads=d["heads"],
        n_routed_experts=d["experts"],
        n_shared_experts=d["shared_ffn"] // d["moe_ffn"],
        num_experts_per_tok=min(2, d["experts"]),
        n_group=1,
        topk_group=1,
        first_k_dense_replace=k,
        q_lora_rank=d["q_lora"],
        kv_lora_rank=d["kv_lora"],
        qk_nope_head_dim=d["qk_head"],
        qk_rope_head_dim=d["qk_rope"],
        v_head_dim=d["v_head"],
        max_position_embeddings=int(model["max_position_embeddings"]),
        tie_word_embeddings=not model["untie_embeddings_and_output_weights"],
        dtype="float32",
    )


# family -> (Automodel's architecture name in its registry, the config of the case's size)
ARCHITECTURES = {
    QWEN3_MOE: ("Qwen3MoeForCausalLM", qwen3_moe_config),
    GPT_OSS: ("GptOssForCausalLM", gpt_oss_config),
    DEEPSEEK_V3: ("DeepseekV3ForCausalLM", deepseek_v3_config),
}


_WHOLE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
    # GPT-OSS's own
    "self_attention.linear_proj.bias": "self_attn.o_proj.bias",
    "mlp.router.bias": "mlp.gate.bias",
    "self_attention.core_attention.softmax_offset": "self_attn.sinks",
    # DeepSeek-V3's multi-latent attention and shared experts
    "self_attention.linear_q_proj.weight": "self_attn.q_proj.weight",  # without q_lora_rank
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.linear_q_up_proj.layer_norm_weight": "self_attn.q_a_layernorm.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.linear_kv_up_proj.layer_norm_weight": "self_attn.kv_a_layernorm.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.down_proj.weight",
}
_STACKED = {  # an expert's param -> the stacked param of its layer
    ("linear_fc1", "weight"): "gate_and_up_projs",
    ("linear_fc2", "weight"): "down_projs",
    ("linear_fc1", "bias"): "gate_up_proj_bias",
    ("linear_fc2", "bias"): "down_proj_bias",
}


def parts(model: Dict, index: Sequence[Dict]) -> Dict[str, List[Part]]:
    """Automodel param name -> the logical params (or rows of them) it holds, for every logical param
    of the index."""
    d = dimensions(model, index)
    q_rows, kv_rows, f = d["heads"] * d["head_dim"], d["groups"] * d["head_dim"], d["ffn"]
    shapes = _shapes(index)
    out: Dict[str, List[Part]] = {}

    def whole(automodel: str, logical: str) -> None:
        out[automodel] = [Rows(0, shapes[logical][0], logical, 0)]

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
            expert = _EXPERT.match(rest)
            if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
                kind = rest.rsplit(".", 1)[1]
                out[f"{prefix}self_attn.q_proj.{kind}"] = [Rows(0, q_rows, name, 0)]
                out[f"{prefix}self_attn.k_proj.{kind}"] = [Rows(0, kv_rows, name, q_rows)]
                out[f"{prefix}self_attn.v_proj.{kind}"] = [Rows(0, kv_rows, name, q_rows + kv_rows)]
            elif rest == "mlp.linear_fc1.weight":
                out[prefix + "mlp.gate_proj.weight"] = [Rows(0, f, name, 0)]
                out[prefix + "mlp.up_proj.weight"] = [Rows(0, f, name, f)]
            elif rest == "mlp.shared_experts.linear_fc1.weight":
                shared = d["shared_ffn"]
                out[prefix + "mlp.shared_experts.gate_proj.weight"] = [Rows(0, shared, name, 0)]
                out[prefix + "mlp.shared_experts.up_proj.weight"] = [Rows(0, shared, name, shared)]
            elif expert:
                number, linear, kind = int(expert.group(1)), expert.group(2), expert.group(3)
                part = Transposed(number, name) if kind == "weight" else Stacked(number, name)
                out.setdefault(f"{prefix}mlp.experts.{_STACKED[(linear, kind)]}", []).append(part)
            elif rest in _WHOLE:
                whole(prefix + _WHOLE[rest], name)
            else:
                raise LookupError(f"model mismatch: Automodel's {family(model)} has no place for {name}")
        else:
            raise LookupError(f"model mismatch: Automodel's {family(model)} has no place for {name}")
    return out


def check_cover(held: Dict[str, List[Part]], shapes_here: Dict[str, Sequence[int]], index: Sequence[Dict]) -> None:
    """Every param of the model is named and fully mapped, and every logical element is held exactly
    once (counted element by element: the models are tiny)."""
    import numpy as np

    shapes = _shapes(index)
    missing = sorted(set(held) - set(shapes_here))
    unmapped = sorted(set(shapes_here) - set(held))
    if missing or unmapped:
        raise LookupError(f"model mismatch: the model lacks {missing[:4]} and has no logical param for {unmapped[:4]}")
    counts = {name: np.zeros(shape, dtype=np.int64) for name, shape in shapes.items()}
    for param, its_parts in held.items():
        shape = list(shapes_here[param])
        covered = 0
        for part in its_parts:
            logical = shapes[part.logical]
            if isinstance(part, Transposed):
                if len(shape) != 3 or len(logical) != 2 or shape[1:] != logical[::-1] or not 0 <= part.expert < shape[0]:
                    raise LookupError(f"model mismatch: {param} {shape}: its expert {part.expert} is not "
                                      f"{part.logical} {logical} transposed")
                counts[part.logical] += 1
                covered += 1
            elif isinstance(part, Stacked):
                if len(shape) != 2 or len(logical) != 1 or shape[1:] != logical or not 0 <= part.expert < shape[0]:
                    raise LookupError(f"model mismatch: {param} {shape}: its row {part.expert} is not "
                                      f"{part.logical} {logical}")
                counts[part.logical] += 1
                covered += 1
            else:
                if shape[1:] != logical[1:]:
                    raise LookupError(f"model mismatch: {param} rows are {shape[1:]} wide, {part.logical}'s {logical[1:]}")
                counts[part.logical][part.logical_begin:part.logical_begin + part.end - part.begin] += 1
                covered += part.end - part.begin
        if covered != shape[0]:
            raise LookupError(f"model mismatch: {param} has {shape[0]} slices along dim 0, its parts {covered}")
    for name, count in counts.items():
        low, high = (int(count.min()), int(count.max())) if count.size else (1, 1)
        if (low, high) != (1, 1):
            times = f"{low}" if low == high else f"from {low} to {high}"
            raise LookupError(f"model mismatch: elements of {name} are held {times} times, not once")


def full_gradient(its_parts: Sequence[Part], shape: Sequence[int], tensors: Dict):
    """A param's whole gradient (numpy, float32) from tally's logical values."""
    import numpy as np

    out = np.empty(tuple(shape), dtype=np.float32)
    for part in its_parts:
        if isinstance(part, Transposed):
            out[part.expert] = tensors[part.logical].T
        elif isinstance(part, Stacked):
            out[part.expert] = tensors[part.logical]
        else:
            out[part.begin:part.end] = tensors[part.logical][part.logical_begin:part.logical_begin + part.end - part.begin]
    return out


def boxes(its_parts: Sequence[Part], offsets: Sequence[int],
          extents: Sequence[int]) -> List[Tuple[int, int, str, List[int], List[int]]]:
    """Where this rank's shard (the box `offsets`, `extents` of the param) lies in the logical params:
    (begin, end) of the shard's flattened elements, the logical param, and the box of it they are.
    Each part is whole slices along dim 0, so its share of a shard is contiguous; a transposed
    expert's box swaps its two dims, a stacked bias's is its row's."""
    row = 1
    for e in extents[1:]:
        row *= int(e)
    lo_shard, hi_shard = int(offsets[0]), int(offsets[0]) + int(extents[0])
    out = []
    for part in its_parts:
        if isinstance(part, Transposed):
            if lo_shard <= part.expert < hi_shard:
                begin = (part.expert - lo_shard) * row
                out.append((begin, begin + row, part.logical, [int(offsets[2]), int(offsets[1])],
                            [int(extents[2]), int(extents[1])]))
            continue
        if isinstance(part, Stacked):
            if lo_shard <= part.expert < hi_shard:
                begin = (part.expert - lo_shard) * row
                out.append((begin, begin + row, part.logical, [int(offsets[1])], [int(extents[1])]))
            continue
        out.extend(hf_models.boxes([part], offsets, extents))
    return out


def is_expert(its_parts: Sequence[Part]) -> bool:
    return any(isinstance(part, (Transposed, Stacked)) for part in its_parts)
