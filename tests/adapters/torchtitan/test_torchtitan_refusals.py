"""torchtitan's own checks that run/torchtitan/rules.cpp mirrors: for each refusal that cites a line of
torchtitan 0.3.0 or torch 2.15, the smallest call that reaches that line, asserted to raise (or to
place the experts) as the refusal says. A refusal that loses its framework check fails here.

The calls that need a process group run once, on four ranks of this CPU over gloo (one spawn: most
of the time is each rank importing torch), and each test reads its check's outcome on every rank.
Runs in the venv ci/torchtitan-venv makes (ci/real-torchtitan); skipped without torchtitan
(ci/python-test)."""

import os
import sys
import tempfile
import types
from types import SimpleNamespace

import pytest

# A submodule: under ci/python-test's rootdir the folder tests/adapters/torchtitan itself imports as a
# namespace package named torchtitan where the real one is not installed.
pytest.importorskip("torchtitan.distributed")

WORLD = 4


# --- on each rank ------------------------------------------------------------------------------


def _outcome(call):
    """What `call()` did, as one comparable line: "ok: <its value>" or "<exception type>: <message>"."""
    try:
        return f"ok: {call()}"
    except Exception as error:  # the outcome is what the tests assert on
        return f"{type(error).__name__}: {error}"


def _dims(**degrees):
    import torchtitan.distributed.parallel_dims as parallel_dims

    values = {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "pp": 1, "ep": 1, "spmd_backend": "full_dtensor"}
    values.update(degrees)
    dims = parallel_dims.ParallelDims(world_size=WORLD, **values)
    dims.build_mesh()
    return dims


def _groups(dims, axes):
    """The ranks of this rank's group along each of `axes`."""
    return {axis: dims.get_mesh(axis).mesh.flatten().tolist() for axis in axes}


def _experts_model(rows):
    """The smallest decoder apply_fsdp_to_decoder shards: one MoE layer holding one routed expert
    whose weight has `rows` rows (plain tensors: TP 1, no EP)."""
    import torch
    import torch.nn as nn

    model = nn.Module()
    model.enable_weight_tying = False
    model.tok_embeddings = model.norm = model.lm_head = None
    block = nn.Module()
    block.moe_enabled = True
    block.moe = nn.Module()
    block.moe.routed_experts = nn.Module()
    inner = nn.Module()
    inner.num_experts = 1
    inner.w1 = nn.Parameter(torch.zeros(1, rows, 4))
    block.moe.routed_experts.inner_experts = inner
    model.layers = nn.ModuleDict({"0": block})
    return model


def _fsdp_shards_experts(rows, dp_mesh):
    import torch
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    model = _experts_model(rows)
    apply_fsdp_to_decoder(model, dp_mesh, torch.float32, torch.float32, False)
    return type(model.layers["0"].moe.routed_experts.inner_experts.w1.placements[0]).__name__


def _torch_clip_over_two_meshes(dims, clip):
    """`clip` over a dense param on torchtitan's dense storage mesh and an expert on its sparse one."""
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor
    from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh, resolve_sparse_fsdp_mesh

    params = []
    for mesh in (resolve_fsdp_mesh(dims)[0], resolve_sparse_fsdp_mesh(dims)[0]):
        p = torch.nn.Parameter(distribute_tensor(torch.ones(WORLD, 2), mesh, [Shard(0)] * mesh.ndim))
        p.grad = p.detach().clone()
        params.append(p)
    return float(clip(params))


def _count_exchange(ep_mesh, num_experts):
    """torchtitan's standard EP dispatch exchanging per-expert token counts over `ep_mesh`."""
    import torch
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    dispatcher = AllToAllTokenDispatcher(AllToAllTokenDispatcher.Config(num_experts=num_experts, top_k=1))
    dispatcher.wire_meshes(ep_mesh=ep_mesh)
    return dispatcher._token_count_exchange(torch.zeros(num_experts, dtype=torch.int64), None, ep_mesh.size())


def _rank_checks(rank):
    """Every check that needs the world, on this rank: name -> outcome."""
    import torch
    import torch.distributed.fsdp  # noqa: F401  (registers the "fake" backend torchtitan gives axes of size 1)
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.distributed import utils as dist_utils

    parallel_dims.device_type = "cpu"  # torchtitan takes it to be "cuda" otherwise (as the worker sets it)
    out = {}
    full = _dims(dp_shard=2, tp=2)
    out["order full_dtensor"] = _outcome(lambda: _groups(full, ["dp_shard", "tp"]))
    partial = _dims(dp_shard=2, tp=2, spmd_backend="partial_dtensor")
    out["order partial_dtensor"] = _outcome(lambda: _groups(partial, ["fsdp", "tp"]))
    fsdp = partial.get_mesh("fsdp")
    out["experts 3 rows over 2 fsdp ranks"] = _outcome(lambda: _fsdp_shards_experts(3, fsdp))
    out["experts 4 rows over 2 fsdp ranks"] = _outcome(lambda: _fsdp_shards_experts(4, fsdp))
    out["ep 3 of dp_shard 4"] = _outcome(lambda: _dims(dp_shard=4, ep=3))
    ep = _dims(dp_shard=4, ep=2)
    out["3 experts over ep 2"] = _outcome(lambda: _count_exchange(ep.get_mesh("ep"), 3))
    out["torch clip over two meshes"] = _outcome(
        lambda: _torch_clip_over_two_meshes(ep, lambda ps: torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=True)))
    out["torchtitan clip over two meshes"] = _outcome(lambda: _torch_clip_over_two_meshes(
        ep, lambda ps: dist_utils.clip_grad_norm_(ps, 1.0, foreach=True, ep_enabled=True)))
    return out


def _rank_main(rank, path, reports):
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
        try:
            reports.put((rank, _rank_checks(rank)))
        finally:
            dist.barrier()
            dist.destroy_process_group()
    except BaseException as error:  # reported by the parent, with the rank
        reports.put((rank, f"{type(error).__name__}: {error}"))


@pytest.fixture(scope="module")
def on_ranks():
    """Each rank's outcomes (rank -> name -> outcome), from one spawn of WORLD ranks."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    reports = context.SimpleQueue()
    with tempfile.TemporaryDirectory() as folder:
        processes = [context.Process(target=_rank_main, args=(rank, os.path.join(folder, "store"), reports))
                     for rank in range(WORLD)]
        for p in processes:
            p.start()
        reported = dict(reports.get() for _ in processes)
        for p in processes:
            p.join(120)
    for rank, outcomes in reported.items():
        assert isinstance(outcomes, dict), f"rank {rank}: {outcomes}"
    return reported


def outcomes_of(on_ranks, name):
    return [on_ranks[rank][name] for rank in range(WORLD)]


# --- topology.order: torchtitan/distributed/parallel_dims.py:297 (:330 under partial_dtensor) ---


def test_meshes_unflatten_the_world_tp_fastest(on_ranks):
    for rank in range(WORLD):
        tp = [rank // 2 * 2, rank // 2 * 2 + 1]
        dp = [rank % 2, rank % 2 + 2]
        assert on_ranks[rank]["order full_dtensor"] == f"ok: {{'dp_shard': {dp}, 'tp': {tp}}}"
        assert on_ranks[rank]["order partial_dtensor"] == f"ok: {{'fsdp': {dp}, 'tp': {tp}}}"


# --- torchtitan.dp_replicate: torchtitan/distributed/parallel_dims.py:186 (:181) ---------------


def test_parallel_dims_asserts_dp_replicate_divides_dp():
    from torchtitan.distributed.parallel_dims import ParallelDims

    def dims(dp_replicate, dp_shard, world):  # as tally's job config writes them: dp_shard = DP / dp_replicate
        return ParallelDims(dp_replicate=dp_replicate, dp_shard=dp_shard, cp=1, tp=1, pp=1, ep=1, world_size=world)

    with pytest.raises(AssertionError, match=r"Invalid parallel dims: dp_replicate\(3\)"):
        dims(3, 4 // 3, 4)
    with pytest.raises(AssertionError, match="dp_shard must -1 or >=1"):
        dims(3, 2 // 3, 2)
    assert dims(2, 2, 4).dp_shard == 2


# --- topology.etp: torchtitan/models/common/moe_sharding.py:208 (EP) and :215 (no EP) ----------


def test_experts_are_whole_on_their_ep_rank_with_ep_and_split_as_tp_without_it():
    import spmd_types as spmd
    from torchtitan.models.common import moe_sharding

    def expert_weight(enable_ep):  # the routed experts' weight as the MoE sharding declares it
        _, inner = moe_sharding._routed_experts_sharding_configs(enable_ep=enable_ep, enable_sp=True,
                                                                 expert_param_layout={"w1": spmd.S(1)})
        return inner.state_shardings["w1"].axis_types

    assert expert_weight(True) == {"dp_replicate": spmd.R, "efsdp": spmd.R, "ep": spmd.S(0)}, "no TP axis with EP"
    assert expert_weight(False)["tp"] == spmd.S(1), "split over TP as the dense MLP"


# --- topology.ep: torchtitan/distributed/parallel_dims.py:336, torch/distributed/device_mesh.py:1463


def test_ep_not_dividing_dp_shard_cp_tp_fails_the_sparse_mesh(on_ranks):
    for outcome in outcomes_of(on_ranks, "ep 3 of dp_shard 4"):
        assert outcome.startswith("ValueError: The product of mesh_sizes=(1, 1, 1, 3) is 3"), outcome


# --- topology.ep: torchtitan/models/common/token_dispatcher.py:262 ------------------------------


def test_ep_not_dividing_the_experts_fails_the_token_count_exchange(on_ranks):
    for outcome in outcomes_of(on_ranks, "3 experts over ep 2"):
        assert outcome.startswith("RuntimeError: shape '[2, -1]' is invalid for input of size 3"), outcome


# --- model.untie_embeddings_and_output_weights with PP: torchtitan/models/common/decoder.py:140 -


def test_weight_tying_with_pipeline_raises(monkeypatch):
    try:
        import torchtitan.trainer  # noqa: F401  (update_from_config imports it before its check)
    except ImportError:  # it needs torchdata, which the venv lacks; the check comes first
        stub = types.ModuleType("torchtitan.trainer")
        stub.Trainer = type("Trainer", (), {"Config": type("Config", (), {})})
        monkeypatch.setitem(sys.modules, "torchtitan.trainer", stub)
    from torchtitan.config import ParallelismConfig
    from torchtitan.models.common.decoder import Decoder
    from torchtitan.models.qwen3 import qwen3_configs

    config = qwen3_configs["debugmodel"](attn_backend="flex")
    assert config.enable_weight_tying
    job = SimpleNamespace(parallelism=ParallelismConfig(pipeline_parallel_degree=2))
    with pytest.raises(NotImplementedError, match="Weight tying is not supported with Pipeline Parallel"):
        Decoder.Config.update_from_config(config, config=job)
    config.enable_weight_tying = False
    Decoder.Config.update_from_config(config, config=job)


# --- experts FSDP2 shards on dim 1: torchtitan/distributed/fsdp.py:230,
#     torch/distributed/fsdp/_fully_shard/_fsdp_param.py:344 -----------------------------------


def test_fsdp_refuses_experts_it_would_split_unevenly_on_dim_1(on_ranks):
    for outcome in outcomes_of(on_ranks, "experts 3 rows over 2 fsdp ranks"):
        assert outcome.startswith("NotImplementedError: FSDP does not support uneven sharding on dim 1"), outcome
    assert outcomes_of(on_ranks, "experts 4 rows over 2 fsdp ranks") == ["ok: Shard"] * WORLD


# --- torchtitan.clip torch with EP: torch/nn/utils/clip_grad.py:106,
#     torch/distributed/tensor/_ops/_tensor_ops.py:721 ------------------------------------------


def test_torch_clip_cannot_stack_the_norms_of_two_meshes(on_ranks):
    for outcome in outcomes_of(on_ranks, "torch clip over two meshes"):
        assert outcome.startswith("RuntimeError: All operands in aten.stack.default must have the same mesh"), outcome
    for outcome in outcomes_of(on_ranks, "torchtitan clip over two meshes"):
        assert outcome.startswith("ok: "), outcome
