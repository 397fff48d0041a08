"""DeepSpeed's own checks that run/deepspeed/rules.cpp mirrors (issue 50): each test makes the
smallest call into the installed DeepSpeed that reaches one, on this CPU (DeepSpeed's CPU
accelerator, one gloo rank), and asserts it raises what the refusal cites. Skipped where DeepSpeed
is not installed (ci/python-test); ci/real-deepspeed runs it in DeepSpeed 0.19.8's environment."""

import os
import tempfile
import types

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
torch = pytest.importorskip("torch")
# A submodule: tests/adapters/deepspeed itself imports as a namespace package named deepspeed where
# the real one is not installed.
pytest.importorskip("deepspeed.runtime")
import deepspeed  # noqa: E402
from deepspeed.module_inject.auto_ep_config import parse_autoep_config, validate_autoep_post_detection  # noqa: E402
from deepspeed.module_inject.auto_ep_folding import build_folding_spec, validate_folding_global  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.pipe import PipelineModule  # noqa: E402
from tally_adapters.deepspeed.groups import Mpu, forget_deepspeed_groups  # noqa: E402

# The expert_parallel section the worker gives DeepSpeed (run/deepspeed/engine.cpp).
AUTOEP = {"enabled": True, "autoep_size": 1, "moe_layer_pattern": "moe\\.\\w+", "router_pattern": "gate",
          "expert_pattern": "experts", "expert_w1": "gate_proj", "expert_w2": "down_proj", "expert_w3": "up_proj",
          "top_k": 1, "score_func": "softmax", "score_apply": "post", "route_norm": False, "use_grouped_mm": False}


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    """torch.distributed on one gloo rank, which deepspeed.init_distributed adopts."""
    import torch.distributed as dist

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        deepspeed.init_distributed(dist_backend="gloo")
        try:
            yield
        finally:
            forget_deepspeed_groups()
            dist.destroy_process_group()


@pytest.fixture(autouse=True)
def fresh_groups():
    yield
    forget_deepspeed_groups()


def config(**more):
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "zero_allow_untested_optimizer": True, **more}


def initialize(model, cfg, **kwargs):
    if "optimizer" not in kwargs:
        kwargs["optimizer"] = torch.optim.AdamW(model.parameters(), lr=0.0)
    return deepspeed.initialize(model=model, config=cfg, **kwargs)


class Moe(torch.nn.Module):
    """One of DeepSpeed's own MoE layers, as the worker's models hold them."""

    def __init__(self, num_experts, ep_size, expert_tp=False):
        super().__init__()
        self.moe = MoE(hidden_size=4, expert=torch.nn.Linear(4, 4), num_experts=num_experts, ep_size=ep_size,
                       enable_expert_tensor_parallelism=expert_tp)


# gradients.dtype: engine.py:2004 and :2007, with the accelerator's answer the worker's hello reports.
@pytest.mark.parametrize("dtype, question", [("fp16", "is_fp16_supported"), ("bf16", "is_bf16_supported")])
def test_a_dtype_the_accelerator_lacks_is_refused_by_the_engine(monkeypatch, dtype, question):
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(get_accelerator(), question, lambda: False)
    with pytest.raises(ValueError, match=f"Type {dtype} is not supported on your device"):
        initialize(torch.nn.Linear(4, 4), config(**{dtype: {"enabled": True}}))


# deepspeed.zero_stage 3 with experts: engine.py:2215.
def test_zero3_refuses_deepspeeds_native_moe_layer():
    with pytest.raises(AssertionError, match="Native DeepSpeed MoE is not supported with ZeRO Stage 3"):
        initialize(Moe(1, 1), config(zero_optimization={"stage": 3}))


# deepspeed.grad_accum_fp32 with zero_stage 0: engine.py:2323.
def test_fp32_accumulation_of_a_16_bit_model_without_zero_is_not_implemented():
    with pytest.raises(NotImplementedError, match="unsupported mix of model_dtype=torch.bfloat16 and "
                                                  "grad_accum_dtype=torch.float32"):
        initialize(torch.nn.Linear(4, 4), config(bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"},
                                                 zero_optimization={"stage": 0}))


# deepspeed.zero_stage 2 or 3 with topology.pp > 1: pipe/engine.py:76.
def test_the_pipeline_engine_refuses_zero2():
    module = PipelineModule(layers=[torch.nn.Linear(4, 4)], num_stages=1, loss_fn=lambda out, label: out.sum())
    with pytest.raises(AssertionError, match="ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"):
        initialize(module, config(zero_optimization={"stage": 2}))


# topology.ep: moe/layer.py:59, utils/groups.py:417 (without expert TP) and :634 (with it).
def test_the_moe_layer_needs_ep_to_divide_the_experts():
    with pytest.raises(AssertionError,
                       match=r"Number of experts \(3\) should be divisible by expert parallel size \(2\)"):
        MoE(hidden_size=4, expert=torch.nn.Linear(4, 4), num_experts=3, ep_size=2)


def raised_in(error, function):
    """Whether `function` is on the traceback of `error` (a pytest ExceptionInfo)."""
    return any(entry.name == function for entry in error.traceback)


def test_expert_groups_without_expert_tp_need_ep_to_divide_the_stages_ranks():
    with pytest.raises(AssertionError, match="1 is not divisible by 2") as error:
        initialize(Moe(2, 2), config())
    assert raised_in(error, "_create_expert_and_data_parallel")


def test_expert_groups_with_expert_tp_need_ep_to_divide_the_data_parallel_size():
    with pytest.raises(AssertionError, match="1 is not divisible by 2") as error:
        initialize(Moe(2, 2, expert_tp=True), config(), mpu=Mpu(1))
    assert raised_in(error, "_create_expert_data_and_model_parallel")


# deepspeed.autoep without experts: module_inject/auto_ep.py:760.
def test_autoep_finds_no_moe_layer_in_a_dense_model():
    with pytest.raises(ValueError, match="AutoEP: no MoE layers detected for moe_layer_pattern"):
        deepspeed.initialize(model=torch.nn.Linear(4, 4), config=config(expert_parallel=AUTOEP,
                                                                         optimizer={"type": "AdamW",
                                                                                    "params": {"lr": 0.0,
                                                                                               "torch_adam": True}}))


# deepspeed.autoep with topology.tp > 1 without deepspeed.autotp: engine.py:836.
def test_autoep_refuses_tp_from_an_mpu():
    class TwoWayTp(Mpu):  # an mpu whose TP is 2, as the worker's would be at TP 2
        def get_model_parallel_world_size(self):
            return 2

        get_tensor_model_parallel_world_size = get_model_parallel_world_size

    with pytest.raises(ValueError, match="AutoEP does not currently support tensor model parallelism from mpu"):
        deepspeed.initialize(model=torch.nn.Linear(4, 4), mpu=TwoWayTp(1), config=config(expert_parallel=AUTOEP))


# topology.ep with deepspeed.autoep: auto_ep_folding.py:112, auto_ep_config.py:371 and :380.
def test_autoep_needs_ep_to_divide_the_stages_ranks():
    with pytest.raises(ValueError, match=r"autoep_size \* expert_parallel.expert_tensor_parallel_size .* must divide "
                                         r"the stage size"):
        deepspeed.initialize(model=torch.nn.Linear(4, 4), config=config(expert_parallel={**AUTOEP, "autoep_size": 2}))


@pytest.mark.parametrize("experts, message", [(1, "autoep_size=2 exceeds num_experts=1"),
                                              (3, "num_experts=3 in layer 'moe.0' is not divisible by autoep_size=2")])
def test_autoep_needs_ep_to_divide_the_experts(experts, message):
    layer = types.SimpleNamespace(num_experts=experts, moe_module_name="moe.0", score_apply="post")
    with pytest.raises(ValueError, match=message):
        validate_autoep_post_detection(parse_autoep_config({**AUTOEP, "autoep_size": 2}), [layer])


# AutoEP folded over AutoTP: auto_ep_folding.py:215, :241 and :249.
def test_folding_refuses_expert_tensor_parallelism():
    spec = build_folding_spec(world_size=4, pp_size=1, tp_size=2, ep_size=1, etp_size=2)
    with pytest.raises(ValueError, match="expert_tensor_parallel_size=2 is reserved for expert-internal tensor "
                                         "parallelism and is not supported yet"):
        validate_folding_global(spec)


def test_folding_needs_ep_above_1():
    spec = build_folding_spec(world_size=2, pp_size=1, tp_size=2, ep_size=1)
    with pytest.raises(ValueError, match=r"AutoEP\+AutoTP folding requires expert_parallel.autoep_size > 1"):
        validate_folding_global(spec)


def test_folding_refuses_optimizer_offload():
    spec = build_folding_spec(world_size=4, pp_size=1, tp_size=2, ep_size=2)
    with pytest.raises(ValueError, match=r"ZeRO optimizer/parameter offload with AutoEP\+AutoTP folding is not "
                                         "validated yet"):
        validate_folding_global(spec, zero_stage=1, zero_offload_optimizer=True)
