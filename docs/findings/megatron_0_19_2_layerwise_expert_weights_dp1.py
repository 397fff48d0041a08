#!/usr/bin/env python3
"""Standalone reproducer: megatron-core 0.19.2's layer-wise Muon optimizer counts each expert
weight once per rank of its expert data-parallel group when the dense DP x CP size is 1
(docs/findings/megatron-core-0.19.2-layerwise-expert-weights-dp1.md).

Needs only torch and megatron-core (with numpy and packaging, its requirements; plus
emerging_optimizers for Muon). World = TP x CP (DP 1), on that many GPUs or on one GPU with
--backend gloo:

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \\
        megatron_0_19_2_layerwise_expert_weights_dp1.py [--optimizer muon-layerwise|muon|adam] \\
        [--tp 2] [--cp 1] [--ep 1] [--backend gloo]

ETP 1. One transformer layer of 4 experts (hidden 8, expert FFN 16, no linear biases) and no
attention (the local spec's attention refuses CP > 1; attention holds no expert param). The model
config carries the parallel state's sizes. Every gradient is 0 except the expert weights, which
are 1: 4 experts x (16x8 + 8x16) elements, so the norm must be sqrt(1024) = 32. Each expert weight
is held whole by the TP x CP / EP ranks of its expert data-parallel group.

Rank 0 prints the norm, the factor by which the squared norm is off, and `DEFECT SHOWN` (every
rank exits 1) or `DEFECT ABSENT` (exit 0); within 1e-5 relative.
"""

import argparse
import dataclasses
import math
import os
import sys

import torch
import torch.distributed as dist

EXPERTS, HIDDEN, FFN = 4, 8, 16


def build_model(tp, cp, ep):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp, context_parallel_size=cp, expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1,
    )
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=FFN,
        num_moe_experts=EXPERTS, moe_ffn_hidden_size=FFN, moe_router_topk=2,
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False, add_bias_linear=False,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=tp, context_parallel_size=cp, expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1, sequence_parallel=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
    )
    spec = get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False)
    spec.submodules = dataclasses.replace(
        spec.submodules, input_layernorm=IdentityOp, self_attention=IdentityOp, self_attn_bda=IdentityFuncOp)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=32, max_sequence_length=8)
    model.cuda(torch.cuda.current_device())
    model = Float16Module(config, model)
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=False, overlap_grad_reduce=False)
    return DistributedDataParallel(config=config, ddp_config=ddp, module=model)


def build_optimizer(kind, model):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(optimizer="adam", lr=0.0, weight_decay=0.0, bf16=True,
                             log_num_zeros_in_grad=True, clip_grad=0.0, muon_tp_mode="duplicated")
    if kind != "adam":
        config.optimizer = "muon"
        config.use_layer_wise_distributed_optimizer = kind == "muon-layerwise"
    return get_megatron_optimizer(config, [model])


def main():
    from megatron.core import parallel_state as ps

    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", choices=["muon-layerwise", "muon", "adam"], default="muon-layerwise")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                        help="gloo lets several ranks share one GPU")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    assert dist.get_world_size() == args.tp * args.cp, "world must be TP x CP (DP 1)"
    model = build_model(args.tp, args.cp, args.ep)
    optimizer = build_optimizer(args.optimizer, model)
    # Gradients: 1 on the routed experts' weights, 0 everywhere else.
    for name, param in model.named_parameters():
        value = 1.0 if (".experts." in name and name.endswith(".weight")) else 0.0
        if getattr(param, "main_grad", None) is None:
            param.main_grad = torch.zeros(param.shape, dtype=torch.float32, device=param.device)
        with torch.no_grad():
            param.main_grad.fill_(value)
    optimizer.prepare_grads()
    norm = float(optimizer.get_grad_norm())
    expected = math.sqrt(EXPERTS * 2 * HIDDEN * FFN)
    ok = abs(norm - expected) <= 1e-5 * expected
    edp = ps.get_expert_data_parallel_world_size()
    dp_cp = ps.get_data_parallel_world_size(with_context_parallel=True)
    if dist.get_rank() == 0:
        print(f"TP {args.tp}, CP {args.cp}, EP {args.ep}, ETP 1 (DP x CP {dp_cp}, expert DP {edp}): "
              f"{type(optimizer).__name__} ({args.optimizer}) reports grad norm {norm!r}; every expert weight "
              f"counted once gives {expected!r}; squared norm x {norm * norm / (expected * expected):.4f}", flush=True)
        print("DEFECT ABSENT: every expert weight counted once" if ok else
              f"DEFECT SHOWN: every expert weight counted {norm * norm / (expected * expected):.4f} times", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
