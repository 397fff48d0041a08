"""Where each rank's share of a gradient comes from when a case's gradients enter before
megatron-core's reduction (adapters/tally_adapters/megatron/reduction.py): every rank of a group
takes a distinct place, so the group's shares are each given once. A stand-in for
megatron.core.parallel_state; no torch, no Megatron, no GPU."""

import sys
import types
import unittest
from unittest import mock

from tally_adapters.megatron import reduction


def parallel_state(world, tp, pp, ep, rank_order):
    """megatron.core.parallel_state for `rank` of a world laid out tp innermost, then dp, then pp
    (CP 1, ETP 1): the sizes and ranks reduction.placement asks for."""

    def of(rank):
        ps = types.ModuleType("megatron.core.parallel_state")
        stage_ranks = world // pp
        dp = stage_ranks // tp
        edp = stage_ranks // ep
        local = rank % stage_ranks
        ps.get_data_parallel_world_size = lambda with_context_parallel=False: dp
        ps.get_data_parallel_rank = lambda with_context_parallel=False: local // tp
        ps.get_tensor_model_parallel_rank = lambda: local % tp
        ps.get_expert_data_parallel_world_size = lambda: edp
        ps.get_expert_data_parallel_rank = lambda: local // ep
        ps.is_pipeline_first_stage = lambda ignore_virtual=False: rank // stage_ranks == 0
        return ps

    return [of(rank) for rank in rank_order]


def case(world, tp=1, pp=1, ep=1, tied=True, qk_layernorm=False):
    return {"topology": {"world": world, "tp": tp, "pp": pp, "ep": ep},
            "model": {"untie_embeddings_and_output_weights": not tied, "qk_layernorm": qk_layernorm},
            "gradients": {"mode": "normal", "dtype": "fp32", "seed": 1, "enter": "before_reduction"}}


def placements(c, name, param_class, ranks):
    """(group size, place) of each of `ranks` (a stage's, or every rank holding the param)."""
    t = c["topology"]
    out = []
    for ps in parallel_state(t["world"], t["tp"], t["pp"], t["ep"], ranks):
        megatron = types.ModuleType("megatron")
        core = types.ModuleType("megatron.core")
        megatron.core, core.parallel_state = core, ps
        with mock.patch.dict(sys.modules, {"megatron": megatron, "megatron.core": core,
                                           "megatron.core.parallel_state": ps}):
            out.append(reduction.placement(c, name, param_class))
    return out


class PlacementTest(unittest.TestCase):
    def assert_each_place_once(self, got, size):
        self.assertEqual({s for s, _ in got}, {size})
        self.assertEqual(sorted(p for _, p in got), list(range(size)))

    def test_a_dense_param_is_dealt_over_dp(self):
        c = case(8, tp=2)
        # TP rank 0's DP group: ranks 0, 2, 4, 6
        self.assert_each_place_once(placements(c, "decoder.layers.0.mlp.linear_fc1.weight", "column", [0, 2, 4, 6]), 4)

    def test_a_routed_expert_over_its_expert_dp_group(self):
        c = case(8, ep=2)
        self.assert_each_place_once(
            placements(c, "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight", "expert-column",
                       [0, 2, 4, 6]), 4)

    def test_the_tied_embedding_over_dp_of_both_stages(self):
        c = case(8, tp=2, pp=2)
        # TP rank 0 of the first stage (0, 2) and of the last (4, 6)
        self.assert_each_place_once(placements(c, "embedding.word_embeddings.weight", "vocab", [0, 2, 4, 6]), 4)

    def test_an_untied_embedding_over_its_stage_dp_alone(self):
        c = case(8, tp=2, pp=2, tied=False)
        self.assert_each_place_once(placements(c, "embedding.word_embeddings.weight", "vocab", [0, 2]), 2)

    def test_a_qk_layernorm_over_dp_of_every_tp_rank(self):
        c = case(8, tp=2, qk_layernorm=True)
        name = "decoder.layers.0.self_attention.q_layernorm.weight"
        self.assert_each_place_once(placements(c, name, "replicated", list(range(8))), 8)
        # any other TP-replicated param stays over DP
        self.assert_each_place_once(
            placements(c, "decoder.layers.0.input_layernorm.weight", "replicated", [1, 3, 5, 7]), 4)

    def test_qk_layernorm_names(self):
        self.assertTrue(reduction.is_qk_layernorm("decoder.layers.1.self_attention.k_layernorm.bias"))
        self.assertFalse(reduction.is_qk_layernorm("decoder.layers.1.input_layernorm.weight"))
        self.assertFalse(reduction.is_qk_layernorm("decoder.layers.1.self_attention.kv_layernorm.weight"))

    def test_before_reduction_reads_the_field_tally_writes_only_when_set(self):
        self.assertTrue(reduction.before_reduction(case(2)))
        after = case(2)
        del after["gradients"]["enter"]
        self.assertFalse(reduction.before_reduction(after))


if __name__ == "__main__":
    unittest.main()
