"""DeepSpeed 0.19.8 with expert tensor parallelism: BF16_Optimizer and FP16_Optimizer keep every
expert param on every TP rank, so an expert param that is replicated over TP (the row-parallel FC2
bias of a Megatron-DeepSpeed expert) is counted once per TP rank
(docs/findings/deepspeed-0.19.8-expert-tp-counts-replicated-expert-bias-per-tp-rank.md).

    torchrun --standalone --nproc-per-node 2 \\
        deepspeed_0_19_8_expert_tp_counts_replicated_expert_bias_per_tp_rank.py [--path bf16-optimizer|fused-adam]

Two ranks, TP 2 (DP 1), one MoE layer of one expert with expert TP
(`enable_expert_tensor_parallelism=True`), bf16. Each rank holds half of a column-parallel dense
weight (4 x 2) and half of the expert's column-parallel FC1 (8 x 2), both marked
`tensor_model_parallel`; DeepSpeed's copy of the expert is marked again before the engine is built,
so this script shows this defect alone (these two optimizers count the FC1 shards right either way).
Each rank holds whole the router (1 x 2) and the expert's FC2 bias (2), replicated over TP. Every
gradient element is 1, so the true norm is sqrt(8 + 16 + 2 + 2) = sqrt(28).

--path:
- bf16-optimizer: bf16 with fp32 gradient accumulation at ZeRO 1 (BF16_Optimizer);
- fused-adam: bf16 at ZeRO 0 with DeepSpeed's FusedAdam (FP16_Optimizer); builds the FusedAdam op
  (DeepSpeed's CPU accelerator has one too).
Each reports sqrt(30): the FC2 bias counted on both TP ranks.

Rank 0 prints the norm, then `DEFECT SHOWN` (every rank exits 1) or `DEFECT ABSENT` (exit 0). Runs
on CPUs (DeepSpeed's CPU accelerator, gloo) or GPUs.
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
    def __init__(self):
        super().__init__()
        self.fc1_weight = tensor_parallel(torch.nn.Parameter(torch.zeros(4, 2, dtype=torch.bfloat16)), 0)  # of 8 x 2
        self.fc2_bias = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))  # replicated over TP


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense_weight = tensor_parallel(torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.bfloat16)), 0)  # of 4 x 2
        self.moe = MoE(hidden_size=2, expert=Expert(), num_experts=1, ep_size=1, k=1,
                       enable_expert_tensor_parallelism=True)
        self.moe.to(torch.bfloat16)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--path", default="bf16-optimizer", choices=["bf16-optimizer", "fused-adam"])
    args = p.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    model = Model()
    tensor_parallel(model.moe.deepspeed_moe.experts.deepspeed_experts[0].fc1_weight, 0)  # the other defect, fixed
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "all"})
    if args.path == "fused-adam":
        from deepspeed.ops.adam import FusedAdam

        optimizer = FusedAdam(groups, lr=0.0, weight_decay=0.0)
    else:
        optimizer = torch.optim.AdamW(groups, lr=0.0, weight_decay=0.0)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 0 if args.path == "fused-adam" else 1},
              "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30}
    if args.path == "bf16-optimizer":
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=Mpu(), config=config)
    engine.backward(sum(q.float().sum() for q in engine.module.parameters()))  # every gradient element 1
    engine.step()
    norm = float(engine.get_global_grad_norm())
    shown = abs(norm * norm - 28) > 1e-3
    if dist.get_rank() == 0:
        print(f"{args.path} ({type(engine.optimizer).__name__}): get_global_grad_norm() = {norm!r} = "
              f"sqrt({norm * norm:.4f}); truth sqrt(28) = {math.sqrt(28)!r}")
        print(f"DEFECT SHOWN: {norm * norm - 28:.4f} extra squared elements: the expert's FC2 bias (2 elements, "
              "replicated over TP) counted on both TP ranks" if shown else "DEFECT ABSENT: every element counted once")
    dist.destroy_process_group()
    sys.exit(1 if shown else 0)


if __name__ == "__main__":
    main()
