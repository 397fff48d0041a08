"""Unit tests of the Megatron adapter's pure parts (names, boxes, the file): no torch, no
Megatron, no GPU. Run: python3 -m unittest discover -s tests/adapters (or pytest)."""

import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "adapters", "megatron"))

import tally_megatron as tm  # noqa: E402


def moe_modules(layer_numbers, local_expert_indices, experts_per_rank=2):
    """named_modules() entries of a GPTModel stage with SequentialMLP experts."""
    entries = [("", {}), ("embedding", {}), ("decoder", {}), ("decoder.layers", {})]
    for i, ln in enumerate(layer_numbers):
        base = f"decoder.layers.{i}"
        entries.append((base, {"layer_number": ln}))
        entries.append((f"{base}.mlp", {}))
        entries.append((f"{base}.mlp.router", {}))
        entries.append((f"{base}.mlp.experts", {"local_expert_indices": local_expert_indices}))
        entries.append((f"{base}.mlp.experts.local_experts", {}))
        for e in range(experts_per_rank):
            entries.append((f"{base}.mlp.experts.local_experts.{e}", {}))
            entries.append((f"{base}.mlp.experts.local_experts.{e}.linear_fc2", {}))
        entries.append((f"{base}.mlp.shared_experts", {}))
        entries.append((f"{base}.mlp.shared_experts.linear_fc1", {}))
    return entries


class NameTest(unittest.TestCase):
    def test_expert_ids_are_global(self):
        # EP rank 1 of 2 with 4 experts holds experts 2 and 3
        names = tm.logical_module_names(moe_modules([1], [2, 3]))
        self.assertEqual(
            tm.logical_param_name("decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.bias", names),
            "decoder.layers.0.mlp.experts.2.linear_fc2.bias",
        )
        self.assertEqual(
            tm.logical_param_name("decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight", names),
            "decoder.layers.0.mlp.experts.3.linear_fc2.weight",
        )

    def test_layer_ids_carry_the_pipeline_offset(self):
        # the second pipeline stage of a 4-layer model: local layers 0, 1 are global 2, 3
        names = tm.logical_module_names(moe_modules([3, 4], [0, 1]))
        self.assertEqual(
            tm.logical_param_name("decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.bias", names),
            "decoder.layers.3.mlp.experts.1.linear_fc2.bias",
        )
        self.assertEqual(
            tm.logical_param_name("decoder.layers.0.mlp.router.weight", names),
            "decoder.layers.2.mlp.router.weight",
        )
        self.assertEqual(
            tm.logical_param_name("decoder.layers.0.mlp.shared_experts.linear_fc1.weight", names),
            "decoder.layers.2.mlp.shared_experts.linear_fc1.weight",
        )

    def test_names_outside_layers_are_kept(self):
        names = tm.logical_module_names(moe_modules([1], [0, 1]))
        self.assertEqual(
            tm.logical_param_name("embedding.word_embeddings.weight", names),
            "embedding.word_embeddings.weight",
        )
        self.assertEqual(
            tm.logical_param_name("decoder.final_layernorm.weight", names),
            "decoder.final_layernorm.weight",
        )

    def test_tied_output_copy_names_the_embedding(self):
        names = tm.logical_module_names([("", {}), ("output_layer", {})])
        self.assertEqual(
            tm.logical_param_name("output_layer.weight", names, shared=True),
            "embedding.word_embeddings.weight",
        )
        self.assertEqual(tm.logical_param_name("output_layer.weight", names), "output_layer.weight")

    def test_te_grouped_linear_leaves(self):
        entries = [
            ("", {}),
            ("decoder", {}),
            ("decoder.layers", {}),
            ("decoder.layers.0", {"layer_number": 2}),
            ("decoder.layers.0.mlp", {}),
            ("decoder.layers.0.mlp.experts", {"local_expert_indices": [4, 5]}),
            ("decoder.layers.0.mlp.experts.linear_fc1", {}),
        ]
        names = tm.logical_module_names(entries)
        grouped = {"decoder.layers.0.mlp.experts.linear_fc1": [4, 5]}
        self.assertEqual(
            tm.logical_param_name("decoder.layers.0.mlp.experts.linear_fc1.weight1", names, expert_ids=grouped),
            "decoder.layers.1.mlp.experts.5.linear_fc1.weight",
        )

    def test_routed_expert_names(self):
        self.assertTrue(tm.is_routed_expert_name("decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.bias"))
        self.assertFalse(tm.is_routed_expert_name("decoder.layers.0.mlp.shared_experts.linear_fc2.weight"))
        self.assertFalse(tm.is_routed_expert_name("decoder.layers.0.mlp.router.weight"))


class BoxTest(unittest.TestCase):
    def test_column_shard(self):
        self.assertEqual(tm.shard_box([12, 8], True, 0, 1, 2), ([24, 8], [12, 0], [12, 8]))

    def test_row_shard(self):
        self.assertEqual(tm.shard_box([8, 8], True, 1, 1, 2), ([8, 16], [0, 8], [8, 8]))

    def test_negative_partition_dim(self):
        self.assertEqual(tm.shard_box([8, 4], True, -1, 2, 4), ([8, 16], [0, 8], [8, 4]))

    def test_replicated_is_whole(self):
        self.assertEqual(tm.shard_box([8], False, -1, 1, 2), ([8], [0], [8]))

    def test_group_of_one_is_whole(self):
        # ETP 1: an expert weight marked tensor_model_parallel is still the whole tensor
        self.assertEqual(tm.shard_box([16, 8], True, 0, 0, 1), ([16, 8], [0, 0], [16, 8]))

    def test_bad_partition_dim(self):
        with self.assertRaises(ValueError):
            tm.shard_box([8], True, 3, 0, 2)


class FileTest(unittest.TestCase):
    def test_atomic_write_with_final_newline(self):
        with tempfile.TemporaryDirectory() as d:
            path = tm.write_manifest({"tally_manifest": 1, "rank": 3, "x": [1, 2]}, d)
            self.assertEqual(os.path.basename(path), "rank-3.json")
            with open(path) as f:
                text = f.read()
            self.assertTrue(text.endswith("}\n"))
            self.assertEqual(json.loads(text)["x"], [1, 2])
            self.assertEqual(sorted(os.listdir(d)), ["rank-3.json"])

    def test_non_finite_values_are_refused(self):
        with self.assertRaises(ValueError):
            tm.manifest_text({"reported": {"norm": float("inf")}})


if __name__ == "__main__":
    unittest.main()
