#!/usr/bin/env python3
"""Standalone reproducer: megatron-core 0.19.2 reduces the gradient norm of experts "treated as
dense" (EP 1, ETP = TP) over the dense TP group, which differs from the expert TP group that
shards them when CP is ordered before TP
(docs/findings/megatron-core-0.19.2-experts-as-dense-cp-before-tp.md).

Needs only torch and megatron-core. World 4, either on 4 GPUs or on one GPU with --backend gloo:

    python3 -m torch.distributed.run --standalone --nproc-per-node 4 \\
        megatron_0_19_2_experts_as_dense_cp_before_tp.py [--order cp-tp-ep-dp-pp|tp-cp-ep-dp-pp] \\
        [--optimizer adam|distributed] [--backend gloo]

TP 2, CP 2, EP 1, ETP 2. One MoE layer of 2 experts, no linear biases, hidden 8, expert FFN 16.
Every gradient is 0 except the expert weights. An element of expert-TP shard s has gradient s + 1,
so the two shards differ (ones everywhere would hide a shard counted twice and its twin counted
not at all). The norm must be sqrt(2 experts x 2 weights x 64 elements x (1 + 4)) = sqrt(1280).
The script prints the norm each rank reports and exits 1 when it is not that (within 1e-5
relative). The model config says CP 1 because the local spec's attention refuses CP. No forward
pass runs, and CP changes no parameter. The parallel state, DDP and the optimizer see CP 2.
"""

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist

EXPERTS, HIDDEN, FFN, TP = 2, 8, 16, 2


def build_model(order, distributed):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(
        tensor_model_parallel_size=TP, context_parallel_size=2, expert_model_parallel_size=1,
        expert_tensor_parallel_size=TP, order=order,
    )
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=2, ffn_hidden_size=FFN,
        num_moe_experts=EXPERTS, moe_ffn_hidden_size=FFN, moe_router_topk=2,
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False, add_bias_linear=False,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=TP, expert_model_parallel_size=1, expert_tensor_parallel_size=TP,
        context_parallel_size=1, sequence_parallel=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False),
        vocab_size=32, max_sequence_length=8,
    )
    model.cuda(torch.cuda.current_device())
    model = Float16Module(config, model)
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=distributed, overlap_grad_reduce=False)
    return DistributedDataParallel(config=config, ddp_config=ddp, module=model)


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
    distributed = args.optimizer == "distributed"
    model = build_model(args.order, distributed)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=0.0, weight_decay=0.0, bf16=True,
                        use_distributed_optimizer=distributed, log_num_zeros_in_grad=True, clip_grad=0.0),
        [model],
    )
    shard = ps.get_expert_tensor_parallel_rank()  # which half of each expert weight this rank holds
    for name, param in model.named_parameters():
        value = float(shard + 1) if (".experts." in name and name.endswith(".weight")) else 0.0
        if getattr(param, "main_grad", None) is None:
            param.main_grad = torch.zeros(param.shape, dtype=torch.float32, device=param.device)
        with torch.no_grad():
            param.main_grad.fill_(value)
    optimizer.prepare_grads()
    norm = float(optimizer.get_grad_norm())
    shard_elements = 2 * HIDDEN * FFN // TP  # of one expert's two weights
    expected = math.sqrt(EXPERTS * shard_elements * sum((s + 1) ** 2 for s in range(TP)))
    ok = abs(norm - expected) <= 1e-5 * expected
    print(f"rank {dist.get_rank()} (TP group {dist.get_process_group_ranks(ps.get_tensor_model_parallel_group())}, "
          f"expert TP group {dist.get_process_group_ranks(ps.get_expert_tensor_parallel_group())}): "
          f"order {args.order}, {args.optimizer}: grad norm {norm!r}; every expert weight counted once "
          f"gives {expected!r}: {'ok' if ok else 'MISCOUNTED'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
