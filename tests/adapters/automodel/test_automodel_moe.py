"""tally_adapters.automodel.moe without torch: every logical param of a MoE GPT is held exactly once by
Automodel's Qwen3-MoE or GPT-OSS params (attention and dense MLPs by rows, routed experts stacked and
transposed, GPT-OSS's expert biases stacked), a shard of a stacked expert tensor lands in the box of
each expert it holds, and the stacked gradient is each expert's logical gradient transposed (a bias
as it is). Automodel's MoE models themselves build on a GPU only (tests/adapters/automodel's
ci/real-automodel runs the dense models; the GPT-OSS names below are the ones
nemo_automodel 0.7.0's GptOssForCausalLM builds)."""

import unittest

import numpy as np
import tally_adapters.automodel.moe as moe


def moe_index(layers=2, dense_layers=(0,), hidden=4, heads=2, groups=1, head_dim=2, ffn=4, moe_ffn=2, experts=2, vocab=4):
    """The gradient index tally writes for a Qwen3-MoE-like GPT: names and shapes."""
    qkv = (heads + 2 * groups) * head_dim
    params = [("embedding.word_embeddings.weight", [vocab, hidden])]
    for L in range(layers):
        p = f"decoder.layers.{L}."
        params += [(p + "input_layernorm.weight", [hidden]),
                   (p + "self_attention.linear_proj.weight", [hidden, heads * head_dim]),
                   (p + "self_attention.linear_qkv.weight", [qkv, hidden]),
                   (p + "self_attention.q_layernorm.weight", [head_dim]),
                   (p + "self_attention.k_layernorm.weight", [head_dim]),
                   (p + "pre_mlp_layernorm.weight", [hidden])]
        if L in dense_layers:
            params += [(p + "mlp.linear_fc1.weight", [2 * ffn, hidden]), (p + "mlp.linear_fc2.weight", [hidden, ffn])]
        else:
            params.append((p + "mlp.router.weight", [experts, hidden]))
            for e in range(experts):
                params += [(p + f"mlp.experts.local_experts.{e}.linear_fc1.weight", [2 * moe_ffn, hidden]),
                           (p + f"mlp.experts.local_experts.{e}.linear_fc2.weight", [hidden, moe_ffn])]
    params += [("decoder.final_layernorm.weight", [hidden]), ("output_layer.weight", [vocab, hidden])]
    model = {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "num_query_groups": groups,
             "kv_channels": head_dim, "vocab_size": vocab, "max_position_embeddings": 16, "num_experts": experts,
             "untie_embeddings_and_output_weights": True}
    return model, [{"name": n, "shape": s} for n, s in params]


def qwen3_moe_shapes(layers=2, dense_layers=(0,), hidden=4, heads=2, groups=1, head_dim=2, ffn=4, moe_ffn=2, experts=2,
                     vocab=4):
    """The params Automodel's Qwen3-MoE builds for that model (as named_parameters gives them)."""
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden], "lm_head.weight": [vocab, hidden]}
    for L in range(layers):
        p = f"model.layers.{L}."
        shapes.update({p + "self_attn.q_proj.weight": [heads * head_dim, hidden],
                       p + "self_attn.k_proj.weight": [groups * head_dim, hidden],
                       p + "self_attn.v_proj.weight": [groups * head_dim, hidden],
                       p + "self_attn.o_proj.weight": [hidden, heads * head_dim],
                       p + "self_attn.q_norm.weight": [head_dim], p + "self_attn.k_norm.weight": [head_dim],
                       p + "input_layernorm.weight": [hidden], p + "post_attention_layernorm.weight": [hidden]})
        if L in dense_layers:
            shapes.update({p + "mlp.gate_proj.weight": [ffn, hidden], p + "mlp.up_proj.weight": [ffn, hidden],
                           p + "mlp.down_proj.weight": [hidden, ffn]})
        else:
            shapes.update({p + "mlp.gate.weight": [experts, hidden],
                           p + "mlp.experts.gate_and_up_projs": [experts, hidden, 2 * moe_ffn],
                           p + "mlp.experts.down_projs": [experts, moe_ffn, hidden]})
    return shapes


def gpt_oss_index(layers=2, hidden=4, heads=2, groups=1, head_dim=2, moe_ffn=2, experts=2, vocab=4):
    """The gradient index tally writes for its gpt-oss preset's shape: sinks, linear, router and expert
    biases, no q/k layernorms, every layer MoE."""
    qkv = (heads + 2 * groups) * head_dim
    params = [("embedding.word_embeddings.weight", [vocab, hidden])]
    for L in range(layers):
        p = f"decoder.layers.{L}."
        params += [(p + "input_layernorm.weight", [hidden]),
                   (p + "self_attention.core_attention.softmax_offset", [heads]),
                   (p + "self_attention.linear_proj.weight", [hidden, heads * head_dim]),
                   (p + "self_attention.linear_proj.bias", [hidden]),
                   (p + "self_attention.linear_qkv.weight", [qkv, hidden]),
                   (p + "self_attention.linear_qkv.bias", [qkv]),
                   (p + "pre_mlp_layernorm.weight", [hidden]),
                   (p + "mlp.router.weight", [experts, hidden]), (p + "mlp.router.bias", [experts])]
        for e in range(experts):
            x = p + f"mlp.experts.local_experts.{e}."
            params += [(x + "linear_fc1.weight", [2 * moe_ffn, hidden]), (x + "linear_fc1.bias", [2 * moe_ffn]),
                       (x + "linear_fc2.weight", [hidden, moe_ffn]), (x + "linear_fc2.bias", [hidden])]
    params += [("decoder.final_layernorm.weight", [hidden]), ("output_layer.weight", [vocab, hidden])]
    model = {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "num_query_groups": groups,
             "kv_channels": head_dim, "vocab_size": vocab, "max_position_embeddings": 16, "num_experts": experts,
             "untie_embeddings_and_output_weights": True, "qk_layernorm": False}
    return model, [{"name": n, "shape": s} for n, s in params]


def gpt_oss_shapes(layers=2, hidden=4, heads=2, groups=1, head_dim=2, moe_ffn=2, experts=2, vocab=4):
    """The params Automodel's GptOssForCausalLM builds for that model (as named_parameters gives them)."""
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden], "lm_head.weight": [vocab, hidden]}
    for L in range(layers):
        p = f"model.layers.{L}."
        shapes.update({p + "self_attn.sinks": [heads],
                       p + "self_attn.q_proj.weight": [heads * head_dim, hidden], p + "self_attn.q_proj.bias": [heads * head_dim],
                       p + "self_attn.k_proj.weight": [groups * head_dim, hidden], p + "self_attn.k_proj.bias": [groups * head_dim],
                       p + "self_attn.v_proj.weight": [groups * head_dim, hidden], p + "self_attn.v_proj.bias": [groups * head_dim],
                       p + "self_attn.o_proj.weight": [hidden, heads * head_dim], p + "self_attn.o_proj.bias": [hidden],
                       p + "mlp.gate.weight": [experts, hidden], p + "mlp.gate.bias": [experts],
                       p + "mlp.experts.gate_and_up_projs": [experts, hidden, 2 * moe_ffn],
                       p + "mlp.experts.down_projs": [experts, moe_ffn, hidden],
                       p + "mlp.experts.gate_up_proj_bias": [experts, 2 * moe_ffn],
                       p + "mlp.experts.down_proj_bias": [experts, hidden],
                       p + "input_layernorm.weight": [hidden], p + "post_attention_layernorm.weight": [hidden]})
    return shapes


def deepseek_v3_index(layers=2, dense_layers=(0,), hidden=4, heads=2, q_lora=4, kv_lora=2, qk_head=2, qk_rope=2, v_head=2,
                      ffn=4, moe_ffn=2, shared=2, experts=2, vocab=4):
    """The gradient index tally writes for its deepseek-v3 preset's shape without MTP: multi-latent
    attention with its latent norms, the first layer dense, a shared expert."""
    params = [("embedding.word_embeddings.weight", [vocab, hidden])]
    for L in range(layers):
        p = f"decoder.layers.{L}."
        a = p + "self_attention."
        params += [(p + "input_layernorm.weight", [hidden]),
                   (a + "linear_proj.weight", [hidden, heads * v_head]),
                   (a + "linear_q_down_proj.weight", [q_lora, hidden]),
                   (a + "linear_q_up_proj.layer_norm_weight", [q_lora]),
                   (a + "linear_q_up_proj.weight", [heads * (qk_head + qk_rope), q_lora]),
                   (a + "linear_kv_down_proj.weight", [kv_lora + qk_rope, hidden]),
                   (a + "linear_kv_up_proj.layer_norm_weight", [kv_lora]),
                   (a + "linear_kv_up_proj.weight", [heads * (qk_head + v_head), kv_lora]),
                   (p + "pre_mlp_layernorm.weight", [hidden])]
        if L in dense_layers:
            params += [(p + "mlp.linear_fc1.weight", [2 * ffn, hidden]), (p + "mlp.linear_fc2.weight", [hidden, ffn])]
            continue
        params.append((p + "mlp.router.weight", [experts, hidden]))
        for e in range(experts):
            params += [(p + f"mlp.experts.local_experts.{e}.linear_fc1.weight", [2 * moe_ffn, hidden]),
                       (p + f"mlp.experts.local_experts.{e}.linear_fc2.weight", [hidden, moe_ffn])]
        params += [(p + "mlp.shared_experts.linear_fc1.weight", [2 * shared, hidden]),
                   (p + "mlp.shared_experts.linear_fc2.weight", [hidden, shared])]
    params += [("decoder.final_layernorm.weight", [hidden]), ("output_layer.weight", [vocab, hidden])]
    model = {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "vocab_size": vocab,
             "max_position_embeddings": 16, "num_experts": experts, "untie_embeddings_and_output_weights": True,
             "qk_layernorm": True, "multi_latent_attention": True, "q_lora_rank": q_lora, "kv_lora_rank": kv_lora,
             "qk_head_dim": qk_head, "qk_pos_emb_head_dim": qk_rope, "v_head_dim": v_head,
             "moe_shared_expert_intermediate_size": shared}
    return model, [{"name": n, "shape": s} for n, s in params]


def deepseek_v3_shapes(layers=2, hidden=4, heads=2, q_lora=4, kv_lora=2, qk_head=2, qk_rope=2, v_head=2, ffn=4, moe_ffn=2,
                       shared=2, experts=2, vocab=4):
    """The params Automodel's DeepseekV3ForCausalLM builds for that model (as named_parameters gives
    them; nemo_automodel 0.7.0 on CPUs)."""
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden], "lm_head.weight": [vocab, hidden]}
    for L in range(layers):
        p = f"model.layers.{L}."
        shapes.update({p + "self_attn.q_a_proj.weight": [q_lora, hidden], p + "self_attn.q_a_layernorm.weight": [q_lora],
                       p + "self_attn.q_b_proj.weight": [heads * (qk_head + qk_rope), q_lora],
                       p + "self_attn.kv_a_proj_with_mqa.weight": [kv_lora + qk_rope, hidden],
                       p + "self_attn.kv_a_layernorm.weight": [kv_lora],
                       p + "self_attn.kv_b_proj.weight": [heads * (qk_head + v_head), kv_lora],
                       p + "self_attn.o_proj.weight": [hidden, heads * v_head],
                       p + "input_layernorm.weight": [hidden], p + "post_attention_layernorm.weight": [hidden]})
        if L == 0:
            shapes.update({p + "mlp.gate_proj.weight": [ffn, hidden], p + "mlp.up_proj.weight": [ffn, hidden],
                           p + "mlp.down_proj.weight": [hidden, ffn]})
        else:
            shapes.update({p + "mlp.gate.weight": [experts, hidden],
                           p + "mlp.experts.gate_and_up_projs": [experts, hidden, 2 * moe_ffn],
                           p + "mlp.experts.down_projs": [experts, moe_ffn, hidden],
                           p + "mlp.shared_experts.gate_proj.weight": [shared, hidden],
                           p + "mlp.shared_experts.up_proj.weight": [shared, hidden],
                           p + "mlp.shared_experts.down_proj.weight": [hidden, shared]})
    return shapes


class DeepseekV3(unittest.TestCase):
    def test_every_logical_element_is_held_exactly_once(self):
        model, index = deepseek_v3_index()
        self.assertEqual(moe.family(model), moe.DEEPSEEK_V3)
        moe.check_cover(moe.parts(model, index), deepseek_v3_shapes(), index)

    def test_the_shared_expert_is_split_into_gate_and_up_rows(self):
        model, index = deepseek_v3_index()
        held = moe.parts(model, index)
        self.assertEqual(held["model.layers.1.mlp.shared_experts.up_proj.weight"],
                         [moe.Rows(0, 2, "decoder.layers.1.mlp.shared_experts.linear_fc1.weight", 2)])

    def test_dense_layers_after_a_moe_layer_are_not_deepseek_v3(self):
        model, index = deepseek_v3_index(dense_layers=(1,))
        with self.assertRaisesRegex(LookupError, r"dense layers \[1\]; DeepSeek-V3's dense layers are its first k"):
            moe.deepseek_v3_config(model, index)


class Family(unittest.TestCase):
    def test_qk_layernorm_makes_qwen3_moe_and_its_absence_gpt_oss(self):
        self.assertEqual(moe.family({"qk_layernorm": True}), moe.QWEN3_MOE)
        self.assertEqual(moe.family({"qk_layernorm": False}), moe.GPT_OSS)
        self.assertEqual(moe.ARCHITECTURES[moe.GPT_OSS][0], "GptOssForCausalLM")


class GptOss(unittest.TestCase):
    def test_every_logical_element_is_held_exactly_once(self):
        model, index = gpt_oss_index(experts=4)
        moe.check_cover(moe.parts(model, index), gpt_oss_shapes(experts=4), index)

    def test_an_experts_biases_are_its_rows_of_the_stacked_biases(self):
        model, index = gpt_oss_index()
        held = moe.parts(model, index)
        tensors = {p["name"]: np.arange(np.prod(p["shape"]), dtype=np.float32).reshape(p["shape"]) + 1 for p in index}
        full = moe.full_gradient(held["model.layers.0.mlp.experts.gate_up_proj_bias"], [2, 4], tensors)
        np.testing.assert_array_equal(full[1], tensors["decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.bias"])
        self.assertEqual(held["model.layers.0.self_attn.sinks"],
                         [moe.Rows(0, 2, "decoder.layers.0.self_attention.core_attention.softmax_offset", 0)])
        self.assertEqual(held["model.layers.0.self_attn.k_proj.bias"],
                         [moe.Rows(0, 2, "decoder.layers.0.self_attention.linear_qkv.bias", 4)])

    def test_a_shard_of_stacked_biases_over_ep_and_ep_shard_is_a_box_of_each_experts_bias(self):
        model, index = gpt_oss_index(experts=4, hidden=8)
        held = moe.parts(model, index)["model.layers.1.mlp.experts.down_proj_bias"]
        # EP 2 holds experts 2 and 3; FSDP2's Shard(1) over ep_shard 2 holds hidden 4..7 of each.
        self.assertEqual(moe.boxes(held, [2, 4], [2, 4]),
                         [(0, 4, "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.bias", [4], [4]),
                          (4, 8, "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.bias", [4], [4])])
        self.assertTrue(moe.is_expert(held))

    def test_a_stacked_bias_of_the_wrong_width_is_a_model_mismatch(self):
        model, index = gpt_oss_index()
        shapes = gpt_oss_shapes()
        shapes["model.layers.1.mlp.experts.down_proj_bias"] = [2, 2]
        with self.assertRaisesRegex(LookupError, "its row 0 is not"):
            moe.check_cover(moe.parts(model, index), shapes, index)

    def test_a_dense_layer_is_not_gpt_oss(self):
        model, index = moe_index()  # layer 0 dense
        model["qk_layernorm"] = False
        with self.assertRaisesRegex(LookupError, "every layer of GPT-OSS is MoE"):
            moe.gpt_oss_config(model, index)


class Cover(unittest.TestCase):
    def test_every_logical_element_is_held_exactly_once(self):
        model, index = moe_index()
        moe.check_cover(moe.parts(model, index), qwen3_moe_shapes(), index)

    def test_the_dense_layers_are_qwen3_moes_mlp_only_layers(self):
        model, index = moe_index(layers=3, dense_layers=(0, 1))
        d = moe.dimensions(model, index)
        self.assertEqual(d["dense_layers"], [0, 1])
        self.assertEqual((d["ffn"], d["moe_ffn"], d["experts"]), (4, 2, 2))

    def test_an_expert_held_twice_or_a_missing_param_is_a_model_mismatch(self):
        model, index = moe_index()
        held = moe.parts(model, index)
        stack = held["model.layers.1.mlp.experts.down_projs"]
        held["model.layers.1.mlp.experts.down_projs"] = [stack[0], moe.Transposed(1, stack[0].logical)]
        with self.assertRaisesRegex(LookupError, "local_experts.0.linear_fc2.weight are held 2 times, not once"):
            moe.check_cover(held, qwen3_moe_shapes(), index)
        shapes = qwen3_moe_shapes()
        del shapes["model.layers.1.mlp.gate.weight"]
        with self.assertRaisesRegex(LookupError, "model mismatch: the model lacks"):
            moe.check_cover(moe.parts(model, index), shapes, index)

    def test_a_stack_that_is_not_the_transpose_is_a_model_mismatch(self):
        model, index = moe_index()
        shapes = qwen3_moe_shapes()
        shapes["model.layers.1.mlp.experts.down_projs"] = [2, 4, 2]  # Megatron's orientation, not Automodel's
        with self.assertRaisesRegex(LookupError, "transposed"):
            moe.check_cover(moe.parts(model, index), shapes, index)


class StackedExperts(unittest.TestCase):
    def test_the_stacked_gradient_is_each_experts_gradient_transposed(self):
        model, index = moe_index()
        held = moe.parts(model, index)
        tensors = {p["name"]: np.arange(np.prod(p["shape"]), dtype=np.float32).reshape(p["shape"]) for p in index}
        full = moe.full_gradient(held["model.layers.1.mlp.experts.gate_and_up_projs"], [2, 4, 4], tensors)
        np.testing.assert_array_equal(full[1], tensors["decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"].T)

    def test_a_shard_over_ep_and_ep_shard_is_a_transposed_box_of_each_expert_it_holds(self):
        model, index = moe_index(experts=4)
        held = moe.parts(model, index)["model.layers.1.mlp.experts.down_projs"]
        # EP 2 holds experts 2 and 3; FSDP2's Shard(1) over ep_shard 2 holds ffn row 1 of each.
        got = moe.boxes(held, [2, 1, 0], [2, 1, 4])
        self.assertEqual(got, [(0, 4, "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight", [0, 1], [4, 1]),
                               (4, 8, "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight", [0, 1], [4, 1])])

    def test_a_shard_of_the_rows_keeps_hf_models_boxes(self):
        model, index = moe_index()
        held = moe.parts(model, index)["model.layers.0.self_attn.k_proj.weight"]
        self.assertEqual(moe.boxes(held, [1, 0], [1, 4]),
                         [(0, 4, "decoder.layers.0.self_attention.linear_qkv.weight", [5, 0], [1, 4])])


if __name__ == "__main__":
    unittest.main()
