"""An example of tally in DeepSpeed's own tests: each test builds a small model on DeepSpeed's
engine, gives every parameter a gradient that differs per element (the same on every rank, as
after the data-parallel reduction), runs `engine.step()` inside tally_adapters.deepspeed's
Recording, and asks tally, through the `tally_grad_norm` fixture, whether DeepSpeed's norm counted
every element exactly once.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 -m pytest -q adapters/examples/deepspeed/tests/unit \\
        --tally build/cli/tally

The dense model passes at ZeRO 0, 1 and 2. The MoE model at ZeRO 0 in fp32 does not: DeepSpeed
0.19.8's `clip_grad_norm_` averages each rank's norm over the data-parallel ranks instead of adding
their squares (DeepSpeed #8475; docs/findings/deepspeed-0.19.8-open-reports.md), so with the experts
split over two EP ranks each rank's experts are counted half; the test expects tally to say so.
"""

import numpy as np
import pytest
import torch
import torch.nn as nn
from tally_adapters.check import GradNormMiscount
from tally_adapters.deepspeed import Recording, build_manifest, dump_manifest, expert_groups_by_name

HIDDEN = 4


def config(stage):
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
    }


def gradient_values(name, shape):
    """A dyadic value per element, from the logical name: exact in fp32 and the same on every rank."""
    seed = sum(ord(c) for c in name)
    n = int(np.prod(shape))
    return (((np.arange(n) * 7 + seed) % 17 - 8) / 8.0).reshape(shape)


def step_and_write(engine, logical, out_dir, world, ep=1):
    """Backward of sum(param * gradient * world / reducers) on every rank, the step inside
    Recording, and this rank's manifest. DeepSpeed sums a gradient over the ranks that hold it (the
    data-parallel group, or an expert's expert-data-parallel group) and divides by the DP size, so
    each param's gradient is then exactly its values. `logical(param)`: its logical name, the
    logical tensor's shape and the (offsets, extents) of its box in it."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    described = {}
    loss = 0
    for p in engine.module.parameters():
        name, shape, offsets, extents = logical(p)
        box = tuple(slice(o, o + e) for o, e in zip(offsets, extents))
        values = gradient_values(name, shape)[box]
        described[id(p)] = (name, shape, offsets, extents, values)
        reducers = len(groups._get_expert_data_parallel_group_ranks(p.group_name)) if hasattr(p, "group_name") else world
        loss = loss + (p * torch.from_numpy(values * (world / reducers)).to(p.dtype)).sum()
    engine.backward(loss)
    with Recording(engine) as recording:
        engine.step()
    norm = engine.get_global_grad_norm()
    norm = float(norm if norm is not None else recording.clip_norm)
    rank = dist.get_rank()
    mine = expert_groups_by_name(
        {"tp": [rank], "mp": [rank], "dp": list(range(world)), "expert_tp": False},
        {p.group_name for p in engine.module.parameters() if hasattr(p, "group_name")},
    )
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    manifest = build_manifest(
        engine, recording,
        describe=lambda p: dict(zip(("logical_name", "logical_shape", "offsets", "extents"), described[id(p)][:4])),
        gradient_of=lambda p: described[id(p)][4],
        groups_by_rank=dict(enumerate(everyone)),
        parallel={"tp": 1, "cp": 1, "pp": 1, "dp": world, "ep": ep, "etp": 1},
        producer="adapters/examples/deepspeed",
        reported_norm=norm,
    )
    dump_manifest(manifest, out_dir)


def whole(names):
    def logical(p):
        shape = list(p.shape)
        return names[id(p)], shape, [0] * len(shape), shape
    return logical


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_zero_counts_every_element_of_a_dense_model_once(stage, distributed, tally_grad_norm):
    import deepspeed

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(HIDDEN, 8), nn.ReLU(), nn.Linear(8, HIDDEN))
    names = {id(p): name for name, p in model.named_parameters()}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.0),
                                      config=config(stage))
    world = distributed.get_world_size()
    tally_grad_norm.judge(lambda out_dir: step_and_write(engine, whole(names), out_dir, world))


class Moe(nn.Module):
    def __init__(self, ep):
        super().__init__()
        from deepspeed.moe.layer import MoE

        self.dense = nn.Linear(HIDDEN, HIDDEN)
        self.moe = MoE(HIDDEN, nn.Linear(HIDDEN, HIDDEN), num_experts=2, ep_size=ep, k=1)


def test_an_fp32_clip_over_experts_split_by_ep_counts_every_expert_once(distributed, tally_grad_norm):
    import deepspeed
    from deepspeed.utils import groups

    world = distributed.get_world_size()
    torch.manual_seed(0)
    model = Moe(ep=world)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.0),
                                      config=config(0))
    local = {}
    for name, p in engine.module.named_parameters():
        local[id(p)] = name

    def logical(p):
        name = local[id(p)]
        shape = list(p.shape)
        if ".deepspeed_experts." in name:  # DeepSpeed's local expert i is global expert ep_rank * local + i
            head, _, rest = name.partition(".deepspeed_experts.")
            i, _, leaf = rest.partition(".")
            ep_rank = groups._get_expert_parallel_rank(p.group_name)
            local_experts = engine.module.moe.num_local_experts
            name = f"{head}.experts.{ep_rank * local_experts + int(i)}.{leaf}"
        return name, shape, [0] * len(shape), shape

    # DeepSpeed 0.19.8 averages the ranks' norms: tally names the experts each rank counted half.
    with pytest.raises(GradNormMiscount, match="experts") as miscount:
        tally_grad_norm.judge(lambda out_dir: step_and_write(engine, logical, out_dir, world, ep=world))
    print(miscount.value)
