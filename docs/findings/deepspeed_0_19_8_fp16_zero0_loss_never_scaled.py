"""DeepSpeed 0.19.8: with fp16 at ZeRO stage 0, engine.backward never multiplies the loss by the loss
scale, but the step still divides the gradients by it
(docs/findings/deepspeed-0.19.8-fp16-zero0-loss-never-scaled.md).

    torchrun --standalone --nproc-per-node 1 deepspeed_0_19_8_fp16_zero0_loss_never_scaled.py \
        [--stage 1] [--fused-adam]

One fp16 param of 4 elements, loss = its sum (every gradient element 1), a static loss scale of
128, torch SGD with lr 1 and clipping off: one step should move every element by -1, and
get_global_grad_norm() should be 2. At ZeRO 0 (FP16_UnfusedOptimizer) the param moves by -1/128;
ZeRO 1 (--stage 1) is the control. With --fused-adam the optimizer is DeepSpeed's FusedAdam (what
a config's "optimizer": {"type": "Adam"} gives on a GPU), so ZeRO 0 runs FP16_Optimizer, whose
get_global_grad_norm() is 2/128: it divides the norm of the unscaled gradients by the loss scale.
(Adam's update hides the unscaled gradients: it moves by -lr whatever their scale.) Needs a device
with fp16 (a GPU, or a CPU DeepSpeed accepts); --fused-adam builds DeepSpeed's FusedAdam op.
Prints `DEFECT SHOWN` (exit 1) when the update or the reported norm is divided by the loss scale,
else `DEFECT ABSENT` (exit 0).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=0, choices=[0, 1, 2])
    p.add_argument("--fused-adam", action="store_true", help="DeepSpeed's FusedAdam at lr 1 instead of torch SGD")
    args = p.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend)
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.zeros(4))
    if args.fused_adam:
        from deepspeed.ops.adam import FusedAdam

        optimizer = FusedAdam(model.parameters(), lr=1.0, weight_decay=0.0)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer,
        config={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
                "gradient_clipping": 0.0, "fp16": {"enabled": True, "loss_scale": 128},
                "zero_optimization": {"stage": args.stage},
                "zero_allow_untested_optimizer": True})
    engine.backward(engine.module.weight.sum())
    engine.step()
    moved = engine.module.weight.detach().float().cpu().tolist()
    norm = engine.get_global_grad_norm()
    print(f"ZeRO {args.stage}, {type(engine.optimizer).__name__}: the step moved the param by {moved} "
          f"(expected -1 each with SGD); get_global_grad_norm() = {float(norm)} (expected 2)")
    wrong_update = not args.fused_adam and abs(moved[0] + 1) > 1e-3  # (Adam's step does not tell the scale)
    wrong_norm = abs(float(norm) - 2) > 1e-6
    if wrong_update:
        print(f"WRONG UPDATE: the gradient reached the optimizer divided by {-1 / moved[0]:g} (the loss scale)")
    if wrong_norm:
        print(f"WRONG NORM: get_global_grad_norm() is the true norm divided by {2 / float(norm):g} (the loss scale)")
    shown = wrong_update or wrong_norm
    print("DEFECT SHOWN: the loss was never scaled, but the step divided by the loss scale" if shown else
          "DEFECT ABSENT: the update and the norm are the unscaled ones")
    dist.destroy_process_group()
    sys.exit(1 if shown else 0)


if __name__ == "__main__":
    main()
