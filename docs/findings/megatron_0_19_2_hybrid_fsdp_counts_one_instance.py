#!/usr/bin/env python3
"""Standalone reproducer: with hybrid FSDP in Megatron-FSDP (several distributed-optimizer instances and
outer_dp_sharding_strategy='optim'), megatron-core 0.19.2 shards the gradients over the whole hybrid
data-parallel group but reduces the gradient norm over one optimizer instance only, so each instance
counts only the shards its own ranks hold
(docs/findings/megatron-core-0.19.2-hybrid-fsdp-counts-one-instance.md).

Needs torch, megatron-core (with numpy and packaging, its requirements) and einops (Megatron-FSDP
builds its device mesh with it). World 4 at TP 1 (world 8 for --tp 2), on one GPU per rank or on one
GPU with --backend gloo (all ranks share it):

    torchrun --standalone --nproc-per-node 4 megatron_0_19_2_hybrid_fsdp_counts_one_instance.py \\
        [--outer optim|no_shard] [--instances 2] [--tp 1] [--backend gloo]

A dense GPT of 2 layers (hidden 16, linear biases, an untied output layer: GPTModel's default), TP
from --tp, PP 1, wrapped in Megatron-FSDP's FullyShardedDataParallel with
data_parallel_sharding_strategy 'optim_grads_params' (the only one outer 'optim' accepts) and the
distributed optimizer. Every gradient element this rank holds is set to 1, straight in
Megatron-FSDP's gradient buffer (no backward, and no finish_grad_sync: gloo has no reduce_scatter),
so the squared norm is the number of elements counted and must equal the model's element count (a
TP-sharded param counted at TP times its local size) on every rank. Rank 0 prints each rank's
squared norm, then `DEFECT SHOWN` (every rank exits 1) or `DEFECT ABSENT` (exit 0); within 1e-6
relative.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

STRATEGY = "optim_grads_params"


def build(instances, outer, tp):
    """The model wrapped in Megatron-FSDP, its optimizer, and the model's element count."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=tp, num_distributed_optimizer_instances=instances)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=4, add_bias_linear=True, bf16=True,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, tensor_model_parallel_size=tp,
        sequence_parallel=False, bias_dropout_fusion=False, gradient_accumulation_fusion=False,
    )
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    gpt = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=64, max_sequence_length=32)
    gpt.cuda(torch.cuda.current_device())
    # A TP-sharded param holds 1/TP of its elements on this rank, a replicated one all of them.
    elements = sum(p.numel() * (tp if getattr(p, "tensor_model_parallel", False) else 1) for p in gpt.parameters())
    ddp = DistributedDataParallelConfig(
        use_megatron_fsdp=True, use_distributed_optimizer=True, data_parallel_sharding_strategy=STRATEGY,
        num_distributed_optimizer_instances=instances, outer_dp_sharding_strategy=outer,
        megatron_fsdp_main_grads_dtype=torch.float32,  # an fp32 gradient buffer, so the sums are exact
    )
    model = FullyShardedDataParallel(config=config, ddp_config=ddp, module=Float16Module(config, gpt))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=0.0, weight_decay=0.0, bf16=True, use_distributed_optimizer=True),
        [model],
    )
    return model, optimizer, elements


def set_gradients_to_one(model):
    """Writes 1 into every gradient element this rank holds in Megatron-FSDP's gradient buffer, then
    attaches the buffer to the optimizer's params as .grad. Returns the group the buffer shards over."""
    buffers = model.param_and_grad_buffer
    for _, dist_param in buffers.optimizer_named_parameters:
        param = dist_param.orig_param  # the module's own param
        grads = buffers.parameter_groups[buffers.param_to_param_group[param]].main_grad_buffer
        grads.get_item(grads.param_idx[param], only_shard=True).fill_(1.0)  # this rank's shard only
    buffers.update_main_grads()
    return dist.get_process_group_ranks(grads.data_parallel_group)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--outer", choices=["optim", "no_shard"], default="optim",
                        help="outer_dp_sharding_strategy (across the optimizer instances)")
    parser.add_argument("--instances", type=int, default=2, help="num_distributed_optimizer_instances")
    parser.add_argument("--tp", type=int, default=1, choices=[1, 2], help="tensor_model_parallel_size")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                        help="gloo lets several ranks share one GPU")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(args.backend)

    # The outer strategy applies across instances only. With one instance 0.19.2 builds no hybrid
    # buffers, yet its all-gather pipeline would look for them (param_and_grad_buffer.py:4671).
    outer = args.outer if args.instances > 1 else "no_shard"
    model, optimizer, elements = build(args.instances, outer, args.tp)
    shard_ranks = set_gradients_to_one(model)
    optimizer.prepare_grads()
    square = float(optimizer.get_grad_norm()) ** 2
    stats_ranks = dist.get_process_group_ranks(optimizer.get_grad_stats_parallel_group())
    results = [None] * dist.get_world_size()
    dist.all_gather_object(results, (shard_ranks, stats_ranks, square))

    close = [abs(r[2] - elements) <= 1e-6 * elements for r in results]
    ok = all(close)
    if dist.get_rank() == 0:
        print(f"world {dist.get_world_size()}, TP {args.tp}, {args.instances} optimizer instance(s), outer {outer}, "
              f"{STRATEGY}: all gradients 1, counting every element once gives {elements}")
        for rank, ((r_shard, r_stats, r_square), r_close) in enumerate(zip(results, close)):
            print(f"rank {rank} (gradients sharded over {r_shard}, grad-stats group {r_stats}): squared norm "
                  f"{r_square:.1f}: {'ok' if r_close else 'MISCOUNTED'}")
        if ok:
            print("DEFECT ABSENT: every rank counts every element once")
        else:
            cause = ("each optimizer instance counts only its own ranks' shards" if args.tp == 1 else
                     "the grad-stats groups do not count every element once")
            print(f"DEFECT SHOWN: ranks count {', '.join(f'{r[2]:.1f}' for r in results)} of the {elements} "
                  f"elements: {cause}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
