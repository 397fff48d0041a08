"""DeepSpeed 0.19.8: with AutoEP folded over AutoTP, ZeRO stages 1 and 2, and fp32 clipping at ZeRO 0,
drop from the gradient norm the experts that tensor-parallel ranks > 0 hold
(docs/findings/deepspeed-0.19.8-zero-drops-expert-partitions-of-tp-ranks.md).

    torchrun --standalone --nproc-per-node 2 deepspeed_0_19_8_autoep_folding_drops_experts_of_tp_ranks.py [--stage 0|1|2]

Two ranks, `"tensor_parallel": {"autotp_size": 2}` and `"expert_parallel": {"autoep_size": 2}`:
AutoEP folds its expert-parallel group over the TP ranks, so rank 0 holds expert 0 and rank 1
expert 1, each whole. One MoE layer in the Hugging Face layout AutoEP replaces (router `gate`
4 -> 2, experts with SwiGLU projections of width 2 stored as 3-D tensors). Every gradient element
is 1 after DeepSpeed's reductions: each rank's loss gives the router and its own expert (the
expert's term times TP, the factor the folded forward's all-gather leaves and DeepSpeed's folding
divides out), so the global norm is sqrt(8 router + 2 x 24 expert) = sqrt(56). fp32; runs on CPUs
(DS_ACCELERATOR=cpu without a GPU) and GPUs. At ZeRO 0 the engine keeps no norm in fp32
(get_global_grad_norm() is None), so the script reads what clip_grad_norm_ returns. Rank 0 prints
`DEFECT SHOWN` (every rank exits 1) or `DEFECT ABSENT` (exit 0).
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

HIDDEN, FFN, EXPERTS = 4, 2, 2


def moe_block():
    """A Hugging Face-style MoE layer: a router `gate` and `experts` with 3-D SwiGLU projections."""
    block = torch.nn.Module()
    block.gate = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
    block.experts = torch.nn.Module()
    block.experts.gate_proj = torch.nn.Parameter(torch.zeros(EXPERTS, FFN, HIDDEN))
    block.experts.up_proj = torch.nn.Parameter(torch.zeros(EXPERTS, FFN, HIDDEN))
    block.experts.down_proj = torch.nn.Parameter(torch.zeros(EXPERTS, HIDDEN, FFN))
    return block


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=1, choices=[0, 1, 2])
    args = p.parse_args()
    gpus = torch.cuda.device_count()
    local = int(os.environ["LOCAL_RANK"])
    if gpus:
        torch.cuda.set_device(local % gpus)
        os.environ["LOCAL_RANK"] = str(local % gpus)
    backend = "nccl" if gpus >= int(os.environ["WORLD_SIZE"]) else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend)
    tp = dist.get_world_size()
    model = torch.nn.Module()
    model.moe = torch.nn.ModuleDict({"layer0": moe_block()})
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                "zero_optimization": {"stage": args.stage},
                "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0, "torch_adam": True}},
                "tensor_parallel": {"autotp_size": tp, "partition_config": {
                    "use_default_specs": False, "layer_specs": [{"patterns": [r"^no_layer$"]}]}},
                "expert_parallel": {"enabled": True, "autoep_size": tp, "moe_layer_pattern": r"moe\.\w+",
                                    "router_pattern": "gate", "expert_pattern": "experts", "expert_w1": "gate_proj",
                                    "expert_w2": "down_proj", "expert_w3": "up_proj", "top_k": 1,
                                    "score_func": "softmax", "score_apply": "post", "route_norm": False,
                                    "use_grouped_mm": False}})
    seen = {}
    clip_grad_norm_ = deepspeed.runtime.engine.clip_grad_norm_

    def watched(parameters, max_norm, norm_type=2, mpu=None):
        seen["norm"] = float(clip_grad_norm_(parameters, max_norm, norm_type, mpu))
        return seen["norm"]

    deepspeed.runtime.engine.clip_grad_norm_ = watched  # fp32 at ZeRO 0 clips with it
    loss = sum(q.sum() * (tp if not getattr(q, "allreduce", True) else 1.0) for q in engine.module.parameters())
    engine.backward(loss)
    engine.step()
    if args.stage == 0:
        what, reported = "clip_grad_norm_", seen["norm"]
    else:
        what, reported = "get_global_grad_norm()", float(engine.get_global_grad_norm())
    shown = abs(reported ** 2 - 56) > 1e-3
    if dist.get_rank() == 0:
        print(f"ZeRO {args.stage}, AutoEP folded over AutoTP {tp}, {type(engine.optimizer).__name__}: "
              f"{what} = {reported}, expected {56 ** 0.5} (sqrt(56)); "
              f"{reported ** 2:.0f} of the 56 squared elements counted")
        print("DEFECT SHOWN: the experts of TP rank 1 are dropped" if shown else
              "DEFECT ABSENT: every element counted once")
    dist.destroy_process_group()
    sys.exit(1 if shown else 0)


if __name__ == "__main__":
    main()
