#!/usr/bin/env python3
"""A tiny MoE GPT on Megatron-core (0.16.1), its optimizer's grad norm and zero count, and the
tally manifests of that step (tally_adapters.megatron, `pip install ./adapters`).

Run with torchrun, one process per GPU, e.g. on 2 GPUs:

    torchrun --nproc-per-node 2 adapters/examples/megatron/tiny_moe_gpt.py \\
        --tp 2 --ep 2 --etp 1 --optimizer muon --layer-wise --gradients expert-fc2-bias \\
        --out /tmp/manifests [--tally build/cli/tally]

The model: Megatron-core's local layer spec (`get_gpt_layer_local_spec(num_experts=...,
moe_grouped_gemm=False)`: SequentialMLP experts), bf16 (Float16Module), biases on
(`add_bias_linear=True`, which Megatron allows in MoE only with ETP 1), hidden 8, 2 heads,
ffn 16, 4 experts (top-2), vocab 32, sequence 8, tied embeddings (Megatron's default),
sequence parallelism off (without Apex the local spec's norm refuses it). It is
wrapped in Megatron's DistributedDataParallel (`use_distributed_optimizer` off unless
--dist-opt). No forward or backward pass runs: every model param's `main_grad` (its slice of
DDP's gradient buffer) is set directly, to values that are a function of the LOGICAL element,
so every replica of an element holds the same gradient, as after Megatron's gradient
reductions:

  ones             every element 1
  expert-fc2-bias  1 on the routed experts' FC2 biases, 0 elsewhere (the selective invariant of
                   Megatron-LM #6099's regression test: the norm must be sqrt(experts * hidden))
  hashed           splitmix64(splitmix64(seed << 32 | crc32(logical name)) + flat index) mod 17,
                   minus 8, over 8: a dyadic value in [-1, 1] (0 one time in 17), the flat index
                   being the row-major index of the element in the logical (unsharded) tensor

Then `prepare_grads()`, `get_grad_norm()`, `count_zeros()`, `dump_manifest()`, and with
--tally, rank 0 runs `TALLY check OUT` after a barrier and prints its output.
"""

import argparse
import os
import subprocess
import sys
import zlib

import numpy as np
import torch
import torch.distributed as dist
from tally_adapters.megatron import manifest as tally_megatron
from tally_adapters.megatron import model_params
from tally_adapters.megatron.muon_compat import emerging_optimizers_compat


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--etp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--layers", type=int, default=None, help="default: 1 per pipeline stage")
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--ffn", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--untie", action="store_true", help="separate output layer weight")
    p.add_argument("--optimizer", choices=["adam", "muon"], default="adam")
    p.add_argument("--layer-wise", action="store_true", help="muon: LayerWiseDistributedOptimizer")
    p.add_argument("--dist-opt", action="store_true", help="adam: DistributedOptimizer")
    p.add_argument(
        "--gradients", choices=["ones", "expert-fc2-bias", "hashed"], default="ones"
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", required=True, help="folder for rank-<R>.json")
    p.add_argument("--tally", default=None, help="path of the tally binary: run `tally check OUT`")
    p.add_argument(
        "--backend",
        choices=["nccl", "gloo"],
        default="nccl",
        help="torch.distributed backend; gloo lets several ranks share a GPU (NCCL refuses two "
        "ranks of one communicator on one GPU), so a world can exceed the GPU count",
    )
    return p.parse_args(argv)


# --- emerging_optimizers compatibility ---------------------------------------------------------


# --- gradients ------------------------------------------------------------------------------------

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & M64
        z = x
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & M64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & M64
        return z ^ (z >> np.uint64(31))


def hashed_values(seed, logical_name, logical_shape, offsets, extents):
    """The gradient of the box: a function of (seed, logical name, logical flat index)."""
    key = splitmix64(
        np.array([(int(seed) << 32) | zlib.crc32(logical_name.encode())], dtype=np.uint64)
    )[0]
    flat = np.zeros(extents, dtype=np.uint64)
    stride = 1
    for d in reversed(range(len(extents))):
        idx = np.arange(offsets[d], offsets[d] + extents[d], dtype=np.uint64)
        shape = [1] * len(extents)
        shape[d] = extents[d]
        with np.errstate(over="ignore"):
            flat = flat + idx.reshape(shape) * np.uint64(stride)
        stride *= int(logical_shape[d])
    with np.errstate(over="ignore"):
        h = splitmix64((flat + key) & M64)
    k = (h % np.uint64(17)).astype(np.int64) - 8
    return (k.astype(np.float32) / 8.0).reshape(extents)


def is_expert_fc2_bias(local_name):
    return tally_megatron.is_routed_expert_name(local_name) and local_name.endswith(
        "linear_fc2.bias"
    )


def set_gradients(model, mode, seed):
    chunks = model_params.model_chunks(model)
    params, _, objs = model_params.describe_params(chunks)
    for entry, p in zip(params, objs):
        r = entry["record"]
        if mode == "ones":
            values = torch.ones(p.shape)
        elif mode == "expert-fc2-bias":
            values = torch.full(p.shape, 1.0 if is_expert_fc2_bias(r["name"]) else 0.0)
        else:
            values = torch.from_numpy(
                hashed_values(seed, r["logical_name"], r["logical_shape"], r["offsets"], r["extents"])
            )
        values = values.reshape(p.shape)
        if getattr(p, "main_grad", None) is None:
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        with torch.no_grad():
            p.main_grad.copy_(values.to(p.main_grad.device))


# --- model and optimizer ----------------------------------------------------------------------------


def build(args):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=args.etp,
    )
    model_parallel_cuda_manual_seed(args.seed)
    layers = args.layers or args.pp
    moe = {}  # --experts 0: a dense model
    if args.experts:
        moe = dict(num_moe_experts=args.experts, moe_ffn_hidden_size=args.ffn, moe_router_topk=2,
                   moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False)
    config = TransformerConfig(
        num_layers=layers,
        hidden_size=args.hidden,
        num_attention_heads=2,
        ffn_hidden_size=args.ffn,
        **moe,
        add_bias_linear=True,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=args.etp,
        # the local spec's norm without Apex is WrappedTorchNorm, which refuses sequence
        # parallelism; no forward pass runs, and SP changes no counting attribute
        sequence_parallel=False,
        bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
    )
    spec = get_gpt_layer_local_spec(num_experts=args.experts or None, moe_grouped_gemm=False)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=args.vocab,
        max_sequence_length=args.seq,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=not args.untie,
    )
    model.cuda(torch.cuda.current_device())
    model = Float16Module(config, model)
    if args.optimizer == "muon" and args.layer_wise and args.dist_opt:
        # 0.19's layer-wise + DistributedOptimizer chain needs each param tagged for its buffer
        # before DDP builds them (else the DistributedOptimizer meets Muon's params: KeyError).
        try:
            from megatron.core.optimizer.layer_wise_optimizer import tag_params_for_buffer_routing
        except ImportError:
            raise SystemExit("--layer-wise --dist-opt: this megatron-core has no layer-wise + "
                             "DistributedOptimizer chain (0.19 added it)")
        tag_params_for_buffer_routing([model])
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=args.dist_opt,
        overlap_grad_reduce=False,
        grad_reduce_in_fp32=False,
    )
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    return model


def build_optimizer(args, model):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer="adam",
        lr=0.0,
        weight_decay=0.0,
        bf16=True,
        use_distributed_optimizer=args.dist_opt,
        log_num_zeros_in_grad=True,
        clip_grad=0.0,
        muon_tp_mode="duplicated",
    )
    if args.optimizer == "adam":
        return get_megatron_optimizer(config, [model])
    import dataclasses

    if "use_layer_wise_distributed_optimizer" in {f.name for f in dataclasses.fields(OptimizerConfig)}:
        # 0.19 and later: Muon is an optimizer name of get_megatron_optimizer, layer-wise a config
        # flag (its get_megatron_muon_optimizer is a shim that builds whatever `optimizer` names:
        # with "adam" it silently builds AdamW children). With --dist-opt the layer-wise Muon is
        # chained with a DistributedOptimizer for the params Muon does not take.
        config.optimizer = "muon"
        config.use_layer_wise_distributed_optimizer = args.layer_wise
        return get_megatron_optimizer(config, [model])
    if args.dist_opt:
        raise SystemExit("--dist-opt: megatron-core 0.16.1's Muon does not support the dist optimizer")
    from megatron.core.optimizer.muon import get_megatron_muon_optimizer

    shim = emerging_optimizers_compat()
    if shim and dist.get_rank() == 0:
        print("note: emerging_optimizers keyword shim applied (use_nesterov -> nesterov)", flush=True)
    # 0.16.1 names the flag `layer_wise_distributed_optimizer`
    return get_megatron_muon_optimizer(
        config, [model], layer_wise_distributed_optimizer=args.layer_wise
    )


def main():
    args = parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # With gloo, ranks beyond the GPU count share GPUs round-robin.
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    rank = dist.get_rank()

    model = build(args)
    optimizer = build_optimizer(args, model)
    set_gradients(model, args.gradients, args.seed)

    found_inf = optimizer.prepare_grads()
    norm = optimizer.get_grad_norm()
    zeros = optimizer.count_zeros()
    norm_f = float(norm.item() if hasattr(norm, "item") else norm)
    zeros_f = float(zeros.item() if hasattr(zeros, "item") else zeros)
    # Before the manifest: a configuration the adapter cannot describe still shows its values.
    print(f"rank {rank}: reported norm {norm_f!r} zeros {zeros_f!r}", flush=True)
    path = tally_megatron.dump_manifest(
        optimizer, model, args.out, grad_norm=norm, num_zeros=zeros
    )
    kind = type(optimizer).__name__
    children = [type(c).__name__ for c in getattr(optimizer, "chained_optimizers", [optimizer])]
    print(
        f"rank {rank}: optimizer {kind} {children} found_inf {found_inf} "
        f"norm {norm_f!r} zeros {zeros_f!r} -> {path}",
        flush=True,
    )
    dist.barrier()
    if rank == 0:
        print(f"grad norm {norm_f!r}", flush=True)
        print(f"zeros {int(zeros_f)}", flush=True)
        if args.tally:
            r = subprocess.run([args.tally, "check", args.out], capture_output=True, text=True)
            print(r.stdout, end="", flush=True)
            print(r.stderr, end="", file=sys.stderr, flush=True)
            print(f"tally check exit {r.returncode}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
