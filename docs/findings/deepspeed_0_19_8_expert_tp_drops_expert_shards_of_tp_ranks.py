"""DeepSpeed 0.19.8 with expert tensor parallelism: `Experts` deep-copies the expert, the copies lose
their tensor-parallel marks, and the norm codes that test the marks (ZeRO 1/2's get_grad_norm_direct,
fp32 clip_grad_norm_) drop the expert shards of TP ranks > 0
(docs/findings/deepspeed-0.19.8-expert-tp-drops-expert-shards-of-tp-ranks.md).

    torchrun --standalone --nproc-per-node 2 \\
        deepspeed_0_19_8_expert_tp_drops_expert_shards_of_tp_ranks.py [--path zero1|zero2|fp32-clip] [--remark]

Two ranks, TP 2 (DP 1), one MoE layer of one expert with expert TP
(`enable_expert_tensor_parallelism=True`). Each rank holds half of a column-parallel dense weight
(4 x 2) and half of the expert's column-parallel FC1 (8 x 2), both marked `tensor_model_parallel`
when built, as Megatron-DeepSpeed's ColumnParallelLinear marks them. It holds whole the router
(1 x 2) and the expert's FC2 bias (2), which are replicated over TP. Every gradient element is 1,
so the true norm is sqrt(8 + 16 + 2 + 2) = sqrt(28).

--path: zero1 and zero2 (DeepSpeedZeroOptimizer, bf16) report get_global_grad_norm(); fp32-clip
(fp32 at ZeRO 0, whose engine keeps no norm) reports what clip_grad_norm_ returns. Each gives
sqrt(20): TP rank 1's FC1 shard (8 elements) is dropped as if it were a replica.
--remark puts the marks back on DeepSpeed's copies before deepspeed.initialize (what a fix of
`Experts` would do): then sqrt(28).

Prints whether DeepSpeed's copy of FC1 is still marked, the norm, then `DEFECT SHOWN` (every rank
exits 1) or `DEFECT ABSENT` (exit 0). Runs on CPUs (DeepSpeed's CPU accelerator, gloo) or GPUs.
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
import deepspeed.runtime.engine  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: E402


class Mpu:
    """TP over the whole world, DP 1 (the Megatron-style mpu DeepSpeed reads)."""

    def __init__(self):
        self.world = dist.get_world_size()
        self.group = dist.new_group(list(range(self.world)))
        self.dp_groups = [dist.new_group([r]) for r in range(self.world)]

    def get_model_parallel_rank(self):
        return dist.get_rank()

    get_tensor_model_parallel_rank = get_model_parallel_rank

    def get_model_parallel_world_size(self):
        return self.world

    get_tensor_model_parallel_world_size = get_model_parallel_world_size

    def get_model_parallel_group(self):
        return self.group

    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_world_size(self):
        return 1

    def get_data_parallel_group(self):
        return self.dp_groups[dist.get_rank()]


def tensor_parallel(param, dim):
    param.tensor_model_parallel, param.partition_dim = True, dim
    return param


class Expert(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.fc1_weight = tensor_parallel(torch.nn.Parameter(torch.zeros(4, 2, dtype=dtype)), 0)  # of 8 x 2
        self.fc2_bias = torch.nn.Parameter(torch.zeros(2, dtype=dtype))  # replicated over TP


class Model(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dense_weight = tensor_parallel(torch.nn.Parameter(torch.zeros(2, 2, dtype=dtype)), 0)  # of 4 x 2
        self.moe = MoE(hidden_size=2, expert=Expert(dtype), num_experts=1, ep_size=1, k=1,
                       enable_expert_tensor_parallelism=True)
        self.moe.to(dtype)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--path", default="zero1", choices=["zero1", "zero2", "fp32-clip"])
    p.add_argument("--remark", action="store_true", help="put the FC1 marks back on DeepSpeed's expert copies")
    args = p.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    fp32 = args.path == "fp32-clip"
    model = Model(torch.float32 if fp32 else torch.bfloat16)
    copy = model.moe.deepspeed_moe.experts.deepspeed_experts[0]
    print(f"rank {dist.get_rank()}: DeepSpeed's copy of FC1 is marked tensor_model_parallel: "
          f"{getattr(copy.fc1_weight, 'tensor_model_parallel', False)}")
    if args.remark:
        tensor_parallel(copy.fc1_weight, 0)
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "all"})
    optimizer = torch.optim.AdamW(groups, lr=0.0, weight_decay=0.0)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": {"zero1": 1, "zero2": 2, "fp32-clip": 0}[args.path]},
              "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30}
    if not fp32:
        config["bf16"] = {"enabled": True}
    seen = {}
    clip_grad_norm_ = deepspeed.runtime.engine.clip_grad_norm_

    def watched(parameters, max_norm, norm_type=2, mpu=None):
        seen["norm"] = float(clip_grad_norm_(parameters, max_norm, norm_type, mpu))
        return seen["norm"]

    deepspeed.runtime.engine.clip_grad_norm_ = watched  # fp32 at ZeRO 0 clips with it
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=Mpu(), config=config)
    engine.backward(sum(q.float().sum() for q in engine.module.parameters()))  # every gradient element 1
    engine.step()
    what, norm = ("clip_grad_norm_", seen["norm"]) if fp32 else ("get_global_grad_norm()",
                                                                 float(engine.get_global_grad_norm()))
    shown = abs(norm * norm - 28) > 1e-3
    if dist.get_rank() == 0:
        print(f"{args.path}{' --remark' if args.remark else ''} ({type(engine.optimizer).__name__}): {what} = "
              f"{norm!r} = sqrt({norm * norm:.4f}); truth sqrt(28) = {math.sqrt(28)!r}")
        print(f"DEFECT SHOWN: {28 - norm * norm:.4f} squared elements missing: TP rank 1's FC1 shard (8 elements), "
              "whose copy lost its tensor_model_parallel mark, dropped as a TP replica" if shown else
              "DEFECT ABSENT: every element counted once")
    dist.destroy_process_group()
    sys.exit(1 if shown else 0)


if __name__ == "__main__":
    main()
