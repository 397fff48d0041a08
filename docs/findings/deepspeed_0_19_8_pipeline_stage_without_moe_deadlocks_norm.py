"""DeepSpeed 0.19.8: in a pipeline where a stage holds no MoE layer, the gradient norm deadlocks
(docs/findings/deepspeed-0.19.8-pipeline-stage-without-moe-deadlocks-norm.md).

    torchrun --standalone --nproc-per-node 2 deepspeed_0_19_8_pipeline_stage_without_moe_deadlocks_norm.py \
        [zero_stage] [--timeout 60] [--moe-on-every-stage]

Two ranks, two pipeline stages (TP 1, DP 1), DeepSpeed's own PipelineModule and train_batch, the
optimizer's params split into dense and MoE groups as DeepSpeed's MoE documentation says
(split_params_into_different_moe_groups_for_optimizer). Stage 0 holds a deepspeed.moe.layer.MoE with
one expert, stage 1 a dense layer only (as with MoE every other layer and a stage of one layer).
bf16, ZeRO stage 1 by default (0 takes BF16_Optimizer in a pipeline). Each rank arms a watchdog for
the step: after --timeout seconds (60) it prints where every thread waits, then `DEFECT SHOWN`, and
exits 1. A step that finishes prints `DEFECT ABSENT` (exit 0). --moe-on-every-stage gives stage 1 a
MoE layer too (the control: every rank then has the same param groups). Runs on one GPU per rank, else on CPUs
(DS_ACCELERATOR=cpu).
"""
import argparse
import faulthandler
import os
import threading

import torch
import torch.distributed as dist

# One GPU per rank (NCCL), else CPUs: gloo cannot send GPU tensors between pipeline stages.
ON_GPUS = torch.cuda.device_count() >= int(os.environ.get("WORLD_SIZE", "1"))
if not ON_GPUS:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: E402
from deepspeed.pipe import LayerSpec, PipelineModule  # noqa: E402

HIDDEN = 4


class MoEStage(torch.nn.Module):
    """A MoE layer whose output is added to the activation, so its expert and gate get gradients."""

    def __init__(self):
        super().__init__()
        self.moe = MoE(HIDDEN, torch.nn.Linear(HIDDEN, HIDDEN), num_experts=1, ep_size=1, k=1)

    def forward(self, x):
        out, _, _ = self.moe(x)
        return x + out


class DenseStage(torch.nn.Linear):
    def __init__(self):
        super().__init__(HIDDEN, HIDDEN)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("zero_stage", nargs="?", type=int, default=1, choices=[0, 1])
    p.add_argument("--timeout", type=float, default=60.0, help="seconds the step may take")
    p.add_argument("--moe-on-every-stage", action="store_true", help="stage 1 holds a MoE layer too")
    args = p.parse_args()
    zero_stage = args.zero_stage
    if ON_GPUS:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    backend = "nccl" if ON_GPUS else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend)
    torch.manual_seed(1234)
    second = MoEStage if args.moe_on_every_stage else DenseStage
    model = PipelineModule(layers=[LayerSpec(MoEStage), LayerSpec(second)], num_stages=2,
                           partition_method="uniform", loss_fn=lambda out, _: out.float().sum())
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "all"})
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(groups, lr=0.0),
        config={"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
                "bf16": {"enabled": True}, "zero_optimization": {"stage": zero_stage},
                "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30})
    stage = engine.grid.get_stage_id()
    print(f"rank {dist.get_rank()} (stage {stage}): {type(engine.optimizer).__name__}, "
          f"{len(engine.optimizer.optimizer.param_groups)} param groups", flush=True)
    rank = dist.get_rank()

    def deadlocked():
        faulthandler.dump_traceback(all_threads=True)
        print(f"DEFECT SHOWN: rank {rank} (stage {stage}) still waits after {args.timeout:g} s: the step deadlocked",
              flush=True)
        os._exit(1)

    watchdog = threading.Timer(args.timeout, deadlocked)
    watchdog.daemon = True
    watchdog.start()
    x = torch.ones(8, HIDDEN, dtype=torch.bfloat16, device=next(engine.module.parameters()).device)
    engine.train_batch(data_iter=iter([(x, x)]))
    dist.barrier()
    watchdog.cancel()
    print(f"rank {rank}: step done, norm {engine.get_global_grad_norm()}", flush=True)
    if rank == 0:
        print("DEFECT ABSENT: every stage finished the step", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
