#!/usr/bin/env python3
"""Standalone reproducer: with hybrid Megatron-FSDP (num_distributed_optimizer_instances > 1) and
without --overlap-grad-reduce, megatron-core 0.19.2 never reduces the gradients across the optimizer
instances (the outer data-parallel group): each instance steps with the sum of its own ranks'
gradients only (docs/findings/megatron-core-0.19.2-hybrid-fsdp-outer-dp-not-reduced.md).

Needs torch, megatron-core (with numpy and packaging, its requirements) and einops (Megatron-FSDP
builds its device mesh with it). World 4, 2 instances of DP 2, on one GPU per rank or on one GPU with
--backend gloo (all ranks share it):

    torchrun --standalone --nproc-per-node 4 megatron_0_19_2_hybrid_fsdp_outer_dp_not_reduced.py \\
        [--strategy no_shard|optim|optim_grads|optim_grads_params] [--overlap-grad-reduce] [--backend gloo]

One training step as Megatron-LM's forward_backward_no_pipelining and finalize_model_grads run it: a
dense GPT of 2 layers (hidden 16, PP 1, TP 1) in Megatron-FSDP's FullyShardedDataParallel over the
distributed optimizer, outer_dp_sharding_strategy 'no_shard' (HSDP), every rank its own batch, one
microbatch, a real forward and backward, then finalize_model_grads. Megatron-LM's training enters
each model chunk's no_sync() around the microbatches only with --overlap-grad-reduce
(megatron/training/training.py:3532-3539 at core_v0.19.0); --overlap-grad-reduce here does the same,
and sets the DistributedDataParallelConfig's flag as Megatron-LM's does from its argument.
After the step, the two instances must hold the same reduced gradient (the mean over all four
ranks), so their gradient norms (each reduced over its own instance) must be equal. Rank 0 prints
each rank's norm, then `DEFECT SHOWN` (every rank exits 1) or `DEFECT ABSENT` (exit 0).
On gloo the fused PREMUL_SUM division is turned off (--no-gradient-reduce-div-fusion: gloo lacks
it; the division is the same), and the collectives of Megatron-FSDP's coalesced blocks run one at a
time as they are issued (gloo has no coalesced all-reduce of CUDA tensors; the same collectives).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

INSTANCES = 2


def collectives_one_at_a_time():
    """gloo: Megatron-FSDP's `with _coalescing_manager(group):` blocks as plain blocks, so each
    collective in them runs when it is issued."""
    import contextlib

    from megatron.core.distributed.fsdp.src.megatron_fsdp import param_and_grad_buffer

    class Done:
        def wait(self):
            pass

    param_and_grad_buffer._coalescing_manager = lambda *args, **kwargs: contextlib.nullcontext(Done())


def build(strategy, backend, overlap_grad_reduce):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(num_distributed_optimizer_instances=INSTANCES)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=4, add_bias_linear=True, bf16=True,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, sequence_parallel=False,
        bias_dropout_fusion=False, gradient_accumulation_fusion=False,
    )
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    gpt = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=64, max_sequence_length=32)
    gpt.cuda(torch.cuda.current_device())
    ddp = DistributedDataParallelConfig(
        use_megatron_fsdp=True, use_distributed_optimizer=True, data_parallel_sharding_strategy=strategy,
        num_distributed_optimizer_instances=INSTANCES, outer_dp_sharding_strategy="no_shard",
        megatron_fsdp_main_grads_dtype=torch.float32, gradient_reduce_div_fusion=backend != "gloo",
        overlap_grad_reduce=overlap_grad_reduce,  # Megatron-LM: DistributedDataParallelConfig from args
    )
    model = FullyShardedDataParallel(config=config, ddp_config=ddp, module=Float16Module(config, gpt))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=0.0, weight_decay=0.0, bf16=True, use_distributed_optimizer=True),
        [model],
    )
    return model, optimizer


def train_step_gradients(model, overlap_grad_reduce):
    """One microbatch of this rank's own tokens, as Megatron-LM's schedule runs it."""
    import contextlib

    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    model.zero_grad_buffer()
    generator = torch.Generator().manual_seed(100 + dist.get_rank())
    tokens = torch.randint(0, 64, (2, 8), generator=generator).cuda()
    labels = torch.randint(0, 64, (2, 8), generator=generator).cuda()
    positions = torch.arange(8).unsqueeze(0).expand(2, -1).cuda()
    # forward_backward_no_pipelining: `with no_sync_func(): <all but the last microbatch>`, then the
    # last one; no_sync_func is the chunk's no_sync only with --overlap-grad-reduce.
    with model.no_sync() if overlap_grad_reduce else contextlib.nullcontext():
        pass
    loss = model(tokens, positions, None, labels=labels).float().mean()
    loss.backward()
    finalize_model_grads([model])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="optim_grads_params",
                        choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    parser.add_argument("--overlap-grad-reduce", action="store_true",
                        help="as Megatron-LM with --overlap-grad-reduce: the DDP config's flag, and each chunk's "
                        "no_sync around the microbatches")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl", help="gloo lets ranks share one GPU")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    if dist.get_world_size() != 4:
        sys.exit("run with 4 ranks: 2 optimizer instances of DP 2")
    if args.backend == "gloo":
        collectives_one_at_a_time()

    model, optimizer = build(args.strategy, args.backend, args.overlap_grad_reduce)
    train_step_gradients(model, args.overlap_grad_reduce)
    optimizer.prepare_grads()
    norm = float(optimizer.get_grad_norm())
    norms = [None] * dist.get_world_size()
    dist.all_gather_object(norms, norm)
    # Ranks 0, 1 are one instance, 2, 3 the other; each norm is over its own instance.
    ok = abs(norms[0] - norms[2]) <= 1e-4 * max(norms[0], norms[2])
    if dist.get_rank() == 0:
        print(f"world 4, 2 optimizer instances of DP 2 (HSDP), {args.strategy}, "
              f"{'with' if args.overlap_grad_reduce else 'without'} --overlap-grad-reduce: gradient norm per rank "
              + ", ".join(f"{n:.6f}" for n in norms))
        if ok:
            print("DEFECT ABSENT: both instances hold the gradient reduced over all four ranks")
        else:
            print("DEFECT SHOWN: the instances hold different gradients: each has only its own ranks' sum "
                  "(the outer data-parallel all-reduce did not run)", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
