#!/usr/bin/env python3
"""Standalone reproducer: with Megatron-FSDP's `no_shard` strategy and expert parallelism,
megatron-core 0.19.2 reduces the gradient norm over the model-parallel group (TP x PP), which has
no EP axis, so each rank's norm leaves out the experts of the other EP ranks
(docs/findings/megatron-core-0.19.2-fsdp-no-shard-drops-other-ep-experts.md).

Needs torch, megatron-core (with numpy and packaging, its requirements) and einops (Megatron-FSDP
builds its device mesh with it). World 4, on 4 GPUs or on one GPU with --backend gloo (all ranks
share it):

    torchrun --standalone --nproc-per-node 4 megatron_0_19_2_fsdp_no_shard_drops_other_ep_experts.py \\
        [--strategy no_shard|optim|optim_grads|optim_grads_params] [--tp 1] [--ep 2] [--backend gloo]

A GPT of 2 MoE layers (4 experts, hidden 16, linear biases), TP from --tp, EP from --ep, ETP 1,
PP 1, wrapped in Megatron-FSDP's FullyShardedDataParallel, with the distributed optimizer. The
gradients are written straight into Megatron-FSDP's gradient buffer (no backward, and no
finish_grad_sync: gloo has no reduce_scatter), in two passes:
1. every element 1, so the squared norm is the number of elements counted; counting each logical
   element once gives the dense elements (a TP-sharded one TP times its local size) plus the experts
   of every EP rank (whole on each rank at ETP 1);
2. dense elements 1, expert elements EP rank + 1: the EP ranks now hold different expert gradients,
   and the norm must still be the same number on every rank.
Rank 0 prints each rank's squared norms, then `DEFECT SHOWN` (every rank exits 1) or
`DEFECT ABSENT` (exit 0); within 1e-6 relative.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

EXPERTS = 4


def build(strategy, tp, ep):
    """The model wrapped in Megatron-FSDP, its optimizer, and its dense and local expert elements."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                 expert_tensor_parallel_size=1)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=4, add_bias_linear=True, bf16=True,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, tensor_model_parallel_size=tp,
        sequence_parallel=False, expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1, num_moe_experts=EXPERTS, moe_ffn_hidden_size=32, moe_router_topk=2,
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
    )
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    gpt = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=64, max_sequence_length=32)
    gpt.cuda(torch.cuda.current_device())
    # Expert params carry allreduce=False (EP > 1 or ETP != TP); each EP rank holds other experts of
    # the same shapes, whole at ETP 1. A TP-sharded dense param holds 1/TP of its elements here.
    dense = sum(p.numel() * (tp if getattr(p, "tensor_model_parallel", False) else 1)
                for p in gpt.parameters() if getattr(p, "allreduce", True))
    expert = sum(p.numel() for p in gpt.parameters() if not getattr(p, "allreduce", True))
    ddp = DistributedDataParallelConfig(
        use_megatron_fsdp=True, use_distributed_optimizer=True, data_parallel_sharding_strategy=strategy,
        megatron_fsdp_main_grads_dtype=torch.float32,  # an fp32 gradient buffer, so the sums are exact
    )
    model = FullyShardedDataParallel(config=config, ddp_config=ddp, module=Float16Module(config, gpt))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=0.0, weight_decay=0.0, bf16=True, use_distributed_optimizer=True),
        [model],
    )
    return model, optimizer, dense, expert


def set_gradients(model, strategy, expert_value):
    """Writes 1 into the dense and expert_value into the expert gradient elements this rank holds in
    Megatron-FSDP's gradient buffer, then attaches the buffer to the optimizer's params as .grad."""
    buffers = model.param_and_grad_buffer
    for _, dist_param in buffers.optimizer_named_parameters:
        param = dist_param.orig_param  # the module's own param, with Megatron's attributes
        grads = buffers.parameter_groups[buffers.param_to_param_group[param]].main_grad_buffer
        # no_shard holds the whole gradient on every rank; the other strategies this rank's shard of it.
        view = grads.get_item(grads.param_idx[param], only_shard=strategy != "no_shard")
        view.fill_(1.0 if getattr(param, "allreduce", True) else expert_value)
    buffers.update_main_grads()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=["no_shard", "optim", "optim_grads", "optim_grads_params"],
                        default="no_shard", help="data_parallel_sharding_strategy")
    parser.add_argument("--tp", type=int, default=1, choices=[1, 2, 4])
    parser.add_argument("--ep", type=int, default=2)
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                        help="gloo lets several ranks share one GPU")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    from megatron.core import parallel_state as ps

    model, optimizer, dense, expert = build(args.strategy, args.tp, args.ep)
    ep_rank = ps.get_expert_model_parallel_rank()
    squares = []
    for expert_value in (1.0, ep_rank + 1.0):
        set_gradients(model, args.strategy, expert_value)
        optimizer.prepare_grads()
        squares.append(float(optimizer.get_grad_norm()) ** 2)
    stats_ranks = dist.get_process_group_ranks(optimizer.get_grad_stats_parallel_group())
    results = [None] * dist.get_world_size()
    dist.all_gather_object(results, (ep_rank, stats_ranks, squares))

    # Every logical element once: the dense ones once, and the experts of each EP rank once.
    truth = [dense + expert * args.ep, dense + expert * sum((r + 1) ** 2 for r in range(args.ep))]
    close = [[abs(s - t) <= 1e-6 * t for s, t in zip(r[2], truth)] for r in results]
    ok = all(all(c) for c in close)
    if dist.get_rank() == 0:
        print(f"world {dist.get_world_size()}, TP {args.tp}, EP {args.ep}, {EXPERTS} experts, {args.strategy}: "
              f"counting every element once gives {truth[0]} (all gradients 1) and {truth[1]} (experts EP rank + 1)")
        for rank, ((r_ep, r_stats, r_squares), r_close) in enumerate(zip(results, close)):
            print(f"rank {rank} (EP rank {r_ep}, grad-stats group {r_stats}): squared norms "
                  f"{r_squares[0]:.1f} and {r_squares[1]:.1f}: {'ok' if all(r_close) else 'MISCOUNTED'}")
        if ok:
            print("DEFECT ABSENT: every rank counts every element once")
        else:
            first = sorted({f"{r[2][0]:.1f}" for r in results}, key=float)
            second = sorted({f"{r[2][1]:.1f}" for r in results}, key=float)
            print(f"DEFECT SHOWN: ranks count {' or '.join(first)} of the {truth[0]} elements, and with the "
                  f"experts' gradients EP rank + 1 report {', '.join(second)} where {truth[1]} is right", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
