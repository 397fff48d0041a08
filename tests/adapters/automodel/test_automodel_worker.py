"""Unit tests of the Automodel worker's tables and of tally_adapters.hf_models, which need no torch: the
plant table answers the catalog, every logical param of a GPT is held exactly once by the Hugging Face
params of its architecture, and a shard's rows land in the logical boxes they are. The worker itself
runs on NeMo-Automodel in ci/real-automodel."""

import importlib.util
import unittest

import fault_catalog
import tally_adapters.automodel.worker as automodel_worker
import tally_adapters.hf_models as hf_models
from tally_adapters.plants import FSDP2_DIVIDE_FACTORS


def gpt_index(layers=2, hidden=8, heads=2, groups=1, head_dim=4, ffn=16, vocab=8, bias=False, qk=False, untied=True):
    """The gradient index tally writes for such a GPT (RMSNorm, rope, swiglu): names and shapes."""
    qkv = (heads + 2 * groups) * head_dim
    params = [("embedding.word_embeddings.weight", [vocab, hidden])]
    for L in range(layers):
        p = f"decoder.layers.{L}."
        params += [(p + "input_layernorm.weight", [hidden]),
                   (p + "self_attention.linear_proj.weight", [hidden, heads * head_dim]),
                   (p + "self_attention.linear_qkv.weight", [qkv, hidden])]
        if bias:
            params += [(p + "self_attention.linear_proj.bias", [hidden]), (p + "self_attention.linear_qkv.bias", [qkv])]
        if qk:
            params += [(p + "self_attention.q_layernorm.weight", [head_dim]),
                       (p + "self_attention.k_layernorm.weight", [head_dim])]
        params += [(p + "pre_mlp_layernorm.weight", [hidden]), (p + "mlp.linear_fc1.weight", [2 * ffn, hidden]),
                   (p + "mlp.linear_fc2.weight", [hidden, ffn])]
        if bias:
            params += [(p + "mlp.linear_fc1.bias", [2 * ffn]), (p + "mlp.linear_fc2.bias", [hidden])]
    params.append(("decoder.final_layernorm.weight", [hidden]))
    if untied:
        params.append(("output_layer.weight", [vocab, hidden]))
    model = {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "num_query_groups": groups,
             "kv_channels": head_dim, "vocab_size": vocab, "max_position_embeddings": 16, "add_bias_linear": bias,
             "qk_layernorm": qk, "untie_embeddings_and_output_weights": untied}
    return model, [{"name": n, "shape": s} for n, s in params]


def hf_shapes(model, index):
    """The Hugging Face param shapes of the architecture (as transformers builds them)."""
    d = hf_models.dimensions(model, index)
    h, q, kv, f = d["hidden"], d["heads"] * d["head_dim"], d["groups"] * d["head_dim"], d["ffn"]
    out = {"model.embed_tokens.weight": [d["vocab"], h], "model.norm.weight": [h]}
    if model.get("untie_embeddings_and_output_weights"):
        out["lm_head.weight"] = [d["vocab"], h]
    for L in range(d["layers"]):
        p = f"model.layers.{L}."
        out.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                    p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
                    p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
                    p + "mlp.gate_proj.weight": [f, h], p + "mlp.up_proj.weight": [f, h],
                    p + "mlp.down_proj.weight": [h, f]})
        if model.get("add_bias_linear"):
            out.update({p + "self_attn.q_proj.bias": [q], p + "self_attn.k_proj.bias": [kv],
                        p + "self_attn.v_proj.bias": [kv], p + "self_attn.o_proj.bias": [h],
                        p + "mlp.gate_proj.bias": [f], p + "mlp.up_proj.bias": [f], p + "mlp.down_proj.bias": [h]})
        if model.get("qk_layernorm"):
            out.update({p + "self_attn.q_norm.weight": [d["head_dim"]], p + "self_attn.k_norm.weight": [d["head_dim"]]})
    return out


class PlantTable(unittest.TestCase):
    def test_every_catalog_fault_is_planted_or_has_a_reason(self):
        fault_catalog.assert_plants_answer_the_catalog(self, automodel_worker.PLANTS, automodel_worker.NOT_PLANTED)

    def test_every_plant_replaces_a_function_of_automodels_reducer_or_fsdp2s_divide_rule(self):
        for fault, (targets, how) in automodel_worker.PLANTS.items():
            self.assertTrue(how, fault)
            for where, attr, make in targets:
                if fault.startswith("grads-"):  # the reduction, before which the gradients may enter
                    self.assertEqual((where, attr), FSDP2_DIVIDE_FACTORS, fault)
                else:
                    self.assertEqual(where, "nemo_automodel.components.training.utils", fault)
                    self.assertIn(attr, ("_all_reduce_scalar", "_clip_grad_norm_impl"), fault)
                self.assertTrue(callable(make(lambda *args: None)), fault)


class Architectures(unittest.TestCase):
    def test_qk_layernorm_is_a_qwen3_and_the_rest_a_llama(self):
        self.assertEqual(hf_models.architecture({"qk_layernorm": True}), "qwen3")
        self.assertEqual(hf_models.architecture({"qk_layernorm": False}), "llama")

    def test_every_logical_row_is_held_exactly_once(self):
        for options in ({}, {"bias": True}, {"qk": True}, {"untied": False}, {"groups": 2, "heads": 4}):
            model, index = gpt_index(**options)
            segs = hf_models.segments(model, index)
            hf_models.check_cover(segs, hf_shapes(model, index), index)  # raises on a gap or an overlap

    def test_a_gap_or_a_double_is_a_model_mismatch(self):
        model, index = gpt_index()
        segs = hf_models.segments(model, index)
        shapes = hf_shapes(model, index)
        doubled = dict(segs)
        doubled["model.layers.0.self_attn.v_proj.weight"] = segs["model.layers.0.self_attn.k_proj.weight"]
        with self.assertRaisesRegex(LookupError, "held twice"):
            hf_models.check_cover(doubled, shapes, index)
        missing = dict(shapes)
        del missing["lm_head.weight"]
        with self.assertRaisesRegex(LookupError, "has no logical param|lacks"):
            hf_models.check_cover(segs, missing, index)

    def test_qkv_shapes_that_disagree_with_the_heads_are_a_model_mismatch(self):
        model, index = gpt_index()
        model["num_query_groups"] = 2
        with self.assertRaisesRegex(LookupError, "linear_qkv"):
            hf_models.dimensions(model, index)

    def test_a_param_megatron_has_and_llama_has_not_is_a_model_mismatch(self):
        model, index = gpt_index()
        index.append({"name": "embedding.position_embeddings.weight", "shape": [4, 8]})
        with self.assertRaisesRegex(LookupError, "no place for embedding.position_embeddings.weight"):
            hf_models.segments(model, index)


class Boxes(unittest.TestCase):
    def test_a_shard_of_k_proj_is_the_key_rows_of_linear_qkv(self):
        model, index = gpt_index(heads=2, groups=1, head_dim=4)
        segs = hf_models.segments(model, index)["model.layers.0.self_attn.k_proj.weight"]
        # Rows 2..4 of k_proj (of 4), all 8 columns: rows 8 + 2 .. 8 + 4 of linear_qkv.
        self.assertEqual(hf_models.boxes(segs, [2, 0], [2, 8]),
                         [(0, 16, "decoder.layers.0.self_attention.linear_qkv.weight", [10, 0], [2, 8])])

    def test_a_column_shard_keeps_its_column_offset(self):
        model, index = gpt_index()
        segs = hf_models.segments(model, index)["model.layers.1.mlp.down_proj.weight"]
        self.assertEqual(hf_models.boxes(segs, [0, 8], [8, 8]),
                         [(0, 64, "decoder.layers.1.mlp.linear_fc2.weight", [0, 8], [8, 8])])

    def test_an_empty_shard_holds_nothing(self):
        model, index = gpt_index()
        segs = hf_models.segments(model, index)["model.norm.weight"]
        self.assertEqual(hf_models.boxes(segs, [8], [0]), [])

    @unittest.skipUnless(importlib.util.find_spec("numpy"), "the gradients are numpy arrays")
    def test_the_whole_gradient_of_up_proj_is_the_second_half_of_fc1(self):
        import numpy as np

        model, index = gpt_index()
        fc1 = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)
        segs = hf_models.segments(model, index)["model.layers.0.mlp.up_proj.weight"]
        up = hf_models.full_gradient(segs, [16, 8], {"decoder.layers.0.mlp.linear_fc1.weight": fc1})
        self.assertTrue(np.array_equal(up, fc1[16:]))


if __name__ == "__main__":
    unittest.main()
