"""DeepSpeed 0.19.8 against two open reports on the expert part of the norm
(docs/findings/deepspeed-0.19.8-open-reports.md):

- #8613: FP16_UnfusedOptimizer leaves the expert gradients out of the norm. bf16 at ZeRO 0 with a
  torch optimizer takes that optimizer too (since #7515, v0.17.6), so bf16 shows it as fp16 does.
- #8475: fp32 clipping at ZeRO 0 (clip_grad_norm_) averages the ranks' norms over data parallel,
  though each rank holds other experts.

    torchrun --standalone --nproc-per-node 2 deepspeed_0_19_8_open_reports_expert_norm.py --report 8613|8475

Two ranks, DP 2, no mpu. A dense 4 x 4 weight and one MoE layer (deepspeed.moe.layer.MoE, 2 experts,
ep_size 2: each rank holds one expert, a 4 x 4 weight) with its router (2 x 4). Every gradient element
is 1 after DeepSpeed's reductions, so the global norm is sqrt(16 dense + 8 router + 2 x 16 experts) =
sqrt(56). --report 8613: bf16 at ZeRO 0 with torch's AdamW (FP16_UnfusedOptimizer),
get_global_grad_norm(). --report 8475: fp32 at ZeRO 0, what clip_grad_norm_ returns (the engine keeps
no norm there). Rank 0 prints the norm and `DEFECT SHOWN` (every rank exits 1) or `DEFECT ABSENT`
(exit 0). Runs on CPUs (DeepSpeed's CPU accelerator, gloo) or GPUs.
"""
import argparse
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--report", required=True, choices=["8613", "8475"])
    args = p.parse_args()
    gpus = torch.cuda.device_count()
    local = int(os.environ["LOCAL_RANK"])
    if gpus:
        torch.cuda.set_device(local % gpus)
        os.environ["LOCAL_RANK"] = str(local % gpus)
    backend = "nccl" if gpus >= int(os.environ["WORLD_SIZE"]) else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend)
    world = dist.get_world_size()
    bf16 = args.report == "8613"
    model = torch.nn.Module()
    model.dense = torch.nn.Parameter(torch.zeros(4, 4))
    model.moe = MoE(4, torch.nn.Linear(4, 4, bias=False), num_experts=world, ep_size=world, k=1)
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "all"})
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": 0}, "steps_per_print": 1 << 30}
    if bf16:
        config["bf16"] = {"enabled": True}
    seen = {}
    clip_grad_norm_ = deepspeed.runtime.engine.clip_grad_norm_

    def watched(parameters, max_norm, norm_type=2, mpu=None):
        seen["norm"] = float(clip_grad_norm_(parameters, max_norm, norm_type, mpu))
        return seen["norm"]

    deepspeed.runtime.engine.clip_grad_norm_ = watched  # fp32 at ZeRO 0 clips with it
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(groups, lr=0.0), config=config)
    # DeepSpeed averages dense gradients over DP, and divides an expert's by DP after summing it over
    # its expert-DP group (here each expert is on one rank): these factors leave every element at 1.
    loss = sum(q.float().sum() * (world if not getattr(q, "allreduce", True) else 1.0)
               for q in engine.module.parameters())
    engine.backward(loss)
    engine.step()
    what, norm = (("get_global_grad_norm()", float(engine.get_global_grad_norm())) if bf16 else
                  ("clip_grad_norm_", seen["norm"]))
    shown = abs(norm * norm - 56) > 1e-2
    if dist.get_rank() == 0:
        print(f"#{args.report}, {'bf16' if bf16 else 'fp32'} ZeRO 0, {type(engine.optimizer).__name__}: {what} = "
              f"{norm!r} = sqrt({norm * norm:.4f}); truth sqrt(56) = {56 ** 0.5!r}")
        if not shown:
            print("DEFECT ABSENT: every element counted once")
        elif args.report == "8613":
            print(f"DEFECT SHOWN: {56 - norm * norm:.4f} squared elements missing: the experts' (2 x 16) left out")
        else:
            print("DEFECT SHOWN: each rank's norm (its own expert only, sqrt(40)) averaged over DP")
    dist.destroy_process_group()
    sys.exit(1 if shown else 0)


if __name__ == "__main__":
    main()
