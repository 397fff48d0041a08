"""megatron-core 0.19.2's own checks that tally's refusals cite (run/megatron_core/rules.cpp): each
test makes the smallest call into megatron.core (or Megatron-LM's arguments, which the wheel ships)
that reaches the check, on the case the rule refuses, and asserts that it raises as the refusal
says, in the file it cites. Needs megatron-core 0.19.2 (Python 3.12) and a GPU where the check is
past a CUDA allocation; skipped where megatron.core is not installed (ci/python-test).
.devbin/megatron_refusals.sh runs it on the GPU machine."""

import json
import os
import socket
import sys
import traceback
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[3]
FOUNDING = REPO / "seeds" / "founding-6099-world2.pass.json"


def megatron_frames(error):
    return [
        f for f in traceback.extract_tb(error.__traceback__)
        if "/megatron/core/" in f.filename or "/megatron/training/" in f.filename
    ]


def raised_in(error):
    """(file inside the package, line, function) of the innermost megatron frame that raised."""
    frame = megatron_frames(error)[-1]
    return frame.filename[frame.filename.rindex("/megatron/") + 1 :], frame.lineno, frame.name


def expect_raised_in(error, path, function):
    where = raised_in(error)
    print(f"{type(error).__name__} at {where[0]}:{where[1]} in {where[2]}: {error}")
    assert (where[0], where[2]) == (path, function), where


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank():
    """torch.distributed over gloo with this process as its one rank, and Megatron's parallel
    state of one rank; both torn down after the test."""
    from megatron.core import parallel_state as ps

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
    ps.initialize_model_parallel()
    yield
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _rank_main(rank, world, port, check, argument, reports):
    """One rank of run_on_ranks: its gloo process group, its GPU (all ranks share GPU 0, as the
    worker's do on gloo), then `check(argument)`; reports what it raised, with where."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    sys.path.insert(0, str(REPO / "adapters"))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
        check(argument)
        reports.put((rank, None))
    except BaseException as error:  # the parent asserts on it
        where = raised_in(error) if megatron_frames(error) else None
        reports.put((rank, (type(error).__name__, str(error), where)))


def run_on_ranks(world, check, argument, timeout=120):
    """`check(argument)` on `world` gloo ranks, one process each; each rank's (exception name,
    message, where) or None. A rank that waits at a collective for a rank that raised is stopped
    after `timeout` seconds and reports nothing."""
    import queue

    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    reports = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_rank_main, args=(rank, world, port, check, argument, reports)) for rank in range(world)
    ]
    for p in processes:
        p.start()
    got = {}
    try:
        while len(got) < world:
            rank, report = reports.get(timeout=timeout)
            got[rank] = report
    except queue.Empty:
        pass
    for p in processes:
        p.join(5)
        if p.is_alive():
            p.kill()
    print(got)
    return got


def case_of(edit):
    """The founding case (seeds/founding-6099-world2.pass.json) as the worker reads it, changed by
    `edit` (a dict of section -> fields)."""
    case = json.loads(FOUNDING.read_text())
    for section, fields in edit.items():
        case.setdefault(section, {}).update(fields)
    return case


def build_case(case):
    """The worker's build of the case (tally_adapters.megatron.build, as worker.py's build runs it):
    the parallel state of its topology, its model, then its optimizer."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from tally_adapters.megatron import build

    ps.initialize_model_parallel(**build.parallel_state_arguments(case["topology"]))
    model_parallel_cuda_manual_seed(1234)
    chunks = build.build_model(case, build.transformer_config(case))
    build.build_optimizer(case, chunks)


DENSE = {"num_layers": 2, "num_experts": 0, "moe_ffn_hidden_size": None, "add_bias_linear": False}


def expect_every_raiser(reports, name, path, function, message):
    raised = [r for r in reports.values() if r is not None]
    assert raised, reports
    for error, text, where in raised:
        assert error == name, (error, text)
        assert message in text, text
        assert where is not None and (where[0], where[2]) == (path, function), where


# topology.dist_opt_instances > 1 with optimizer.model plain/muon/layerwise (no layout):
# megatron/core/distributed/distributed_data_parallel.py:293.
def test_several_instances_need_the_distributed_optimizer(one_rank):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.transformer_config import TransformerConfig

    world = dist.group.WORLD
    groups = ProcessGroupCollection(
        dp=world, dp_cp=world, expt_dp=world, intra_dp_cp=world, intra_expt_dp=world, inter_dist_opt=world,
        tp=world, pp=world, ep=world,
    )
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=False, num_distributed_optimizer_instances=2)
    module = torch.nn.Linear(8, 8, bias=False).cuda()
    with pytest.raises(AssertionError, match="Partial DistOpt cannot be used without DistOpt") as raised:
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=module, pg_collection=groups)
    expect_raised_in(raised.value, "megatron/core/distributed/distributed_data_parallel.py", "__init__")


class _Chunk(torch.nn.Module):
    """A model chunk as _get_megatron_emerging_optimizer reads one: its params, its config and
    the ddp_config of the DDP that wraps it."""

    def __init__(self, ddp_config, expert_bias=False):
        from megatron.core.transformer.transformer_config import TransformerConfig

        super().__init__()
        self.config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
        self.ddp_config = ddp_config
        self.buffers = []  # DDP's buffers, none here (nn.Module's method of that name is shadowed)
        if expert_bias:
            self.experts_bias = torch.nn.Parameter(torch.zeros(8))
            self.experts_bias.allreduce = False  # expert-parallel, as Megatron tags an expert's params
        else:
            self.linear_fc1 = torch.nn.Linear(8, 8, bias=False)


def layer_wise_config():
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig(optimizer="muon", use_layer_wise_distributed_optimizer=True, lr=0.0, bf16=False)


# optimizer.layer_wise_param_layout with topology.dist_opt_instances > 1:
# megatron/core/optimizer/__init__.py:835.
def test_the_layer_wise_layout_takes_one_instance(one_rank):
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, num_distributed_optimizer_instances=2)
    with pytest.raises(AssertionError, match="does not yet support num_distributed_optimizer_instances > 1") as raised:
        get_megatron_optimizer(layer_wise_config(), [_Chunk(ddp_config)])
    expect_raised_in(raised.value, "megatron/core/optimizer/__init__.py", "_get_megatron_emerging_optimizer")


# optimizer.layer_wise_param_layout with expert biases: megatron/core/optimizer/__init__.py:914.
def test_the_layer_wise_layout_refuses_expert_biases(one_rank):
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
    with pytest.raises(AssertionError, match="Non-emerging expert-parallel param groups are not yet") as raised:
        get_megatron_optimizer(layer_wise_config(), [_Chunk(ddp_config, expert_bias=True)])
    expect_raised_in(raised.value, "megatron/core/optimizer/__init__.py", "_get_megatron_emerging_optimizer")


# Uneven first and last stages with PP 2 and VPP > 1: megatron/core/transformer/transformer_layer.py:158.
def test_uneven_stages_without_a_middle_one_divide_by_zero():
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    config = TransformerConfig(
        num_layers=4, hidden_size=8, num_attention_heads=1, pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2, num_layers_in_first_pipeline_stage=2,
        num_layers_in_last_pipeline_stage=2, pipeline_dtype=torch.float32,
    )
    assert get_transformer_layer_offset(config, vp_stage=0, pp_rank=0) == 0
    with pytest.raises(ZeroDivisionError) as raised:
        get_transformer_layer_offset(config, vp_stage=0, pp_rank=1)
    expect_raised_in(raised.value, "megatron/core/transformer/transformer_layer.py", "get_transformer_layer_offset")


FSDP = {"megatron_fsdp": {"data_parallel_sharding_strategy": "optim_grads_params", "outer_dp_sharding_strategy": "no_shard"}}


# topology.pp > 1 with megatron_fsdp: megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:561.
def test_megatron_fsdp_has_no_pipeline_axis():
    case = case_of({"topology": {"tp": 1, "ep": 1, "pp": 2}, "model": DENSE, "optimizer": {"model": "distributed"}, **FSDP})
    reports = run_on_ranks(2, build_case, case)
    expect_every_raiser(reports, "EinopsError", "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py",
                        "_get_dp_tp_mesh", "")


# topology.order with other groups than the default's, with megatron_fsdp:
# megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:604.
def test_megatron_fsdp_meshes_take_the_default_order():
    topology = {"world": 4, "tp": 2, "ep": 1, "order": "dp-tp-cp-ep-pp"}
    case = case_of({"topology": topology, "model": DENSE, "optimizer": {"model": "distributed"}, **FSDP})
    reports = run_on_ranks(4, build_case, case)
    expect_every_raiser(reports, "AssertionError", "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py",
                        "_check_mesh_ranks_and_group_ranks_are_consistent", "does not match the group ranks")


# optimizer.model outer optim with another strategy than optim_grads_params, several instances:
# megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:2501.
def test_hybrid_fsdp_shards_the_optimizer_across_instances_only_with_full_sharding():
    fsdp = {"megatron_fsdp": {"data_parallel_sharding_strategy": "optim", "outer_dp_sharding_strategy": "optim"}}
    topology = {"world": 2, "tp": 1, "ep": 1, "dist_opt_instances": 2}
    case = case_of({"topology": topology, "model": DENSE, "optimizer": {"model": "distributed"}, **fsdp})
    reports = run_on_ranks(2, build_case, case)
    expect_every_raiser(reports, "NotImplementedError",
                        "megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py",
                        "_init_each_parameter_group_buffers", "only supported with full-sharding on DP-Shard")


# optimizer.model muon or layerwise with megatron_fsdp: megatron/training/arguments.py:1127.
def test_megatron_lm_gives_megatron_fsdp_adam_or_sgd_only(monkeypatch):
    pytest.importorskip("megatron.training")
    from megatron.training.arguments import parse_args, validate_args

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(sys, "argv", [
        "pretrain_gpt.py", "--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2",
        "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size", "1", "--lr", "0",
        "--train-iters", "1", "--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor", "--optimizer", "muon",
    ])
    args = parse_args()
    with pytest.raises(AssertionError, match="Megatron-FSDP does not support the muon optimizer yet") as raised:
        validate_args(args, {})
    expect_raised_in(raised.value, "megatron/training/arguments.py", "validate_args")
