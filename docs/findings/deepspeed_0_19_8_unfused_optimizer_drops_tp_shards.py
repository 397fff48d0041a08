"""DeepSpeed 0.19.8: FP16_UnfusedOptimizer drops the shards of tensor-parallel ranks > 0 from the
gradient norm (docs/findings/deepspeed-0.19.8-unfused-optimizer-drops-tp-shards.md).

    torchrun --standalone --nproc-per-node 2 deepspeed_0_19_8_unfused_optimizer_drops_tp_shards.py

Two ranks, TP 2 (DP 1). One weight of 8 x 4 is split over TP by rows (each rank holds 4 x 4, marked
tensor_model_parallel as Megatron's layers mark it), and one bias of 4 is replicated. Every
gradient element is 1, so the global norm is sqrt(32 + 4) = 6. bf16 at ZeRO stage 0 with a torch
optimizer takes FP16_UnfusedOptimizer (so does fp16 with any non-fused optimizer). Runs on CPUs
(DS_ACCELERATOR=cpu is set when there is no GPU) and GPUs (one GPU per rank, or gloo when shared).
Rank 0 prints `DEFECT SHOWN` (every rank exits 1) or `DEFECT ABSENT` (exit 0).
"""
import os
import sys

import torch
import torch.distributed as dist

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402


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
    gpus = torch.cuda.device_count()
    local = int(os.environ["LOCAL_RANK"])
    if gpus:
        torch.cuda.set_device(local % gpus)
        os.environ["LOCAL_RANK"] = str(local % gpus)
    backend = "nccl" if gpus >= int(os.environ["WORLD_SIZE"]) else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend)
    mpu = TensorParallel()
    mpu.dp = dist.new_group([dist.get_rank()])  # DP 1: each rank is its own DP group
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.zeros(4, 4))  # this rank's rows of an 8 x 4 weight
    model.weight.tensor_model_parallel, model.weight.partition_dim = True, 0
    model.bias = torch.nn.Parameter(torch.zeros(4))  # replicated over TP
    engine, _, _, _ = deepspeed.initialize(
        model=model, mpu=mpu, optimizer=torch.optim.AdamW(model.parameters(), lr=0.0),
        config={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
                "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": {"stage": 0}})
    loss = sum(p.sum() for p in engine.module.parameters())  # every gradient element is 1
    engine.backward(loss)
    engine.step()
    reported = float(engine.get_global_grad_norm())
    if dist.get_rank() == 0:
        print(f"{type(engine.optimizer).__name__}: get_global_grad_norm() = {reported}, expected 6.0 "
              f"(sqrt(32 + 4)); {reported ** 2:.0f} of the 36 squared elements counted")
    shown = abs(reported - 6.0) > 1e-3
    if dist.get_rank() == 0:
        print("DEFECT SHOWN: TP rank 1's weight shard is dropped" if shown else
              "DEFECT ABSENT: every element counted once")
    dist.destroy_process_group()
    sys.exit(1 if shown else 0)


if __name__ == "__main__":
    main()
