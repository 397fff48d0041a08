"""Unit tests of the DeepSpeed adapter's and the worker queue's pure parts: no torch, no DeepSpeed.
Run: python3 -m pytest tests/adapters."""

import json
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
import fault_catalog  # noqa: E402
import tally_adapters.deepspeed.fused_adam as fused_adam  # noqa: E402
import tally_adapters.deepspeed.recording as td  # noqa: E402
import tally_adapters.queue as queue  # noqa: E402
from tally_adapters.deepspeed import experts, models, pipeline, plants  # noqa: E402
from tally_adapters.manifest import write_atomically  # noqa: E402


class FusedAdamArchitectureList(unittest.TestCase):
    """FusedAdam builds whatever form TORCH_CUDA_ARCH_LIST takes: DeepSpeed 0.19.8's op builder reads
    only "major.minor[+PTX]" entries (int() of each number), torch writes "9.0a" and "Hopper" too."""

    def test_every_form_torch_takes_becomes_one_deepspeed_reads(self):
        for given, expected in [
            ("9.0a", "9.0"),  # the H200 machine's preset: int('0a') failed
            ("9.0+PTX", "9.0+PTX"),
            ("8.0;9.0a", "8.0;9.0"),
            ("8.0 8.6  9.0a+PTX", "8.0;8.6;9.0+PTX"),
            ("Ampere;Hopper", "8.0;8.6+PTX;9.0+PTX"),
            ("10.0f;12.0a", "10.0;12.0"),
            ("9.0;9.0a", "9.0"),
        ]:
            with self.subTest(given=given):
                self.assertEqual(fused_adam.deepspeed_arch_list(given, (9, 0)), expected)
                for entry in expected.split(";"):  # as DeepSpeed converts each entry
                    major, minor = entry.split(".")
                    int(major), int(minor.split("+")[0])

    def test_no_readable_entry_is_the_devices_architecture(self):
        for given in (None, "", "  ", "sm_90", "compute_90"):
            with self.subTest(given=given):
                self.assertEqual(fused_adam.deepspeed_arch_list(given, (9, 0)), "9.0")

    def test_the_variable_is_as_it_was_after_the_build(self):
        before = os.environ.get("TORCH_CUDA_ARCH_LIST")
        try:
            os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
            with fused_adam.arch_list("9.0"):
                self.assertEqual(os.environ["TORCH_CUDA_ARCH_LIST"], "9.0")
            self.assertEqual(os.environ["TORCH_CUDA_ARCH_LIST"], "9.0a")
            os.environ.pop("TORCH_CUDA_ARCH_LIST")
            with fused_adam.arch_list("9.0"):
                pass
            self.assertNotIn("TORCH_CUDA_ARCH_LIST", os.environ)
        finally:
            if before is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = before


class LocalBox(unittest.TestCase):
    def test_a_column_weight_is_split_by_rows_over_tp(self):
        self.assertEqual(models.local_box([8, 4], 0, 1, 2), ([4, 0], [4, 4], 0))

    def test_a_row_weight_is_split_by_columns_over_tp(self):
        self.assertEqual(models.local_box([4, 8], 1, 3, 4), ([0, 6], [4, 2], 1))

    def test_a_param_tp_replicates_is_whole(self):  # replicated, an expert's FC2 bias: split_dim null
        self.assertEqual(models.local_box([8], None, 1, 2), ([0], [8], None))

    def test_tp_1_splits_nothing(self):
        self.assertEqual(models.local_box([8, 4], 0, 0, 1), ([0, 0], [8, 4], None))

    def test_a_dim_tp_does_not_divide_names_the_dim_and_the_rule(self):
        with self.assertRaisesRegex(ValueError, "dim 0 of \\[6, 4\\], which TP splits, is not divisible by TP 4"):
            models.local_box([6, 4], 0, 0, 4)


class FakeTopology:
    """DeepSpeed's PipeModelDataParallelTopology: rank = (pipe * DP + data) * TP + model."""

    def __init__(self, pp, dp, tp):
        self.pp, self.dp, self.tp = pp, dp, tp

    def get_axis_list(self, axis, idx):
        assert axis == "data"
        return [(s * self.dp + idx) * self.tp + m for s in range(self.pp) for m in range(self.tp)]


class FakeGrid:
    def __init__(self, rank, pp, dp, tp):
        self.rank, self.topo = rank, FakeTopology(pp, dp, tp)
        self.data = rank // tp % dp
        first = rank - rank % tp
        self.slice_group = list(range(first, first + tp))
        stage = rank // (tp * dp)
        self.dp_group = [(stage * dp + d) * tp + rank % tp for d in range(dp)]
        self.pp_group = [(s * dp + self.data) * tp + rank % tp for s in range(pp)]

    def topology(self):
        return self.topo

    def get_data_parallel_rank(self):
        return self.data

    def get_global_rank(self):
        return self.rank

    def get_data_parallel_group_ranks(self):
        return self.dp_group


class PipelineGroups(unittest.TestCase):
    def test_the_model_group_is_every_stage_and_tp_rank_of_one_data_index(self):
        # world 8: PP 2, DP 2, TP 2; rank 5 is stage 1, data 0, TP rank 1
        groups = pipeline.pipeline_groups(FakeGrid(5, pp=2, dp=2, tp=2))
        self.assertEqual(groups, {"tp": [4, 5], "mp": [0, 1, 4, 5], "dp": [5, 7], "pp": [1, 5], "expert_tp": False})

    def test_without_tp_each_rank_is_its_own_tp_group(self):
        groups = pipeline.pipeline_groups(FakeGrid(3, pp=2, dp=2, tp=1))
        self.assertEqual(groups["tp"], [3])
        self.assertEqual(groups["mp"], [1, 3])


class PipelinePlan(unittest.TestCase):
    INDEX = [
        {"name": "embedding.word_embeddings.weight", "class": "vocab", "shape": [4, 2], "stage": 0,
         "last_stage_copy": True},
        {"name": "decoder.layers.0.mlp.linear_fc1.weight", "class": "column", "shape": [4, 2], "stage": 0},
        {"name": "decoder.layers.1.mlp.linear_fc1.weight", "class": "column", "shape": [4, 2], "stage": 1},
        {"name": "decoder.final_layernorm.weight", "class": "replicated", "shape": [2], "stage": 1},
    ]

    def test_each_param_is_on_its_stage_and_the_tied_embedding_on_none(self):
        stages, tied = pipeline.pipeline_plan(self.INDEX, 2)
        self.assertEqual(tied["name"], "embedding.word_embeddings.weight")
        self.assertEqual([[p["name"] for p in s] for s in stages],
                         [["decoder.layers.0.mlp.linear_fc1.weight"],
                          ["decoder.layers.1.mlp.linear_fc1.weight", "decoder.final_layernorm.weight"]])

    def test_an_untied_model_has_no_tied_layer(self):
        index = [dict(p, last_stage_copy=False) for p in self.INDEX]
        stages, tied = pipeline.pipeline_plan(index, 2)
        self.assertIsNone(tied)
        self.assertEqual(len(stages[0]), 2)

    def test_a_stage_outside_the_pipeline_is_a_model_mismatch(self):
        with self.assertRaisesRegex(LookupError, "is on stage 1 of a pipeline of 1"):
            pipeline.pipeline_plan(self.INDEX, 1)


class CheckPipelinePlan(unittest.TestCase):
    MOE = {"experts": 2, "ep": 1, "hidden": 2, "expert_tp": False}

    def stage(self, *params):  # (name, the dim TP splits it along, shape), as the gradient index says
        return [{"name": n, "split_dim": d, "shape": s} for n, d, s in params]

    def test_every_stage_is_checked_on_every_rank(self):
        stages = [self.stage(("decoder.layers.0.mlp.linear_fc1.weight", 0, [4, 2])),
                  self.stage(("decoder.layers.1.mlp.linear_fc1.weight", 0, [3, 2]))]
        pipeline.check_pipeline_plan(stages[:1], None, self.MOE, 2)
        with self.assertRaisesRegex(ValueError, "dim 0 of \\[3, 2\\], which TP splits, is not divisible by TP 2"):
            pipeline.check_pipeline_plan(stages, None, self.MOE, 2)

    def test_a_router_that_is_not_deepspeeds_gate_is_a_model_mismatch(self):
        stage = self.stage(("decoder.layers.0.mlp.router.weight", None, [2, 3]),
                           ("decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight", 0, [4, 2]))
        with self.assertRaisesRegex(LookupError, "DeepSpeed's gate is \\[2, 2\\]"):
            pipeline.check_pipeline_plan([stage], None, self.MOE, 1)

    def test_experts_are_split_over_tp_only_with_expert_tp(self):
        stage = self.stage(("decoder.layers.0.mlp.router.weight", None, [2, 2]),
                           ("decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight", 0, [3, 2]))
        pipeline.check_pipeline_plan([stage], None, self.MOE, 2)
        with self.assertRaisesRegex(ValueError, "not divisible by TP 2"):
            pipeline.check_pipeline_plan([stage], None, dict(self.MOE, expert_tp=True), 2)


class SplitExperts(unittest.TestCase):
    def test_experts_group_by_layer_and_param_and_routers_stay_dense(self):
        names = ["decoder.layers.0.mlp.router.weight",
                 "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
                 "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight",
                 "decoder.final_layernorm.weight"]
        dense, layers = models.split_experts(names)
        self.assertEqual(dense, ["decoder.layers.0.mlp.router.weight", "decoder.final_layernorm.weight"])
        self.assertEqual(layers, {"decoder.layers.0.mlp.": {"linear_fc1.weight": [0, 1]}})

    def test_experts_without_their_router_are_a_model_mismatch(self):
        with self.assertRaisesRegex(LookupError, "decoder.layers.0.mlp.experts has no decoder.layers.0.mlp.router.weight"):
            models.split_experts(["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"])


class AutoTpPlan(unittest.TestCase):
    INDEX = [{"name": n, "class": c} for n, c in [
        ("embedding.word_embeddings.weight", "vocab"),
        ("decoder.layers.0.self_attention.linear_qkv.weight", "column"),
        ("decoder.layers.0.self_attention.linear_qkv.bias", "column-bias"),
        ("decoder.layers.0.self_attention.q_layernorm.weight", "replicated"),
        ("decoder.layers.0.self_attention.linear_proj.weight", "row"),
        ("decoder.layers.0.self_attention.linear_proj.bias", "replicated"),
        ("decoder.final_layernorm.weight", "replicated"),
        ("output_layer.weight", "vocab"),
    ]]

    def test_linears_with_their_biases_q_k_norms_summed_the_rest_whole(self):
        linears, tp_summed, whole = models.autotp_plan(self.INDEX)
        qkv, proj = "decoder.layers.0.self_attention.linear_qkv", "decoder.layers.0.self_attention.linear_proj"
        self.assertEqual(linears["column"], {qkv: {"weight": f"{qkv}.weight", "bias": f"{qkv}.bias"},
                                             "output_layer": {"weight": "output_layer.weight"}})
        self.assertEqual(linears["row"], {proj: {"weight": f"{proj}.weight", "bias": f"{proj}.bias"}})
        self.assertEqual(tp_summed, ["decoder.layers.0.self_attention.q_layernorm.weight"])
        self.assertEqual(sorted(whole), ["decoder.final_layernorm.weight", "embedding.word_embeddings.weight"])

    def test_a_row_linear_with_a_split_bias_is_a_model_mismatch(self):
        index = [dict(p) for p in self.INDEX]
        index[5]["class"] = "column-bias"
        with self.assertRaisesRegex(LookupError, "linear_proj.bias is column-bias; a row-parallel linear's bias is replicated"):
            models.autotp_plan(index)


class AutoEpSlices(unittest.TestCase):
    def test_each_expert_is_the_gate_or_up_half_of_fc1_or_all_of_fc2(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy is not installed")
        prefix = "decoder.layers.0.mlp."
        shapes = {f"{prefix}experts.local_experts.{e}.{s}": shape for e in range(2)
                  for s, shape in (("linear_fc1.weight", [4, 3]), ("linear_fc2.weight", [3, 2]))}
        tensors = {n: np.arange(np.prod(s), dtype=np.float32).reshape(s) + 100 * i for i, (n, s) in enumerate(shapes.items())}
        w1 = experts.autoep_slices(tensors, shapes, prefix, "w1", [1])
        w3 = experts.autoep_slices(tensors, shapes, prefix, "w3", [1])
        w2 = experts.autoep_slices(tensors, shapes, prefix, "w2", [0, 1])
        fc1 = f"{prefix}experts.local_experts.1.linear_fc1.weight"
        self.assertEqual([s[:4] for s in w1], [(fc1, [4, 3], [0, 0], [2, 3])])
        self.assertEqual([s[:4] for s in w3], [(fc1, [4, 3], [2, 0], [2, 3])])
        np.testing.assert_array_equal(w3[0][4], tensors[fc1][2:])
        self.assertEqual([s[3] for s in w2], [[3, 2], [3, 2]])
        np.testing.assert_array_equal(w2[1][4], tensors[f"{prefix}experts.local_experts.1.linear_fc2.weight"])


class HostStagedPipelineSends(unittest.TestCase):
    def test_gpu_tensors_travel_through_host_copies_and_land_in_place(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")

        class FakeGpuTensor:
            """A tensor that says it is on a GPU: .cpu() gives the host copy gloo can send."""

            is_cuda = True

            def __init__(self, values):
                self.values = torch.tensor(values)

            def detach(self):
                return self

            def cpu(self):
                return self.values.clone()

            def copy_(self, source):
                self.values.copy_(source)

        sent, wire = [], torch.tensor([5.0, 6.0])

        class P2p:
            @staticmethod
            def send(tensor, dest_stage, async_op=False):
                sent.append((tensor.is_cuda, tensor.tolist(), dest_stage))

            @staticmethod
            def recv(tensor, src_stage, async_op=False):
                tensor.copy_(wire)

        pipeline.stage_pipeline_p2p_through_host(P2p)
        P2p.send(FakeGpuTensor([1.0, 2.0]), 1)
        self.assertEqual(sent, [(False, [1.0, 2.0], 1)])
        received = FakeGpuTensor([0.0, 0.0])
        received.values = torch.zeros(2)
        original_empty_like = torch.empty_like
        torch.empty_like = lambda t, device: torch.zeros(2)  # the fake has no storage of its own
        try:
            P2p.recv(received, 0)
        finally:
            torch.empty_like = original_empty_like
        self.assertEqual(received.values.tolist(), [5.0, 6.0])


class PipelinePlants(unittest.TestCase):
    def test_tied_copies_are_left_unmarked(self):
        class Param:
            ds_pipe_replicated = True

        class Module:
            def parameters(self):
                return [self.p]

        module = Module()
        module.p = Param()

        class Pipeline:
            tied_modules = {"word_embeddings": module}

        def index_tied_modules(self):
            return {"word_embeddings": {"ranks": [0, 1]}}

        planted = plants._tied_copies_counted(index_tied_modules)
        self.assertEqual(planted(Pipeline()), {"word_embeddings": {"ranks": [0, 1]}})
        self.assertFalse(module.p.ds_pipe_replicated)

    def test_the_model_group_becomes_the_stage_tp_group(self):
        class Grid:
            slice_proc_group = "the stage's TP group"
            ds_model_proc_group = "every stage"

        planted = plants._stage_model_group(lambda self: self.ds_model_proc_group)
        self.assertEqual(planted(Grid()), "the stage's TP group")


class Chained(unittest.TestCase):
    def test_a_sum_over_dp_then_tp_reaches_the_product_group(self):
        dp_of = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
        self.assertEqual(td.chained(dp_of, [0, 1]), [0, 1, 2, 3])

    def test_the_first_reduction_is_each_member_of_the_second_groups(self):
        # rank 0 sums over [0, 1] after each of them summed over its own first group
        first = {0: [0], 1: [1, 2]}
        self.assertEqual(td.chained(first, [0, 1]), [0, 1, 2])


class Stats(unittest.TestCase):
    def test_statistics_are_exact_for_a_few_values(self):
        try:
            import numpy  # noqa: F401
        except ImportError:
            self.skipTest("numpy is not installed")
        self.assertEqual(td._stats([3.0, 0.0, -4.0]), {"sum_squares": 25.0, "abs_max": 4.0, "zeros": 1})


class Queue(unittest.TestCase):
    def test_the_next_command_is_the_case_once_its_file_is_there(self):
        with tempfile.TemporaryDirectory() as q:
            write_atomically("{}", os.path.join(q, "case-1.json"))
            self.assertEqual(queue.next_command(q, 1, 0), ("case", 1))

    def test_stop_wins_over_a_waiting_case(self):
        with tempfile.TemporaryDirectory() as q:
            write_atomically("{}", os.path.join(q, "case-1.json"))
            write_atomically("", os.path.join(q, "stop"))
            self.assertEqual(queue.next_command(q, 1, 0), ("stop",))

    def test_the_gradients_are_read_by_name_and_shape(self):
        with tempfile.TemporaryDirectory() as q:
            import struct

            with open(os.path.join(q, "case-1.gradients.f32"), "wb") as f:
                f.write(struct.pack("<6f", 1, 2, 3, 4, 5, 6))
            write_atomically(json.dumps({
                "case_digest": "00112233aabbccdd",
                "elements": 6, "params": [{"name": "a", "shape": [2, 2], "offset": 0},
                                          {"name": "b", "shape": [2], "offset": 4}]}), os.path.join(q, "case-1.gradients.json"))
            self.assertEqual(queue.Request(q, 1, {}).case_digest, "00112233aabbccdd")
            try:
                tensors = queue.Request(q, 1, {}).gradients()
            except ImportError:
                self.skipTest("numpy is not installed")
            self.assertEqual(tensors["a"].tolist(), [[1, 2], [3, 4]])
            self.assertEqual(tensors["b"].tolist(), [5, 6])


class EachRanksShareComesFromTally(unittest.TestCase):
    """The worker gives DeepSpeed's reduction its rank's share of every gradient, as tally dealt them
    for each size of DeepSpeed's reduction groups (case-<K>.shares-<N>.f32, run/contributions.h)."""

    def write_request(self, q, sizes):
        import struct

        index = {"case_digest": "00112233aabbccdd", "elements": 3,
                 "shares": {"divisor": 2, "group_sizes": sizes, "given_whole": {str(n): 0 for n in sizes}},
                 "params": [{"name": "a", "shape": [2], "offset": 0}, {"name": "b", "shape": [1], "offset": 2}]}
        write_atomically(json.dumps(index), os.path.join(q, "case-1.gradients.json"))
        for n in sizes:  # rank i's shares at [3i, 3i + 3)
            with open(os.path.join(q, f"case-1.shares-{n}.f32"), "wb") as f:
                f.write(struct.pack(f"<{3 * n}f", *[10 * r + e for r in range(n) for e in range(3)]))

    def test_each_ranks_shares_are_read_by_name_and_shape(self):
        with tempfile.TemporaryDirectory() as q:
            self.write_request(q, [2])
            try:
                shares = queue.Request(q, 1, {}).shares(2)
            except ImportError:
                self.skipTest("numpy is not installed")
            self.assertEqual(shares["a"].tolist(), [[0, 1], [10, 11]])
            self.assertEqual(shares["b"].tolist(), [[2], [12]])

    def test_a_group_size_tally_sent_no_shares_for_is_named_with_those_it_sent(self):
        with tempfile.TemporaryDirectory() as q:
            self.write_request(q, [2])
            try:
                import numpy  # noqa: F401
            except ImportError:
                self.skipTest("numpy is not installed")
            with self.assertRaisesRegex(FileNotFoundError, r"case-1\.shares-4\.f32: tally sent no shares for a group of 4 "
                                                           r"with case 1 \(it sent \[2\]\)"):
                queue.Request(q, 1, {}).shares(4)


class TheEngineConfigurationComesFromTally(unittest.TestCase):
    """The worker builds DeepSpeed with the configuration tally sends (case-<K>.engine.json, written
    by run/deepspeed/engine.cpp, the same function `tally show` prints): it has none of its own."""

    def test_the_worker_reads_the_configuration_tally_sent(self):
        with tempfile.TemporaryDirectory() as q:
            config = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}, "bf16": {"enabled": True}}
            with open(os.path.join(q, "case-4.engine.json"), "w") as f:
                json.dump(config, f)
            self.assertEqual(queue.Request(q, 4, {}).engine_config(), config)

    def test_a_case_without_its_configuration_is_refused_naming_the_file(self):
        with tempfile.TemporaryDirectory() as q:
            with self.assertRaisesRegex(FileNotFoundError, r"case-2\.engine\.json: tally sent no engine configuration"):
                queue.Request(q, 2, {}).engine_config()

    def test_show_prints_the_configuration_with_every_key(self):
        import subprocess

        tally = os.environ.get("TALLY")
        if not tally:
            self.skipTest("TALLY (the tally binary) is not set: ctest sets it")
        seeds = os.path.join(os.path.dirname(__file__), "..", "..", "..", "seeds", "real")
        shown = json.loads(subprocess.run([tally, "show", os.path.join(seeds, "deepspeed-0.19.8-zero3-autoep-bf16.pass.json"),
                                           "--json"], check=True, capture_output=True, text=True).stdout)
        printed = shown["deepspeed_config"]
        # ZeRO 3 partitions every param only with a persistence threshold of 0, as the worker ran it.
        self.assertEqual(printed["zero_optimization"], {"stage": 3, "stage3_param_persistence_threshold": 0})
        self.assertTrue(printed["zero_allow_untested_optimizer"])
        self.assertEqual(printed["expert_parallel"]["autoep_size"], 2)


class SplitByMask(unittest.TestCase):
    def test_a_param_outside_every_mask_is_one_kept_piece(self):
        self.assertEqual(td.split_by_mask(4, 8, []), [(4, 8, True)])
        self.assertEqual(td.split_by_mask(4, 8, [(0, 4), (8, 9)]), [(4, 8, True)])

    def test_a_masked_range_spanning_several_params_drops_each_whole(self):
        masked = [(2, 10)]
        self.assertEqual(td.split_by_mask(2, 5, masked), [(2, 5, False)])
        self.assertEqual(td.split_by_mask(5, 10, masked), [(5, 10, False)])

    def test_a_mask_covering_part_of_a_param_cuts_it(self):
        self.assertEqual(td.split_by_mask(0, 10, [(3, 6)]),
                         [(0, 3, True), (3, 6, False), (6, 10, True)])
        self.assertEqual(td.split_by_mask(4, 8, [(0, 5), (7, 12)]),
                         [(4, 5, False), (5, 7, True), (7, 8, False)])


class Plants(unittest.TestCase):
    def test_every_catalog_fault_is_planted_or_has_a_reason_by_name(self):
        fault_catalog.assert_plants_answer_the_catalog(self, plants.PLANTS, plants.NOT_PLANTED)


if __name__ == "__main__":
    unittest.main()
