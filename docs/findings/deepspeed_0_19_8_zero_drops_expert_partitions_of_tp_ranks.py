"""DeepSpeed 0.19.8: ZeRO stages 1 and 2 drop, from the gradient norm, the expert partitions they
give tensor-parallel ranks > 0 when the experts are not tensor-parallel
(docs/findings/deepspeed-0.19.8-zero-drops-expert-partitions-of-tp-ranks.md).

    torchrun --standalone --nproc-per-node 2 deepspeed_0_19_8_zero_drops_expert_partitions_of_tp_ranks.py [--stage 2]

Two ranks, TP 2 (DP 1), one MoE layer (deepspeed.moe.layer.MoE, 1 expert, ep_size 1, expert tensor
parallelism off, as Megatron-DeepSpeed defaults). DeepSpeed's expert groups then ignore TP: the
expert-data-parallel group is both ranks, so ZeRO splits the expert's 16 elements between them.
Every gradient element is 1 after DeepSpeed's reduction (each rank's loss gives the expert half,
as in a real step where each TP rank routes half of the tokens), so the global norm is
sqrt(4 gate + 16 expert) = sqrt(20). fp32; runs on CPUs (DS_ACCELERATOR=cpu without a GPU) and GPUs.
Rank 0 prints `DEFECT SHOWN` (every rank exits 1) or `DEFECT ABSENT` (exit 0).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: E402


class TensorParallel:
    """The Megatron-style mpu DeepSpeed reads: TP is the whole world here."""

    def __init__(self):
        self.group = dist.new_group(list(range(dist.get_world_size())))

    def get_model_parallel_rank(self):
        return dist.get_rank()

    get_tensor_model_parallel_rank = get_model_parallel_rank

    def get_model_parallel_world_size(self):
        return dist.get_world_size()

    get_tensor_model_parallel_world_size = get_model_parallel_world_size

    def get_model_parallel_group(self):
        return self.group

    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_world_size(self):
        return 1

    def get_data_parallel_group(self):
        return self.dp

    def get_pipeline_model_parallel_world_size(self):
        return 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=1, choices=[1, 2])
    args = p.parse_args()
    gpus = torch.cuda.device_count()
    local = int(os.environ["LOCAL_RANK"])
    if gpus:
        torch.cuda.set_device(local % gpus)
        os.environ["LOCAL_RANK"] = str(local % gpus)
    backend = "nccl" if gpus >= int(os.environ["WORLD_SIZE"]) else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend)
    mpu = TensorParallel()
    mpu.dp = dist.new_group([dist.get_rank()])  # DP 1
    model = torch.nn.Module()
    model.moe = MoE(4, torch.nn.Linear(4, 4, bias=False), num_experts=1, ep_size=1, k=1)
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "all"})
    engine, _, _, _ = deepspeed.initialize(
        model=model, mpu=mpu, optimizer=torch.optim.AdamW(groups, lr=0.0),
        config={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
                "gradient_clipping": 1.0, "zero_optimization": {"stage": args.stage},
                "zero_allow_untested_optimizer": True})
    loss = sum(q.sum() * (0.5 if not getattr(q, "allreduce", True) else 1.0) for q in engine.module.parameters())
    engine.backward(loss)
    engine.step()
    reported = float(engine.get_global_grad_norm())
    if dist.get_rank() == 0:
        print(f"ZeRO {args.stage}, {type(engine.optimizer).__name__}: get_global_grad_norm() = {reported}, "
              f"expected {20 ** 0.5} (sqrt(20)); {reported ** 2:.0f} of the 20 squared elements counted")
    shown = abs(reported ** 2 - 20) > 1e-3
    if dist.get_rank() == 0:
        print("DEFECT SHOWN: the expert partition of TP rank 1 is dropped" if shown else
              "DEFECT ABSENT: every element counted once")
    dist.destroy_process_group()
    sys.exit(1 if shown else 0)


if __name__ == "__main__":
    main()
