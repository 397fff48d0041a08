#!/usr/bin/env python3
"""Standalone reproducer: megatron-core 0.19.2's layer-wise optimizer over its parameter layout (what
Megatron-LM 0.19 trains for `--optimizer muon --use-distributed-optimizer`) computes the separate
norm of the MTP params (`mtp_detach_heads`, grad_norm_group "mtp") over the model-parallel group
only, while it shards Muon's matrices over data-parallel ranks: each DP rank's MTP norm misses the
MTP matrices the other DP ranks own (docs/findings/megatron-core-0.19.2-layerwise-layout-mtp-norm.md).

Needs only torch, megatron-core (with numpy and packaging, its requirements) and emerging-optimizers
(Muon). World 4, on 4 GPUs or on one GPU with --backend gloo (every rank then uses cuda:0):

    python3 -m torch.distributed.run --standalone --nproc-per-node 4 \\
        megatron_0_19_2_layerwise_layout_mtp_norm.py [--tp 1] [--no-layout] [--backend gloo]

A GPT of 2 layers (hidden 16, vocab 64, biases, tied embeddings) with one MTP layer whose heads are
detached, in bf16, TP from --tp, DP = 4 / TP. The model is wrapped as megatron/training/training.py
(wrap_model_chunks_with_ddp) wraps it for the layer-wise optimizer: params tagged for buffer
routing, the layer-wise parameter layout, DDP with the distributed optimizer; --no-layout wraps it
without the layout (--no-use-layer-wise-param-layout). The script writes every gradient element as
1 (no forward or backward), so each squared norm must be its params' element count. Rank 0 prints
`DEFECT SHOWN` (every rank exits 1) when a rank's MTP norm is not, else `DEFECT ABSENT` (exit 0).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist


def build(args):
    """(model, optimizer, element count of every param, of the MTP params)."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer.layer_wise_optimizer import (
        LayerWiseDistributedOptimizer,
        tag_params_for_buffer_routing,
    )
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=4, add_bias_linear=True,
        mtp_num_layers=1, mtp_detach_heads=True,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=args.tp, sequence_parallel=False,
        bias_dropout_fusion=False, gradient_accumulation_fusion=False,
    )
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    gpt = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=64, max_sequence_length=32,
                   share_embeddings_and_output_weights=True,
                   mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False))

    def elements(params):
        # A TP-sharded param holds 1/TP of its elements on each rank, a replicated one all of them.
        return sum(p.numel() * (args.tp if getattr(p, "tensor_model_parallel", False) else 1) for p in params)

    total = elements(gpt.parameters())
    mtp = elements(p for p in gpt.parameters() if getattr(p, "grad_norm_group", None) == "mtp")
    gpt.cuda(torch.cuda.current_device())
    module = Float16Module(config, gpt)
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=not args.no_layout, overlap_grad_reduce=False, grad_reduce_in_fp32=True
    )
    layout = {}
    if not args.no_layout:
        # As wrap_model_chunks_with_ddp does with use_layer_wise_param_layout (Megatron-LM's default).
        tag_params_for_buffer_routing([module])
        layout["full_param_layout"] = LayerWiseDistributedOptimizer.compute_full_param_layout(
            [p for p in module.parameters() if p.requires_grad], None,
            ps.get_data_parallel_world_size(with_context_parallel=True), ddp_config,
            expert_data_parallel_world_size=ps.get_expert_data_parallel_world_size(),
        )
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=module, **layout)
    # What Megatron-LM 0.19 builds for --optimizer muon --use-distributed-optimizer.
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="muon", use_layer_wise_distributed_optimizer=True, bf16=True, lr=0.0,
                        weight_decay=0.0, clip_grad=1.0, muon_tp_mode="duplicated"),
        [model],
    )
    return model, optimizer, total, mtp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1, choices=[1, 2, 4])
    parser.add_argument("--no-layout", action="store_true",
                        help="without the layer-wise parameter layout (--no-use-layer-wise-param-layout)")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                        help="gloo lets several ranks share one GPU")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    model, optimizer, total, mtp = build(args)

    with torch.no_grad():
        for param in model.parameters():
            param.main_grad.fill_(1.0)
    optimizer.prepare_grads()
    norm_sq = float(optimizer.get_grad_norm()) ** 2
    # What ChainedOptimizer.step computes before it clips each separate group by its own norm.
    mtp_sq = float(optimizer._compute_grad_norms_by_group()["mtp"]) ** 2

    ok = abs(mtp_sq - mtp) <= 1e-5 * mtp
    path = "with the layer-wise parameter layout" if not args.no_layout else "without the parameter layout"
    print(f"rank {dist.get_rank()}: TP {args.tp}, DP {dist.get_world_size() // args.tp}, {type(optimizer).__name__} "
          f"{path}: every gradient 1 gives main norm^2 {norm_sq:.1f} (the main params have {total - mtp} elements) "
          f"and MTP norm^2 {mtp_sq:.1f} (the MTP params have {mtp}): {'ok' if ok else 'MISCOUNTED'}", flush=True)
    verdicts = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, ok)
    if dist.get_rank() == 0:
        print(f"DEFECT ABSENT: every rank's MTP norm counts each of the {mtp} MTP elements once" if all(verdicts) else
              f"DEFECT SHOWN: {verdicts.count(False)} of {len(verdicts)} ranks report an MTP norm that does not "
              f"count the {mtp} MTP elements once", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if all(verdicts) else 1)


if __name__ == "__main__":
    main()
