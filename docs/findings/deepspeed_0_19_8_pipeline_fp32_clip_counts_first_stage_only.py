"""DeepSpeed 0.19.8: with pipeline parallelism, fp32 gradient clipping at ZeRO stage 0 counts the
replicated params of the first stage only
(docs/findings/deepspeed-0.19.8-pipeline-fp32-clip-counts-first-stage-only.md).

    torchrun --standalone --nproc-per-node 2 deepspeed_0_19_8_pipeline_fp32_clip_counts_first_stage_only.py

Two ranks, two pipeline stages (TP 1, DP 1), DeepSpeed's own PipelineModule and train_batch:
stage 0 holds a tied embedding E (2 elements, a TiedLayerSpec) and A (1 element), stage 1 holds B
(1 element) and the tied copy of E. Each layer adds sum(param * weight) to the activation it passes
on and the loss is the last activation, so the gradients are the weights: E [1, 2] (from its
first use; its copy adds [0, 0]), A [3], B [4]. The global norm is sqrt(1 + 4 + 9 + 16) =
sqrt(30). Runs on one GPU per rank, else on CPUs (DS_ACCELERATOR=cpu). Rank 0 prints `DEFECT SHOWN`
(every rank exits 1) or `DEFECT ABSENT` (exit 0).
"""
import os
import sys

import torch
import torch.distributed as dist

# One GPU per rank (NCCL), else CPUs: gloo cannot send GPU tensors between pipeline stages.
ON_GPUS = torch.cuda.device_count() >= int(os.environ.get("WORLD_SIZE", "1"))
if not ON_GPUS:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
import deepspeed.runtime.engine  # noqa: E402
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: E402


class Weighted(torch.nn.Module):
    """A param whose gradient is `weight`: forward adds sum(param * weight) to the activation."""

    def __init__(self, n, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n))
        self.register_buffer("w", torch.tensor(weight))

    def forward(self, x):
        return x + (self.weight * self.w).sum()


def main():
    if ON_GPUS:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    backend = "nccl" if ON_GPUS else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend)
    layers = [TiedLayerSpec("E", Weighted, 2, [1.0, 2.0]), LayerSpec(Weighted, 1, [3.0]),  # stage 0
              LayerSpec(Weighted, 1, [4.0]), TiedLayerSpec("E", Weighted, 2, [0.0, 0.0])]  # stage 1
    model = PipelineModule(layers=layers, num_stages=2, partition_method="uniform", loss_fn=lambda out, _: out.sum())
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        config={"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
                "zero_optimization": {"stage": 0}, "steps_per_print": 1 << 30})
    # The fp32 ZeRO-0 engine keeps no norm (get_global_grad_norm() is None): read what
    # clip_fp32_gradients' clip_grad_norm_ returns, and the gradients it leaves.
    seen = {}
    clip_grad_norm_ = deepspeed.runtime.engine.clip_grad_norm_

    def watched(parameters, max_norm, norm_type=2, mpu=None):
        parameters = list(parameters)
        seen["norm"] = float(clip_grad_norm_(parameters, max_norm, norm_type, mpu))
        seen["clipped"] = [p.grad.tolist() for p in parameters if p.grad is not None]
        return seen["norm"]

    deepspeed.runtime.engine.clip_grad_norm_ = watched
    x = torch.zeros(1, device=next(engine.module.parameters()).device)
    engine.train_batch(data_iter=iter([(x, x)]))
    stage = engine.grid.get_stage_id()
    norms = [None] * dist.get_world_size()
    dist.all_gather_object(norms, (stage, seen["norm"], seen["clipped"]))
    if dist.get_rank() == 0:
        truth = 30 ** 0.5
        for stage, norm, clipped in norms:
            print(f"stage {stage}: clip_grad_norm_ = {norm}, gradients after clipping {clipped}")
        norm = norms[0][1]
        print(f"expected {truth} (sqrt(30)); {norm ** 2:.0f} of the 30 squared elements counted; "
              f"B's clipped gradient is 4/{norm:.4f} = {4 / norm:.4f}, not 4/{truth:.4f} = {4 / truth:.4f}")
        clipped = sum(v * v for _, _, grads in norms for g in grads for v in g) - sum(v * v for v in norms[1][2][0])
        print(f"the clipped gradients' norm is {clipped ** 0.5:.4f}, above max_norm 1.0 (E's copy counted once)")
    shown = abs(norms[0][1] - 30 ** 0.5) > 1e-3
    if dist.get_rank() == 0:
        print("DEFECT SHOWN: stage 1's params are dropped" if shown else "DEFECT ABSENT: every element counted once")
    dist.destroy_process_group()
    sys.exit(1 if shown else 0)


if __name__ == "__main__":
    main()
