"""transformers 5.17.0: the Trainer's mixed-mesh grad norm counts a tensor-parallel Replicate gradient
once per TP rank (docs/findings/transformers-5.17.0-trainer-mixed-mesh-norm-counts-replicated-tp-grads.md).

    pip install "transformers==5.17.0" "accelerate==1.15.0" "torch==2.11.0"
    torchrun --standalone --nproc-per-node 2 transformers_5_17_0_trainer_mixed_mesh_norm_counts_replicated_tp_grads.py

Two processes on CPUs (gloo). A StarCoder2 at its default config (linear biases) loaded with
transformers' own tensor parallelism, `from_pretrained(..., distributed_config=DistributedConfig(tp_size=2))`:
its plan leaves `o_proj.bias` and `c_proj.bias` DTensors placed Replicate() on the TP mesh, and its
norms and embedding plain tensors. For such a mix the Trainer's `_clip_grad_norm` and
`_get_grad_norm` call `_mixed_mesh_grad_norm` (trainer.py:2668-2669, 2676-2677), which all-reduces
the local squares of every DTensor gradient over the mesh, whatever its placement. Every gradient
here is 1, so the right norm is sqrt(elements); the clip then scales by max_norm over that norm.
Accelerate builds the Trainer's TP ParallelismConfig on GPUs only (on CPUs it raises
"ParallelismConfig is only compatible ..."), so the method is called as the Trainer calls it, on the
Trainer's class: it reads nothing of the Trainer. Rank 0 prints DEFECT SHOWN (exit 1) or DEFECT ABSENT
(exit 0).
"""

import math
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from transformers import Starcoder2Config, Starcoder2ForCausalLM, Trainer
from transformers.distributed import DistributedConfig
from transformers.trainer_optimizer import has_mixed_dtensor

TP = 2


def model_with_unit_gradients(path):
    model = Starcoder2ForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(tp_size=TP),
                                                  dtype=torch.float32)
    for p in model.parameters():
        p.grad = torch.ones_like(p)  # a DTensor param gets a DTensor gradient of its placements
    return model


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = os.path.join(tempfile.gettempdir(), "tiny-starcoder2-tp-norm")
    if rank == 0:
        config = Starcoder2Config(vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False)
        Starcoder2ForCausalLM(config).save_pretrained(path)
    dist.barrier()

    model = model_with_unit_gradients(path)
    elements = sum(p.numel() for p in model.parameters())  # a DTensor's numel is its whole tensor's
    replicated = [(n, p.numel()) for n, p in model.named_parameters()
                  if getattr(p, "placements", None) and all(pl.is_replicate() for pl in p.placements)]
    if not has_mixed_dtensor(p.grad for p in model.parameters()):
        raise SystemExit("the Trainer would not take its mixed-mesh path for this model")
    norm = float(Trainer._mixed_mesh_grad_norm(None, model, float("inf")))

    # The clip: the same call with the Trainer's default max_grad_norm, on fresh unit gradients.
    model = model_with_unit_gradients(path)
    Trainer._mixed_mesh_grad_norm(None, model, 1.0)
    bias = dict(model.named_parameters())["model.layers.0.self_attn.o_proj.bias"].grad.to_local()
    clipped_to = float(bias[0])

    right = math.sqrt(elements)
    counted = math.sqrt(elements + (TP - 1) * sum(n for _, n in replicated))
    if rank == 0:
        print(f"Replicate DTensor params: {', '.join(f'{n} ({k})' for n, k in replicated)}")
        print(f"Trainer._mixed_mesh_grad_norm: {norm:.6f}; every gradient 1 over {elements} elements: {right:.6f}")
        print(f"clip at max_grad_norm 1: each gradient scaled to {clipped_to:.6f}, right {1 / (right + 1e-6):.6f}")
        if abs(norm - right) > 1e-4 * right:
            print(f"DEFECT SHOWN: the norm is {norm:.6f}, not {right:.6f}: the Replicate gradients counted {TP} times "
                  f"give {counted:.6f}")
        else:
            print(f"DEFECT ABSENT: the norm is {right:.6f}, each element counted once")
    defect = abs(norm - right) > 1e-4 * right
    dist.destroy_process_group()
    return 1 if defect else 0


if __name__ == "__main__":
    sys.exit(main())
