"""tally's architecture presets as torchtitan's own model families, and where each of tally's logical
params (Megatron's names, as `tally layout` lists them) lies in that model's params.

A preset names the family its users train it as: llama3 is torchtitan's `llama3`, qwen3-moe its
`qwen3` with MoE layers, gpt-oss its `gpt_oss` and deepseek-v3 its `deepseek_v3` (multi-latent
attention, first dense layers, shared experts, MTP). torchtitan 0.3.0 has no Mixtral family. The
model is built by the family's own layer builders at the sizes of the case's model section, as its
flavors (`llama3_configs`, ...) build theirs at full size.

Each torchtitan param holds whole rows of logical params: `wqkv` is `linear_qkv` (both interleave
each query group's heads with its key and value); `w1` and `w3` the gate and up halves of
`linear_fc1`; a routed expert weight stacks every expert's (dim 0: the expert), so its rows, counted
over the expert dim and the next, are expert e's rows in turn; gpt_oss's `mlp1` is an expert's
whole `linear_fc1` (its gate and up rows interleaved, which the norm does not see). The rest are one
logical param each. No torch or torchtitan import at module level.
"""

from __future__ import annotations

import re
from typing import Dict, List, Sequence, Tuple

from ..hf_models import Segment

# tally's preset -> torchtitan 0.3.0's family (torchtitan/models/<family>).
FAMILIES = {"llama3": "llama3", "qwen3-moe": "qwen3", "gpt-oss": "gpt_oss", "deepseek-v3": "deepseek_v3"}

_DECODER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_MTP = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.(weight|bias)$")

# The rest of a layer's param name, tally's -> torchtitan's, where one holds the other whole.
_WHOLE = {
    "input_layernorm.weight": "attention_norm.weight",
    "pre_mlp_layernorm.weight": "ffn_norm.weight",
    "self_attention.linear_qkv.weight": "attention.qkv_linear.wqkv.weight",
    "self_attention.linear_qkv.bias": "attention.qkv_linear.wqkv.bias",
    "self_attention.linear_proj.weight": "attention.wo.weight",
    "self_attention.linear_proj.bias": "attention.wo.bias",
    "self_attention.q_layernorm.weight": "attention.q_norm.weight",
    "self_attention.k_layernorm.weight": "attention.k_norm.weight",
    "self_attention.core_attention.softmax_offset": "attention.sinks",
    # multi-latent attention (deepseek_v3/model.py's Attention)
    "self_attention.linear_q_proj.weight": "attention.wq.weight",
    "self_attention.linear_q_down_proj.weight": "attention.wq_a.weight",
    "self_attention.linear_q_up_proj.layer_norm_weight": "attention.q_norm.weight",
    "self_attention.linear_q_up_proj.weight": "attention.wq_b.weight",
    "self_attention.linear_kv_down_proj.weight": "attention.wkv_a.weight",
    "self_attention.linear_kv_up_proj.layer_norm_weight": "attention.kv_norm.weight",
    "self_attention.linear_kv_up_proj.weight": "attention.wkv_b.weight",
    "mlp.linear_fc2.weight": "feed_forward.w2.weight",
    "mlp.router.weight": "moe.router.gate.weight",
    "mlp.router.bias": "moe.router.gate.bias",
    "mlp.shared_experts.linear_fc2.weight": "moe.shared_experts.w2.weight",
}
# A gated MLP's linear_fc1 -> torchtitan's gate (w1) and up (w3) projections.
_GATED = {"mlp.linear_fc1.weight": "feed_forward", "mlp.shared_experts.linear_fc1.weight": "moe.shared_experts"}
# An MTP layer's own params (deepseek_v3/mtp.py's MTPTransformerBlock).
_MTP_OWN = {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
            "final_layernorm.weight": "mtp_norm.weight"}
_TOP = {"embedding.word_embeddings.weight": "tok_embeddings.weight", "decoder.final_layernorm.weight": "norm.weight",
        "output_layer.weight": "lm_head.weight"}
_INNER = "moe.routed_experts.inner_experts."


def family_of(model: Dict) -> str:
    """torchtitan's family of the case's preset; LookupError where the case has none or torchtitan
    0.3.0 has no such family."""
    preset = model.get("preset")
    if preset not in FAMILIES:
        raise LookupError(f"model.preset {preset!r}: torchtitan 0.3.0 has a family for "
                          f"{', '.join(sorted(FAMILIES))} only (torchtitan/models)")
    return FAMILIES[preset]


def stacked(name: str) -> bool:
    """Whether a torchtitan param stacks experts along dim 0 (its rows are counted over dims 0 and 1)."""
    return _INNER in name


def _shapes(index: Sequence[Dict]) -> Dict[str, List[int]]:
    return {p["name"]: list(p["shape"]) for p in index}


def _expert_names(family: str, layer: str, index_expert, kind: str, shapes, name: str):
    """The stacked torchtitan params an expert's logical param lies in, with the rows of each."""
    e = int(index_expert.group(1))
    linear = index_expert.group(2)
    rows = shapes[name][0]
    if family == "gpt_oss":
        tt = {("linear_fc1", "weight"): "mlp1_weight_EGD", ("linear_fc1", "bias"): "mlp1_bias_EG",
              ("linear_fc2", "weight"): "mlp2_weight_EDF", ("linear_fc2", "bias"): "mlp2_bias_ED"}[(linear, kind)]
        return [(layer + _INNER + tt, Segment(e * rows, (e + 1) * rows, name, 0))]
    if kind == "bias":
        raise LookupError(f"model mismatch: torchtitan's {family} experts have no biases, tally's layout has {name}")
    if linear == "linear_fc2":
        return [(layer + _INNER + "w2_EDF", Segment(e * rows, (e + 1) * rows, name, 0))]
    half = rows // 2
    return [(layer + _INNER + "w1_EFD", Segment(e * half, (e + 1) * half, name, 0)),
            (layer + _INNER + "w3_EFD", Segment(e * half, (e + 1) * half, name, half))]


def segments(model: Dict, index: Sequence[Dict]) -> Dict[str, List[Segment]]:
    """torchtitan param name -> the logical rows it holds, for every logical param of `index` (the
    gradient index or `tally layout`'s params). Rows of a stacked param run over its experts."""
    family = family_of(model)
    shapes = _shapes(index)
    out: Dict[str, List[Segment]] = {}

    def add(tt: str, segment: Segment) -> None:
        out.setdefault(tt, []).append(segment)

    for name, shape in shapes.items():
        if name in _TOP:
            add(_TOP[name], Segment(0, shape[0], name, 0))
            continue
        decoder, mtp = _DECODER.match(name), _MTP.match(name)
        if decoder:
            layer, rest = f"layers.{decoder.group(1)}.", decoder.group(2)
        elif mtp:
            layer, rest = f"mtp_layers.{mtp.group(1)}.", mtp.group(2)
            if rest in _MTP_OWN:
                add(layer + _MTP_OWN[rest], Segment(0, shape[0], name, 0))
                continue
            if not rest.startswith("transformer_layer."):
                raise LookupError(f"model mismatch: torchtitan's {family} MTP layer has no place for {name}")
            rest = rest[len("transformer_layer."):]
        else:
            raise LookupError(f"model mismatch: torchtitan's {family} has no place for {name}")
        expert = _EXPERT.match(rest)
        if expert:
            for tt, segment in _expert_names(family, layer, expert, expert.group(3), shapes, name):
                add(tt, segment)
        elif rest in _GATED:
            half = shape[0] // 2
            add(f"{layer}{_GATED[rest]}.w1.weight", Segment(0, half, name, 0))
            add(f"{layer}{_GATED[rest]}.w3.weight", Segment(0, half, name, half))
        elif rest in _WHOLE:
            add(layer + _WHOLE[rest], Segment(0, shape[0], name, 0))
        else:
            raise LookupError(f"model mismatch: torchtitan's {family} has no place for {name}")
    for pieces in out.values():
        pieces.sort()
    return out


def rows_and_width(tt_name: str, shape: Sequence[int]) -> Tuple[int, List[int]]:
    """A torchtitan param's rows (over the expert dim too where it stacks experts) and a row's shape."""
    shape = [int(s) for s in shape]
    if stacked(tt_name):
        return shape[0] * shape[1], shape[2:]
    return shape[0], shape[1:]


def check_cover(segs: Dict[str, List[Segment]], tt_shapes: Dict[str, Sequence[int]], index: Sequence[Dict]) -> None:
    """Every torchtitan param is named and fully mapped, and every logical row is held exactly once;
    LookupError naming the first param that breaks it."""
    shapes = _shapes(index)
    missing = sorted(set(segs) - set(tt_shapes))
    unmapped = sorted(set(tt_shapes) - set(segs))
    if missing or unmapped:
        raise LookupError(f"model mismatch: torchtitan's model lacks {missing[:4]} and holds no logical param "
                          f"in {unmapped[:4]}")
    held: Dict[str, List[Tuple[int, int]]] = {}
    for tt, pieces in segs.items():
        rows, width = rows_and_width(tt, tt_shapes[tt])
        at = 0
        for s in sorted(pieces):
            if s.begin != at:
                raise LookupError(f"model mismatch: rows {at} to {s.begin} of {tt} are held "
                                  f"{'twice' if s.begin < at else 'by no logical param'}")
            at = s.end
            if list(shapes[s.logical][1:]) != width:
                raise LookupError(f"model mismatch: {tt}'s rows are {width} wide, {s.logical}'s "
                                  f"{shapes[s.logical][1:]}")
            held.setdefault(s.logical, []).append((s.logical_begin, s.logical_begin + s.end - s.begin))
        if at != rows:
            raise LookupError(f"model mismatch: {tt} has {rows} rows, its logical params {at}")
    for logical, shape in shapes.items():
        at = 0
        for lo, hi in sorted(held.get(logical, [])):
            if lo != at:
                raise LookupError(f"model mismatch: rows {at} to {lo} of {logical} are held "
                                  f"{'twice' if lo < at else 'by no torchtitan param'}")
            at = hi
        if at != shape[0]:
            raise LookupError(f"model mismatch: {logical} has {shape[0]} rows, torchtitan's model holds {at}")


# --- torchtitan's model of the preset (imports torchtitan) ------------------------------------------


def dimensions(model: Dict, index: Sequence[Dict]) -> Dict:
    """The sizes the family's builders take, from the case's model section; which layers are MoE is
    read from the index (a layer with a router), as the layer pattern laid them out."""
    shapes = _shapes(index)
    hidden, heads = int(model["hidden_size"]), int(model["num_attention_heads"])
    layers = int(model["num_layers"])
    moe = [f"decoder.layers.{i}.mlp.router.weight" in shapes for i in range(layers)]
    dense = moe.index(True) if True in moe else layers
    if moe[dense:] != [True] * (layers - dense):
        raise LookupError(f"model mismatch: MoE layers {[i for i, m in enumerate(moe) if m]}: torchtitan's "
                          "families build dense layers first, then MoE ones only "
                          "(deepseek_v3/__init__.py build_mla_moe_layers)")
    experts = int(model.get("num_experts") or 0)
    moe_ffn = int(model.get("moe_ffn_hidden_size") or 0)
    shared = int(model.get("moe_shared_expert_intermediate_size") or 0)
    return {
        "hidden": hidden,
        "heads": heads,
        "groups": int(model.get("num_query_groups") or heads),
        "head_dim": int(model.get("kv_channels") or hidden // heads),
        "ffn": int(model["ffn_hidden_size"]),
        "layers": layers,
        "dense_layers": dense,
        "experts": experts,
        "moe_ffn": moe_ffn,
        "shared_experts": shared // moe_ffn if moe_ffn else 0,
        "vocab": int(shapes["embedding.word_embeddings.weight"][0]),
        "seq": int(model["max_position_embeddings"]),
        "tied": not model["untie_embeddings_and_output_weights"],
        "mtp": int(model.get("mtp_num_layers") or 0),
        "q_lora_rank": int(model.get("q_lora_rank") or 0),
        "kv_lora_rank": int(model.get("kv_lora_rank") or 0),
        "qk_head_dim": int(model.get("qk_head_dim") or 0),
        "qk_pos_emb_head_dim": int(model.get("qk_pos_emb_head_dim") or 0),
        "v_head_dim": int(model.get("v_head_dim") or 0),
    }


def _common(d: Dict):
    from torchtitan.models.common import Embedding, Linear, RMSNorm

    return dict(vocab_size=d["vocab"], dim=d["hidden"], enable_weight_tying=d["tied"],
                tok_embeddings=Embedding.Config(num_embeddings=d["vocab"], embedding_dim=d["hidden"]),
                norm=RMSNorm.Config(normalized_shape=d["hidden"]),
                lm_head=Linear.Config(in_features=d["hidden"], out_features=d["vocab"]))


def _llama3(d: Dict):
    from torchtitan.models.common import ComplexRoPE
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    return Llama3Model.Config(**_common(d), layers=_build_llama3_layers(
        fuse_qkv=True, n_layers=d["layers"], dim=d["hidden"], n_heads=d["heads"], n_kv_heads=d["groups"],
        hidden_dim=d["ffn"], rope=ComplexRoPE.Config(dim=d["head_dim"], max_seq_len=d["seq"], theta=500000.0),
        attn_backend="flex"))


def _qwen3(d: Dict):
    from torchtitan.models.common import CosSinRoPE
    from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_layers, _build_qwen3_moe_layers

    if d["dense_layers"] not in (0, d["layers"]):
        raise LookupError("model mismatch: torchtitan's qwen3 builds all layers dense or all MoE "
                          "(qwen3/__init__.py _build_qwen3_layers, _build_qwen3_moe_layers)")
    rope = CosSinRoPE.Config(dim=d["head_dim"], max_seq_len=d["seq"], theta=1000000.0)
    common = dict(fuse_qkv=True, n_layers=d["layers"], dim=d["hidden"], n_heads=d["heads"], n_kv_heads=d["groups"],
                  head_dim=d["head_dim"], attn_backend="flex", rope=rope)
    if d["dense_layers"] == d["layers"]:
        layers = _build_qwen3_layers(hidden_dim=d["ffn"], **common)
    else:
        layers = _build_qwen3_moe_layers(moe_hidden_dim=d["moe_ffn"], num_experts=d["experts"], top_k=1,
                                         moe_comm_backend="standard", **common)
    return Qwen3Model.Config(**_common(d), layers=layers)


def _gpt_oss(d: Dict):
    # _build_gptoss_layers fixes the heads at gpt-oss's own (64 of 64 dims, 8 KV groups), so each
    # layer is assembled from the family's own per-layer builders as it assembles them.
    import torchtitan.models.gpt_oss as gpt_oss
    from torchtitan.models.common import CosSinRoPE, Linear, RMSNorm
    from torchtitan.models.common.moe import TokenChoiceTopKRouter

    if d["dense_layers"]:
        raise LookupError("model mismatch: torchtitan's gpt_oss builds MoE layers only (gpt_oss/__init__.py "
                          "_build_gptoss_layers)")
    layers = []
    for layer in range(d["layers"]):
        attention = gpt_oss._make_gptoss_attn_config(
            dim=d["hidden"], layer_id=layer, attn_backend="flex", n_heads=d["heads"], n_kv_heads=d["groups"],
            head_dim=d["head_dim"], fuse_qkv=True,
            rope=CosSinRoPE.Config(dim=d["head_dim"], max_seq_len=d["seq"], theta=150000.0))
        experts = gpt_oss._make_gptoss_experts_config(dim=d["hidden"], hidden_dim=d["moe_ffn"],
                                                      num_experts=d["experts"], layer_id=layer, top_k=1,
                                                      moe_comm_backend="standard")
        router = TokenChoiceTopKRouter.Config(num_experts=d["experts"], score_func="softmax", route_norm=True,
                                              gate=Linear.Config(in_features=d["hidden"], out_features=d["experts"],
                                                                 bias=True), top_k=1)
        moe = gpt_oss.GptOssMoE.Config(num_experts=d["experts"], load_balance_coeff=1e-3, routed_experts=experts,
                                       router=router)
        layers.append(gpt_oss.GptOssTransformerBlock.Config(
            attention=attention, attention_norm=RMSNorm.Config(normalized_shape=d["hidden"]),
            ffn_norm=RMSNorm.Config(normalized_shape=d["hidden"]), moe=moe))
    return gpt_oss.GptOssModel.Config(**_common(d), layers=layers)


def _deepseek_v3(d: Dict):
    import torchtitan.models.deepseek_v3 as deepseek_v3
    from torchtitan.models.common import ComplexRoPE

    layers = deepseek_v3._build_dsv3_layers(
        n_layers=d["layers"], n_dense_layers=d["dense_layers"], dim=d["hidden"], n_heads=d["heads"],
        q_lora_rank=d["q_lora_rank"], kv_lora_rank=d["kv_lora_rank"], qk_nope_head_dim=d["qk_head_dim"],
        qk_rope_head_dim=d["qk_pos_emb_head_dim"], v_head_dim=d["v_head_dim"], mscale=1.0,
        dense_hidden_dim=d["ffn"], moe_hidden_dim=d["moe_ffn"], num_experts=d["experts"],
        num_shared_experts=d["shared_experts"], router_top_k=1, router_score_func="sigmoid", attn_backend="flex",
        moe_comm_backend="standard", non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=d["qk_pos_emb_head_dim"], max_seq_len=d["seq"], theta=10000.0))
    mtp = deepseek_v3._build_mtp_layers(layers[-1], dim=d["hidden"], num_mtp_layers=d["mtp"])
    return deepseek_v3.DeepSeekV3Model.Config(**_common(d), layers=layers, mtp_layers=mtp)


_BUILDERS = {"llama3": _llama3, "qwen3": _qwen3, "gpt_oss": _gpt_oss, "deepseek_v3": _deepseek_v3}


def model_config(model: Dict, index: Sequence[Dict]):
    """torchtitan's model config of the case's preset, built by its family's own builders."""
    return _BUILDERS[family_of(model)](dimensions(model, index))


def inventory(tt_model) -> List[Dict]:
    """A built torchtitan model's params: name, shape, element count, in its own order."""
    return [{"name": n, "shape": [int(s) for s in p.shape], "numel": int(p.numel())}
            for n, p in tt_model.named_parameters()]


def set_sharding(config, family: str, enable_sp: bool, enable_ep: bool) -> None:
    """The family's own sharding config on `config`, as its `update_from_config` sets it
    (llama3/model.py:85, qwen3/model.py:101, gpt_oss/model.py:210, deepseek_v3/model.py:210 at 0.3.0);
    called directly, since that method imports torchtitan's trainer (and its data loaders) first."""
    if family == "llama3":
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config

        set_llama3_sharding_config(config, enable_sp=enable_sp)
    elif family == "qwen3":
        from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

        set_qwen3_sharding_config(config, enable_sp=enable_sp, enable_ep=enable_ep)
    elif family == "gpt_oss":
        from torchtitan.models.gpt_oss.sharding import set_gpt_oss_sharding_config

        set_gpt_oss_sharding_config(config, enable_sp=enable_sp, enable_ep=enable_ep)
    else:
        from torchtitan.models.deepseek_v3.sharding import set_deepseek_v3_sharding_config

        set_deepseek_v3_sharding_config(config, enable_sp=enable_sp, enable_ep=enable_ep)


def fsdp_of(family: str):
    """The FSDP wrapping the family's parallelize function applies: deepseek_v3's wraps its MTP
    layers too (deepseek_v3/parallelize.py:84), the others `apply_fsdp_to_decoder`."""
    if family == "deepseek_v3":
        from torchtitan.models.deepseek_v3.mtp import apply_fsdp_to_mtp_decoder

        return apply_fsdp_to_mtp_decoder
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    return apply_fsdp_to_decoder


def assemble(tt_name: str, shape: Sequence[int], segs: Sequence[Segment], values_of):
    """A torchtitan param's whole tensor (numpy, float32, of `shape`) from the logical tensors
    `values_of(name)` its segments hold."""
    import numpy as np

    rows, width = rows_and_width(tt_name, shape)
    out = np.empty([rows] + width, dtype=np.float32)
    for s in segs:
        out[s.begin:s.end] = values_of(s.logical)[s.logical_begin:s.logical_begin + s.end - s.begin]
    return out.reshape([int(d) for d in shape])
