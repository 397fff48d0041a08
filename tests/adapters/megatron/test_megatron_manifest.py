"""Unit tests of the Megatron adapter's pure parts (names, boxes, the group table, the files): no
torch, no Megatron, no GPU. Run: python3 -m pytest tests/adapters."""

import json
import os
import stat
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))

import tally_adapters.manifest as fmt  # noqa: E402
from tally_adapters.megatron import names as megatron_names  # noqa: E402
from tally_adapters.megatron import optimizer_plan  # noqa: E402


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
        names = megatron_names.logical_module_names(moe_modules([1], [2, 3]))
        self.assertEqual(
            megatron_names.logical_param_name("decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.bias", names),
            "decoder.layers.0.mlp.experts.local_experts.2.linear_fc2.bias",
        )
        self.assertEqual(
            megatron_names.logical_param_name("decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight", names),
            "decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight",
        )

    def test_layer_ids_carry_the_pipeline_offset(self):
        # the second pipeline stage of a 4-layer model: local layers 0, 1 are global 2, 3
        names = megatron_names.logical_module_names(moe_modules([3, 4], [0, 1]))
        self.assertEqual(
            megatron_names.logical_param_name("decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.bias", names),
            "decoder.layers.3.mlp.experts.local_experts.1.linear_fc2.bias",
        )
        self.assertEqual(
            megatron_names.logical_param_name("decoder.layers.0.mlp.router.weight", names),
            "decoder.layers.2.mlp.router.weight",
        )
        self.assertEqual(
            megatron_names.logical_param_name("decoder.layers.0.mlp.shared_experts.linear_fc1.weight", names),
            "decoder.layers.2.mlp.shared_experts.linear_fc1.weight",
        )

    def test_names_outside_layers_are_kept(self):
        names = megatron_names.logical_module_names(moe_modules([1], [0, 1]))
        self.assertEqual(
            megatron_names.logical_param_name("embedding.word_embeddings.weight", names),
            "embedding.word_embeddings.weight",
        )
        self.assertEqual(
            megatron_names.logical_param_name("decoder.final_layernorm.weight", names),
            "decoder.final_layernorm.weight",
        )

    def test_tied_output_copy_names_the_embedding(self):
        names = megatron_names.logical_module_names([("", {}), ("output_layer", {})])
        self.assertEqual(
            megatron_names.logical_param_name("output_layer.weight", names, shared=True),
            "embedding.word_embeddings.weight",
        )
        self.assertEqual(megatron_names.logical_param_name("output_layer.weight", names), "output_layer.weight")

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
        names = megatron_names.logical_module_names(entries)
        grouped = {"decoder.layers.0.mlp.experts.linear_fc1": [4, 5]}
        self.assertEqual(
            megatron_names.logical_param_name("decoder.layers.0.mlp.experts.linear_fc1.weight1", names, expert_ids=grouped),
            "decoder.layers.1.mlp.experts.local_experts.5.linear_fc1.weight",
        )

    def test_routed_expert_names(self):
        self.assertTrue(megatron_names.is_routed_expert_name("decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.bias"))
        self.assertFalse(megatron_names.is_routed_expert_name("decoder.layers.0.mlp.shared_experts.linear_fc2.weight"))
        self.assertFalse(megatron_names.is_routed_expert_name("decoder.layers.0.mlp.router.weight"))


class BoxTest(unittest.TestCase):
    def test_column_shard(self):
        self.assertEqual(megatron_names.shard_box([12, 8], True, 0, 1, 2), ([24, 8], [12, 0], [12, 8]))

    def test_row_shard(self):
        self.assertEqual(megatron_names.shard_box([8, 8], True, 1, 1, 2), ([8, 16], [0, 8], [8, 8]))

    def test_negative_partition_dim(self):
        self.assertEqual(megatron_names.shard_box([8, 4], True, -1, 2, 4), ([8, 16], [0, 8], [8, 4]))

    def test_replicated_is_whole(self):
        self.assertEqual(megatron_names.shard_box([8], False, -1, 1, 2), ([8], [0], [8]))

    def test_group_of_one_is_whole(self):
        # ETP 1: an expert weight marked tensor_model_parallel is still the whole tensor
        self.assertEqual(megatron_names.shard_box([16, 8], True, 0, 0, 1), ([16, 8], [0, 0], [16, 8]))

    def test_bad_partition_dim(self):
        with self.assertRaises(ValueError):
            megatron_names.shard_box([8], True, 3, 0, 2)


class AttentionSinkTest(unittest.TestCase):
    # The local DotProductAttention's learnable softmax_offset is this TP rank's heads, unmarked.
    def test_the_sink_is_known_by_its_local_name(self):
        self.assertTrue(megatron_names.is_attention_sink("decoder.layers.1.self_attention.core_attention.softmax_offset"))
        self.assertTrue(megatron_names.is_attention_sink("mtp.layers.0.transformer_layer.self_attention.core_attention.softmax_offset"))
        self.assertFalse(megatron_names.is_attention_sink("decoder.layers.1.self_attention.linear_qkv.weight"))
        self.assertFalse(megatron_names.is_attention_sink("decoder.layers.1.self_attention.core_attention.softmax_offset.extra"))

    def test_the_sink_of_tp_rank_one_is_the_second_half_of_the_heads(self):
        # 4 heads over TP 2: rank 1 holds heads 2 and 3, as its sharded_state_dict says (dim 0)
        self.assertEqual(megatron_names.shard_box([2], True, 0, 1, 2), ([4], [2], [2]))


class HeldBoxTest(unittest.TestCase):
    # Megatron-FSDP holds a flat range of each TP-local box: whole rows of a matrix, any run of a vector.
    def test_whole_rows_of_a_tp_shard_are_a_box_inside_it(self):
        self.assertEqual(megatron_names.held_box([0, 8], [6, 8], 16, 40), ([2, 8], [3, 8]))

    def test_a_vector_holds_any_run(self):
        self.assertEqual(megatron_names.held_box([4], [8], 3, 5), ([7], [2]))

    def test_the_whole_box(self):
        self.assertEqual(megatron_names.held_box([0, 0], [2, 3], 0, 6), ([0, 0], [2, 3]))

    def test_an_empty_range_holds_nothing(self):
        self.assertIsNone(megatron_names.held_box([0, 0], [2, 3], 6, 6))

    def test_part_of_a_row_is_refused_naming_the_param(self):
        with self.assertRaisesRegex(ValueError, "^w: held range \\[2, 6\\) of shape \\[2, 3\\] is not whole rows"):
            megatron_names.held_box([0, 0], [2, 3], 2, 6, "w")

    def test_a_range_outside_the_box_is_refused(self):
        with self.assertRaisesRegex(ValueError, "outside its 6 elements"):
            megatron_names.held_box([0, 0], [2, 3], 0, 7)


class FileTest(unittest.TestCase):
    def test_atomic_write_with_final_newline(self):
        with tempfile.TemporaryDirectory() as d:
            path = fmt.write_manifest({"tally_manifest": 2, "rank": 3, "x": [1, 2]}, d)
            self.assertEqual(os.path.basename(path), "rank-3.json")
            with open(path) as f:
                text = f.read()
            self.assertTrue(text.endswith("}\n"))
            self.assertEqual(json.loads(text)["x"], [1, 2])
            self.assertEqual(sorted(os.listdir(d)), ["rank-3.json"])

    def test_non_finite_values_are_refused(self):
        with self.assertRaises(ValueError):
            fmt.manifest_text({"reported": {"norm": float("inf")}})


def v1_manifest(rank, world, groups, optimizers):
    """A manifest as build_manifest builds it (groups as rank lists), params left out."""
    return {
        "tally_manifest": 1,
        "producer": "test",
        "rank": rank,
        "world": world,
        "parallel": {"tp": 2, "cp": 1, "pp": 1, "dp": 2, "ep": 1, "etp": 1},
        "groups": groups,
        "params": [],
        "optimizers": optimizers,
        "reported": {"norm": 1.0, "inf_norm": None, "zeros": 0},
    }


def optimizer(stats_group, tp_group, expert_tp_group):
    return {
        "name": "opt",
        "stats_group": stats_group,
        "tp_group": tp_group,
        "expert_tp_group": expert_tp_group,
        "clip": None,
        "main_params": [],
    }


def gather(led_per_rank):
    """What all_gather_object hands every rank in dump_manifest: each rank's led lists, sent as
    runs and read back."""
    sent = [[fmt.rank_runs(ranks) for ranks in led] for led in led_per_rank]
    return [[fmt.ranks_from_runs(runs) for runs in led_runs] for led_runs in sent]


class GroupTableTest(unittest.TestCase):
    def test_led_groups_picks_lists_the_rank_leads_and_dedups(self):
        lists = [[2, 3], [0, 1, 2, 3], [2, 3], [2], [1, 2], [2, 5, 7], [2], []]
        self.assertEqual(fmt.led_groups(2, lists), [[2], [2, 3], [2, 5, 7]])
        self.assertEqual(fmt.led_groups(0, lists), [[0, 1, 2, 3]])
        self.assertEqual(fmt.led_groups(4, lists), [])

    def test_group_table_is_the_same_whatever_order_contributions_come_in(self):
        led = [[[0, 1], [0, 1, 2, 3]], [[1]], [[2, 3], [2]], [[3]]]
        expected = [[0, 1], [0, 1, 2, 3], [1], [2], [2, 3], [3]]
        self.assertEqual(fmt.group_table(led), expected)
        self.assertEqual(fmt.group_table(list(reversed(led))), expected)
        shuffled = [[[3]], [[2], [2, 3]], [[0, 1, 2, 3], [0, 1]], [[1]], [[0, 1]]]
        self.assertEqual(fmt.group_table(shuffled), expected)

    def test_group_table_rejects_an_unsorted_list(self):
        with self.assertRaisesRegex(ValueError, r"gathered\[1\]\[0\] \[1, 0\]: not sorted ascending"):
            fmt.group_table([[[0]], [[1, 0]]])

    def test_group_table_rejects_a_repeated_rank(self):
        with self.assertRaisesRegex(ValueError, r"gathered\[0\]\[1\] \[0, 2, 2\]: rank 2 appears twice"):
            fmt.group_table([[[0], [0, 2, 2]]])

    def test_group_table_rejects_an_empty_list(self):
        with self.assertRaisesRegex(ValueError, r"gathered\[2\]\[0\]: the rank list is empty"):
            fmt.group_table([[[0]], [], [[]]])

    def test_refer_to_groups_maps_every_group_field(self):
        table = [[0], [0, 1], [0, 1, 2, 3], [0, 2]]
        manifest = v1_manifest(
            0,
            4,
            {"tp": [0, 1], "expt_tp": [0], "dp_cp": [0, 2], "world": [0, 1, 2, 3]},
            [optimizer([0, 1, 2, 3], [0, 1], None), optimizer([0, 2], None, [0])],
        )
        before = json.dumps(manifest)
        out = fmt.refer_to_groups(manifest, table)
        self.assertEqual(out["tally_manifest"], 2)
        self.assertEqual(out["groups"], {"tp": 1, "expt_tp": 0, "dp_cp": 3, "world": 2})
        self.assertEqual(list(out["groups"]), ["tp", "expt_tp", "dp_cp", "world"])
        self.assertEqual(
            [(o["stats_group"], o["tp_group"], o["expert_tp_group"]) for o in out["optimizers"]],
            [(2, 1, None), (3, None, 0)],
        )
        self.assertEqual(out["reported"], manifest["reported"])
        self.assertEqual(json.dumps(manifest), before)  # the input is left as it was

    def test_a_manifest_echoes_the_requests_digest_after_its_producer(self):
        manifest = fmt.refer_to_groups(
            v1_manifest(0, 2, {"tp": [0, 1], "expt_tp": [0]}, [optimizer([0, 1], None, None)]), [[0], [0, 1]])
        out = fmt.with_case_digest(manifest, "0123456789abcdef")
        self.assertEqual(out["case_digest"], "0123456789abcdef")
        keys = list(out)
        self.assertEqual(keys[keys.index("producer") + 1], "case_digest")
        self.assertNotIn("case_digest", manifest)  # the input is left as it was
        again = fmt.with_case_digest(out, "fedcba9876543210")
        self.assertEqual((again["case_digest"], list(again)), ("fedcba9876543210", keys))
        for bad in ("0123456789ABCDEF", "0123", None, 12):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, "is not 16 lowercase hex digits"):
                fmt.with_case_digest(manifest, bad)

    def test_refer_to_groups_rejects_a_list_missing_from_the_table(self):
        table = [[0], [0, 1], [0, 1, 2, 3]]
        for groups, opt, field in [
            ({"tp": [0, 1], "expt_tp": [0, 2]}, optimizer([0, 1], None, None), r"groups\.expt_tp"),
            ({"tp": [0, 1], "expt_tp": [0]}, optimizer([0, 2], None, None), r"optimizers\[0\]\.stats_group"),
            ({"tp": [0, 1], "expt_tp": [0]}, optimizer([0, 1], [0, 2], None), r"optimizers\[0\]\.tp_group"),
            ({"tp": [0, 1], "expt_tp": [0]}, optimizer([0, 1], None, [1]), r"optimizers\[0\]\.expert_tp_group"),
        ]:
            with self.subTest(field=field):
                with self.assertRaisesRegex(ValueError, f"rank 0: {field} .* is not in the group table"):
                    fmt.refer_to_groups(v1_manifest(0, 4, groups, [opt]), table)

    def test_simulated_tp2_dp2_run_with_a_world_stats_group(self):
        # ranks 0..3: TP groups [0, 1], [2, 3]; DP groups [0, 2], [1, 3]; ETP 1; a distributed
        # optimizer reducing over the world, and a dense child over DP with the TP group
        world = 4
        manifests = []
        for r in range(world):
            tp = [r - r % 2, r - r % 2 + 1]
            dp = [r % 2, r % 2 + 2]
            groups = {"tp": tp, "expt_tp": [r], "dp_cp": dp, "world": list(range(world))}
            opts = [optimizer(list(range(world)), tp, [r]), optimizer(dp, tp, None)]
            manifests.append(v1_manifest(r, world, groups, opts))
        led = [fmt.led_groups(m["rank"], fmt.manifest_rank_lists(m)) for m in manifests]
        self.assertEqual(led[0], [[0], [0, 1], [0, 1, 2, 3], [0, 2]])
        self.assertEqual(led[3], [[3]])
        gathered = gather(led)
        # every distinct group crosses the wire once: the sum of their sizes, not world squared
        table = fmt.group_table(gathered)
        self.assertEqual(table, [[0], [0, 1], [0, 1, 2, 3], [0, 2], [1], [1, 3], [2], [2, 3], [3]])
        self.assertEqual(sum(len(g) for led_r in gathered for g in led_r), sum(len(g) for g in table))
        for m in manifests:
            # each rank builds the table on its own, from the same gathered lists
            out = fmt.refer_to_groups(m, fmt.group_table(gathered))
            self.assertEqual(out["tally_manifest"], 2)
            for name, ranks in m["groups"].items():
                self.assertEqual(table[out["groups"][name]], ranks, f"rank {m['rank']} {name}")
            for o, o1 in zip(out["optimizers"], m["optimizers"]):
                for key in ("stats_group", "tp_group", "expert_tp_group"):
                    got = None if o[key] is None else table[o[key]]
                    self.assertEqual(got, o1[key], f"rank {m['rank']} {key}")
            self.assertEqual(out["groups"]["world"], 2)

    def test_rank_runs_round_trip_and_a_world_list_is_one_run(self):
        for ranks in ([], [3], [0, 1, 4, 5], [0, 4, 8, 12, 13], [1, 0, 1, 1], [5, 2, 9, 9, 0]):
            with self.subTest(ranks=ranks):
                self.assertEqual(fmt.ranks_from_runs(fmt.rank_runs(ranks)), ranks)
        self.assertEqual(fmt.rank_runs(list(range(65536))), [[0, 1, 65536]])
        self.assertEqual(fmt.rank_runs(list(range(3, 4096, 8))), [[3, 8, 512]])

    def test_groups_file_and_write_groups(self):
        table = [[0, 1], [0, 1, 2, 3], [2, 3]]
        self.assertEqual(
            fmt.groups_file(4, table), {"tally_groups": 2, "world": 4, "groups": table}
        )
        expected = json.dumps(
            {"tally_groups": 2, "world": 4, "groups": table}, indent=2, allow_nan=False
        ) + "\n"
        umask = 0o022  # not mkstemp's 0600, so that a missing chmod shows
        saved = os.umask(umask)
        self.addCleanup(os.umask, saved)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "groups.json"), "w") as f:
                f.write("old")
            path = fmt.write_groups(4, table, d)
            self.assertEqual(path, os.path.join(d, "groups.json"))
            with open(path) as f:
                self.assertEqual(f.read(), expected)
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o666 & ~umask)
            self.assertEqual(os.listdir(d), ["groups.json"])
            # a failed replace leaves the old file and no temporary one
            with mock.patch.object(fmt.os, "replace", side_effect=OSError("disk full")):
                with self.assertRaises(OSError):
                    fmt.write_groups(4, [[0, 1, 2, 3]], d)
            self.assertEqual(os.listdir(d), ["groups.json"])
            with open(path) as f:
                self.assertEqual(f.read(), expected)

    def test_groups_file_rejects_a_bad_table(self):
        for world, table, message in [
            (4, [[0, 1], [0, 1]], r"groups\[1\] \[0, 1\] appears twice"),
            (4, [[2, 3], [0, 1]], r"groups\[1\] \[0, 1\] is not in sorted order"),
            (4, [[0, 4]], r"groups\[0\] \[0, 4\]: rank 4 is outside \[0, 4\)"),
            (4, [[1, 0]], r"groups\[0\] \[1, 0\]: not sorted ascending"),
            (0, [], r"world 0 is not a positive integer"),
        ]:
            with self.subTest(message=message):
                with self.assertRaisesRegex(ValueError, "groups_file: " + message):
                    fmt.groups_file(world, table)
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(ValueError):
                fmt.write_groups(2, [[0, 2]], d)
            self.assertEqual(os.listdir(d), [])


if __name__ == "__main__":
    unittest.main()


class _Config:
    log_num_zeros_in_grad = True


class _Float16:  # stands for Float16OptimizerWithFloat16Params
    config = _Config()

    def get_grad_stats_parallel_group(self):
        return "mp"

    def count_zeros(self):  # as 0.19.2's MegatronOptimizer.count_zeros
        return count_zeros_fp32(self.params, tp_group=self.tp_group, expert_tp_group=self.expert_tp_group)  # noqa: F821


class _DistOpt(_Float16):  # stands for DistributedOptimizer
    tp_group = "tp"

    def get_grad_stats_parallel_group(self):
        return "intra-dist-opt"


class _Chained:  # stands for ChainedOptimizer
    config = _Config()

    def __init__(self, children, shared=False):
        self.chained_optimizers = children
        self.shared = shared

    def grads_states_parallel_group_is_shared(self):
        return self.shared

    def get_grad_stats_parallel_group(self):
        return self.chained_optimizers[0].get_grad_stats_parallel_group()

    def count_zeros(self):  # as 0.19.2's shared path: the first child's groups
        return count_zeros_fp32(self.params, tp_group=self.chained_optimizers[0].tp_group)  # noqa: F821 (never run)


class _LayerWise(_Chained):  # stands for 0.19.2's LayerWiseDistributedOptimizer
    def count_zeros(self):
        return count_zeros_fp32(self.params, grad_stats_parallel_group=None)  # noqa: F821 (never run)


class ChainedLayerWisePlanTest(unittest.TestCase):
    """megatron-core 0.19's parameter layout chains the layer-wise optimizer with a
    DistributedOptimizer: the recorder takes the layer-wise optimizer's children as children over
    WORLD, with its zero count, and the DistributedOptimizer as it is."""

    CLASSES = {
        "ChainedOptimizer": _Chained,
        "Float16OptimizerWithFloat16Params": _Float16,
        "FP32Optimizer": _Float16,
        "LayerWiseDistributedOptimizer": _LayerWise,
        "DistributedOptimizer": _DistOpt,
    }

    def plan(self, optimizer):
        with mock.patch.object(optimizer_plan, "_megatron_classes", return_value=self.CLASSES):
            return optimizer_plan._plan(optimizer, 4)

    def test_the_layer_wise_children_reduce_over_the_world_beside_the_distributed_optimizer(self):
        muon, adam, distopt = _Float16(), _Float16(), _DistOpt()
        plan = self.plan(_Chained([_LayerWise([muon, adam]), distopt]))
        self.assertEqual(
            [p.name for p in plan],
            [
                "_Chained.chained_optimizers[0].chained_optimizers[0]",
                "_Chained.chained_optimizers[0].chained_optimizers[1]",
                "_Chained.chained_optimizers[1]",
            ],
        )
        self.assertEqual([p.child for p in plan], [muon, adam, distopt])
        self.assertEqual([p.stats_group for p in plan], [None, None, "intra-dist-opt"])
        self.assertEqual([p.zeros_counted for p in plan], [True, True, True])
        self.assertEqual([(p.zeros_tp_group, p.zeros_expert_tp_group) for p in plan[:2]], [(None, None)] * 2)

    def test_a_chain_sharing_one_group_with_the_layer_wise_optimizer_is_not_recorded(self):
        with self.assertRaisesRegex(NotImplementedError, r"chained_optimizers\[0\] \(_LayerWise\) shares one"):
            self.plan(_Chained([_LayerWise([_Float16()]), _DistOpt()], shared=True))

    def test_any_other_chain_inside_a_chain_is_refused(self):
        with self.assertRaisesRegex(NotImplementedError, "_Chained nested inside a ChainedOptimizer"):
            self.plan(_Chained([_Chained([_Float16()]), _DistOpt()]))
