#!/usr/bin/env python3
"""Standalone reproducer: megatron-core 0.19.2 treats experts with EP 1 and ETP = TP as dense, so
their gradients are reduced, and their norm summed, over the dense groups. With CP ordered before
TP those are other ranks than the expert groups that shard the experts
(docs/findings/megatron-core-0.19.2-experts-as-dense-cp-before-tp.md).

Needs only torch and megatron-core (with numpy and packaging, its requirements). World 4, on 4 GPUs
or on one GPU with --backend gloo:

    python3 -m torch.distributed.run --standalone --nproc-per-node 4 \\
        megatron_0_19_2_experts_as_dense_cp_before_tp.py [--order cp-tp-ep-dp-pp|tp-cp-ep-dp-pp] \\
        [--optimizer adam|distributed] [--backend gloo]

TP 2, CP 2, EP 1, ETP 2; the model config says CP 2, as the parallel state does. One transformer
layer of 2 experts (hidden 8, expert FFN 16, no linear biases) and no attention: the local spec's
attention refuses CP > 1 (it needs Transformer Engine's), and attention holds no expert param.

Two checks, each on Megatron's own code:
1. The gradient norm. Every gradient is 0 but the expert weights'; an element of expert-TP shard
   s has gradient s + 1, so the norm must be sqrt(2 experts x 2 weights x 64 elements x (1 + 4)) =
   sqrt(1280).
2. DDP's gradient reduction. The script prints the group over which DDP's bucket holding the expert
   weights is reduced; it must be the rank's expert data-parallel group (the ranks that hold the same
   shard). With NCCL (or on CPUs) it also runs the reduction: each rank sets its expert weights' local
   gradient to (its global rank + 1) and runs DDP's grad sync as an all-reduce; the right result is
   the mean over the expert DP group, 2 on ranks 0 and 2, 3 on ranks 1 and 3. (Megatron coalesces a
   bucket group's all-reduces, which gloo runs on CPU tensors only, so one GPU shows the group only.)

Each rank prints its results. Rank 0 prints `DEFECT SHOWN` (and every rank exits 1) when either
check is wrong, else `DEFECT ABSENT` (exit 0).
"""

import argparse
import dataclasses
import math
import os
import sys

import torch
import torch.distributed as dist

EXPERTS, HIDDEN, FFN, TP, CP = 2, 8, 16, 2, 2


def build_model(order, distributed):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(
        tensor_model_parallel_size=TP, context_parallel_size=CP, expert_model_parallel_size=1,
        expert_tensor_parallel_size=TP, order=order,
    )
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=2, ffn_hidden_size=FFN,
        num_moe_experts=EXPERTS, moe_ffn_hidden_size=FFN, moe_router_topk=2,
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False, add_bias_linear=False,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=TP, context_parallel_size=CP, expert_model_parallel_size=1,
        expert_tensor_parallel_size=TP, sequence_parallel=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
    )
    spec = get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False)
    spec.submodules = dataclasses.replace(
        spec.submodules, input_layernorm=IdentityOp, self_attention=IdentityOp, self_attn_bda=IdentityFuncOp)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=32, max_sequence_length=8)
    model.cuda(torch.cuda.current_device())
    model = Float16Module(config, model)
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=distributed, overlap_grad_reduce=False)
    return DistributedDataParallel(config=config, ddp_config=ddp, module=model)


def set_grads(model, value_of):
    for name, param in model.named_parameters():
        value = value_of(name)
        if getattr(param, "main_grad", None) is None:
            param.main_grad = torch.zeros(param.shape, dtype=torch.float32, device=param.device)
        with torch.no_grad():
            param.main_grad.fill_(value)


def is_expert_weight(name):
    return ".experts." in name and name.endswith(".weight")


def main():
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--order", default="cp-tp-ep-dp-pp")
    parser.add_argument("--optimizer", choices=["adam", "distributed"], default="adam")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                        help="gloo lets several ranks share one GPU")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    distributed = args.optimizer == "distributed"
    model = build_model(args.order, distributed)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=0.0, weight_decay=0.0, bf16=True,
                        use_distributed_optimizer=distributed, log_num_zeros_in_grad=True, clip_grad=0.0),
        [model],
    )
    tp_group = dist.get_process_group_ranks(ps.get_tensor_model_parallel_group())
    etp_group = dist.get_process_group_ranks(ps.get_expert_tensor_parallel_group())
    edp_group = dist.get_process_group_ranks(ps.get_expert_data_parallel_group())

    # 1. The gradient norm.
    shard = ps.get_expert_tensor_parallel_rank()  # which half of each expert weight this rank holds
    set_grads(model, lambda name: float(shard + 1) if is_expert_weight(name) else 0.0)
    optimizer.prepare_grads()
    norm = float(optimizer.get_grad_norm())
    shard_elements = 2 * HIDDEN * FFN // TP  # of one expert's two weights
    expected = math.sqrt(EXPERTS * shard_elements * sum((s + 1) ** 2 for s in range(TP)))
    norm_ok = abs(norm - expected) <= 1e-5 * expected

    # 2. DDP's reduction of the expert weights' gradients: the group of the bucket that holds them
    # (Megatron's own DDP objects), and, where it can run, the reduction itself.
    experts = {p for n, p in model.named_parameters() if is_expert_weight(n)}
    groups = set()
    for bucket_group in model.bucket_groups + model.expert_parallel_bucket_groups:
        if experts & bucket_group.params:
            group = (bucket_group.intra_distributed_optimizer_instance_group if distributed
                     else bucket_group.data_parallel_group)
            groups.add(tuple(dist.get_process_group_ranks(group)))
    sync_group = sorted(groups)
    sync_ok = sync_group == [tuple(edp_group)]
    reduced, right = None, sum(r + 1 for r in edp_group) / len(edp_group)
    # Megatron coalesces a bucket group's all-reduces, which gloo runs on CPU tensors only.
    if args.backend == "nccl" or next(iter(experts)).device.type == "cpu":
        set_grads(model, lambda name: float(rank + 1) if is_expert_weight(name) else 0.0)
        model.finish_grad_sync(force_all_reduce=True)  # an all-reduce with the distributed optimizer too
        reduced = sorted({float(p.main_grad.float().mean()) for p in experts})
        sync_ok = sync_ok and reduced == [right]
    print(f"rank {rank} (TP group {tp_group}, expert TP group {etp_group}): order {args.order}, {args.optimizer}: "
          f"grad norm {norm!r}, every expert weight counted once gives {expected!r}: "
          f"{'ok' if norm_ok else 'MISCOUNTED'}", flush=True)
    print(f"rank {rank}: DDP reduces the expert weights over {[list(g) for g in sync_group]}, their expert DP "
          f"group is {edp_group}", flush=True)
    print(f"rank {rank}: " + ("DDP's reduction not run (gloo and GPU tensors)" if reduced is None else
                              f"expert gradients after DDP's reduction {reduced}, the mean over the expert DP "
                              f"group gives {right}"), flush=True)
    verdicts = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, (norm_ok, sync_ok))
    shown = not all(n and s for n, s in verdicts)
    if rank == 0:
        wrong = [what for what, bad in (("the gradient norm", not all(n for n, _ in verdicts)),
                                        ("DDP's gradient reduction", not all(s for _, s in verdicts))) if bad]
        print(f"DEFECT SHOWN: {' and '.join(wrong)} use the dense groups for the experts" if shown else
              "DEFECT ABSENT: the norm counts every expert weight once and DDP averages each over its "
              "expert DP group", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if shown else 0)


if __name__ == "__main__":
    main()
