#!/usr/bin/env python3
"""Standalone reproducer: under Megatron-FSDP, megatron-core 0.19.2's zero count (`count_zeros`,
logged as num-zeros) counts every parameter that tensor parallelism replicates (layernorms,
row-parallel biases, position embeddings) once per TP rank, while the gradient norm of the same
parameters counts each once (docs/findings/megatron-core-0.19.2-fsdp-zero-count-tp-duplicates.md).

Needs only torch, megatron-core (with numpy and packaging, its requirements) and einops
(Megatron-FSDP imports it). World 4, on 4 GPUs or on one GPU with --backend gloo (every rank then
uses cuda:0):

    python3 -m torch.distributed.run --standalone --nproc-per-node 4 \\
        megatron_0_19_2_fsdp_zero_count_tp_duplicates.py [--tp 2] \\
        [--strategy optim_grads_params|optim_grads|optim|no_shard] [--ddp] [--backend gloo]

A GPT of 2 layers (hidden 16, vocab 64, linear biases, learned position embeddings, tied
embeddings) in bf16, TP from --tp, DP = 4 / TP, wrapped in Megatron-FSDP with the given sharding
strategy (--ddp: Megatron's DistributedDataParallel and non-FSDP optimizer instead). The script
writes the gradients itself, with no forward or backward: first every held gradient element is 1,
so the squared norm must be the model's element count; then every element is 0, so the zero count
must be that count too. Rank 0 prints `DEFECT SHOWN` (every rank exits 1) when the zero count is
not, else `DEFECT ABSENT` (exit 0).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist


def build(args):
    """(model, optimizer, logical element count, TP-replicated element count)."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=4, add_bias_linear=True,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=args.tp, sequence_parallel=False,
        bias_dropout_fusion=False, gradient_accumulation_fusion=False,
    )
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    gpt = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=64, max_sequence_length=32,
                   share_embeddings_and_output_weights=True)
    # Count before wrapping (Megatron-FSDP replaces the params): a TP-sharded param holds 1/TP of
    # its elements here, a replicated one all of them.
    sharded = sum(p.numel() for p in gpt.parameters() if getattr(p, "tensor_model_parallel", False))
    replicated = sum(p.numel() for p in gpt.parameters() if not getattr(p, "tensor_model_parallel", False))
    elements = sharded * args.tp + replicated
    gpt.cuda(torch.cuda.current_device())
    module = Float16Module(config, gpt)
    if args.ddp:
        ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=False, overlap_grad_reduce=False)
        model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=module)
    else:
        # fp32 gradient buffer, so the values written below are exact.
        ddp_config = DistributedDataParallelConfig(
            use_megatron_fsdp=True, use_distributed_optimizer=True,
            data_parallel_sharding_strategy=args.strategy, megatron_fsdp_main_grads_dtype=torch.float32,
        )
        model = FullyShardedDataParallel(config=config, ddp_config=ddp_config, module=module)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", bf16=True, lr=0.0, weight_decay=0.0, log_num_zeros_in_grad=True,
                        use_distributed_optimizer=not args.ddp),
        [model],
    )
    return model, optimizer, elements, replicated


@torch.no_grad()
def set_gradients(model, args, value):
    """Every gradient element this rank holds := value, where the optimizer reads it."""
    if args.ddp:
        for param in model.parameters():
            if getattr(param, "main_grad", None) is None:
                param.main_grad = torch.zeros(param.shape, dtype=torch.float32, device=param.device)
            param.main_grad.fill_(value)
        return
    # Megatron-FSDP: each optimizer param's gradient is this rank's slice of the gradient buffer
    # (the whole param for no_shard), attached as .grad by update_main_grads().
    pgb = model.param_and_grad_buffer
    for _, dist_param in pgb.optimizer_named_parameters:
        orig = dist_param.orig_param
        buffer = pgb.parameter_groups[pgb.param_to_param_group[orig]].main_grad_buffer
        buffer.get_item(buffer.param_idx[orig], only_shard=args.strategy != "no_shard").fill_(value)
    pgb.update_main_grads()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2, choices=[1, 2, 4])
    parser.add_argument("--strategy", default="optim_grads_params",
                        choices=["optim_grads_params", "optim_grads", "optim", "no_shard"])
    parser.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead of Megatron-FSDP")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                        help="gloo lets several ranks share one GPU")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    model, optimizer, elements, replicated = build(args)

    set_gradients(model, args, 1.0)
    optimizer.prepare_grads()
    norm_sq = float(optimizer.get_grad_norm()) ** 2
    set_gradients(model, args, 0.0)
    optimizer.prepare_grads()
    zeros = int(optimizer.count_zeros())

    norm_ok = abs(norm_sq - elements) <= 1e-5 * elements
    ok = zeros == elements
    path = "DistributedDataParallel" if args.ddp else f"Megatron-FSDP {args.strategy}"
    print(f"rank {dist.get_rank()}: TP {args.tp}, DP {dist.get_world_size() // args.tp}, {path}: "
          f"every gradient 1 gives norm^2 {norm_sq:.1f} ({'ok' if norm_ok else 'MISCOUNTED'}), every gradient 0 "
          f"gives num-zeros {zeros}; the model has {elements} elements: num-zeros {'ok' if ok else 'MISCOUNTED'}",
          flush=True)
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"DEFECT ABSENT: num-zeros counts each of the {elements} elements once" if ok else
              f"DEFECT SHOWN: num-zeros {zeros} for {elements} elements ({zeros - elements:+d}; "
              f"{replicated} of them are replicated over TP {args.tp})", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
