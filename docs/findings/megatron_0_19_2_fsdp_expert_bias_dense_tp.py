#!/usr/bin/env python3
"""Standalone reproducer: Megatron-FSDP in megatron-core 0.19.2 does not copy `allreduce` onto the
optimizer's DTensor params, so the gradient norm's duplicate filter treats expert params as dense
and keeps a replicated expert bias only on dense TP rank 0: with TP > 1 (expert biases force ETP 1)
the expert FC2 biases held by dense TP ranks > 0 are left out of the norm
(docs/findings/megatron-core-0.19.2-fsdp-expert-bias-dense-tp.md).

Needs only torch, megatron-core (with numpy and packaging, its requirements) and einops
(Megatron-FSDP imports it). World 4, on 4 GPUs or on one GPU with --backend gloo (every rank then
uses cuda:0):

    python3 -m torch.distributed.run --standalone --nproc-per-node 4 \\
        megatron_0_19_2_fsdp_expert_bias_dense_tp.py [--tp 2] [--ep 2] \\
        [--strategy optim_grads_params|optim_grads|optim] [--fixed | --ddp] [--backend gloo]

A GPT of 2 MoE layers (4 experts, hidden 16, linear biases) in bf16, TP and EP from the flags,
ETP 1, wrapped in Megatron-FSDP with the given sharding strategy (not no_shard: with EP > 1 it
has a miscount of its own, megatron-core-0.19.2-fsdp-no-shard-drops-other-ep-experts.md). --ddp: Megatron's
DistributedDataParallel and non-FSDP optimizer instead. --fixed: copy `allreduce` from each
module param onto its optimizer param (what the suggested fix does) before the norm. The script
writes the gradients itself, with no forward or backward: 1 on the routed experts' FC2 biases, 0
everywhere else, so the squared norm must be the number of expert FC2 bias elements, 2 layers x
4 experts x 16 = 128. Rank 0 prints `DEFECT SHOWN` (every rank exits 1) when it is not, else
`DEFECT ABSENT` (exit 0); within 1e-5 relative.
"""

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist

EXPERTS = 4


def is_expert_fc2_bias(name):
    return ".experts." in name and name.endswith("linear_fc2.bias")


def build(args):
    """(model, optimizer, expert FC2 bias elements of all EP ranks)."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    # megatron-core refuses linear biases in MoE unless ETP is 1 (transformer_config.py:2279-2282).
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, expert_model_parallel_size=args.ep,
                                 expert_tensor_parallel_size=1)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=4, add_bias_linear=True,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=args.tp, expert_model_parallel_size=args.ep, expert_tensor_parallel_size=1,
        num_moe_experts=EXPERTS, moe_ffn_hidden_size=32, moe_router_topk=2, moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=False, sequence_parallel=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
    )
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    gpt = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=64, max_sequence_length=32,
                   share_embeddings_and_output_weights=True)
    # The FC2 bias is replicated over TP (it is added after the row-parallel reduction); each EP rank
    # holds EXPERTS / EP experts' biases, so all EP ranks together hold EP times this rank's.
    biases = args.ep * sum(p.numel() for name, p in gpt.named_parameters() if is_expert_fc2_bias(name))
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
        OptimizerConfig(optimizer="adam", bf16=True, lr=0.0, weight_decay=0.0,
                        use_distributed_optimizer=not args.ddp),
        [model],
    )
    if args.fixed:
        # The optimizer's params are these DTensor params (`module.` + the GPT name); the norm
        # filter reads `allreduce` from them when it runs, so setting it now is what the fix does.
        for _, dist_param in model.param_and_grad_buffer.optimizer_named_parameters:
            if hasattr(dist_param.orig_param, "allreduce"):
                dist_param.allreduce = dist_param.orig_param.allreduce
    return model, optimizer, biases


@torch.no_grad()
def set_gradients(model, args):
    """1 on every expert FC2 bias element this rank holds, 0 on the others, where the optimizer reads
    them; returns the `allreduce` values the FSDP optimizer params of those biases carry."""
    if args.ddp:
        for name, param in model.named_parameters():
            if getattr(param, "main_grad", None) is None:
                param.main_grad = torch.zeros(param.shape, dtype=torch.float32, device=param.device)
            param.main_grad.fill_(1.0 if is_expert_fc2_bias(name) else 0.0)
        return set()
    # Megatron-FSDP: each optimizer param's gradient is this rank's slice of the gradient buffer,
    # attached as .grad by update_main_grads().
    pgb = model.param_and_grad_buffer
    marks = set()
    for name, dist_param in pgb.optimizer_named_parameters:
        orig = dist_param.orig_param
        buffer = pgb.parameter_groups[pgb.param_to_param_group[orig]].main_grad_buffer
        view = buffer.get_item(buffer.param_idx[orig], only_shard=True)
        view.fill_(1.0 if is_expert_fc2_bias(name) else 0.0)
        if is_expert_fc2_bias(name):
            marks.add(f"{getattr(orig, 'allreduce', 'missing')} -> {getattr(dist_param, 'allreduce', 'missing')}")
    pgb.update_main_grads()
    return marks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2, choices=[1, 2, 4])
    parser.add_argument("--ep", type=int, default=2, choices=[1, 2, 4])
    parser.add_argument("--strategy", default="optim_grads_params",
                        choices=["optim_grads_params", "optim_grads", "optim"])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fixed", action="store_true", help="copy allreduce onto the optimizer's params first")
    group.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead of Megatron-FSDP")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                        help="gloo lets several ranks share one GPU")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    from megatron.core import parallel_state as ps

    model, optimizer, biases = build(args)
    marks = set_gradients(model, args)
    optimizer.prepare_grads()
    norm = float(optimizer.get_grad_norm())
    expected = math.sqrt(biases)
    ok = abs(norm - expected) <= 1e-5 * expected
    path = "DistributedDataParallel" if args.ddp else f"Megatron-FSDP {args.strategy}{' + fix' if args.fixed else ''}"
    marked = ", ".join(sorted(marks))
    where = "" if args.ddp else f"; allreduce on its expert FC2 biases, module -> optimizer param: {marked}"
    print(f"rank {dist.get_rank()} (dense TP rank {ps.get_tensor_model_parallel_rank()}, expert TP rank "
          f"{ps.get_expert_tensor_parallel_rank()}): TP {args.tp}, EP {args.ep}, ETP 1, {path}: grad norm {norm!r}; "
          f"every expert FC2 bias counted once gives {expected!r}: {'ok' if ok else 'MISCOUNTED'}{where}", flush=True)
    dist.barrier()
    if dist.get_rank() == 0:
        print("DEFECT ABSENT: every expert FC2 bias counted once" if ok else
              f"DEFECT SHOWN: {norm * norm:.4f} of the {biases} squared expert FC2 bias elements counted", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
