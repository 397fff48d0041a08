"""Gradients that enter before megatron-core's own reduction (a case whose `gradients.enter` is
`before_reduction`): each rank writes its own share of every gradient into the param's `main_grad`,
the view into DistributedDataParallel's bucket, and megatron-core's `finalize_model_grads` reduces
the shares, unmodified and once, as a training step does after its backward.

tally dealt the shares (run/contributions.h) over the groups megatron-core 0.19.2 reduces over
(docs/megatron-reference.md §10); every rank multiplies its share by 1/|DP x CP| before the sum,
so each group's shares add up to the gradient times |DP x CP|:

- a dense param: its DP x CP group, at this rank's place in it;
- a routed expert's (an `expert-*` class): its expert-data-parallel group;
- the tied word embedding at PP > 1: DP x CP of the first stage, then of the last (Megatron sums
  the two stages' copies after DP);
- a q/k layernorm at TP > 1: DP x CP of each TP rank in turn (Megatron sums it over TP after DP).

Which group a param takes is tally's (its class and name in the gradient index), not Megatron's
attributes, so a reduction over another group, one that leaves a rank out, counts one twice or
scales by another factor changes what the ranks hold, which tally's judge checks.

Megatron-FSDP (a case with a `megatron_fsdp` section): a backward leaves each param's gradient in
the main grad Megatron-FSDP allocates for it (`get_main_grad`; the whole TP-local param, in an
unsharded bucket where the gradients are sharded), and its root post-backward hook starts the
reduction: the reduce-scatter over its DP-shard group for `optim_grads` and `optim_grads_params`
(and the all-reduce over the outer DP group at the last microbatch), nothing for `no_shard` and
`optim`, whose `finish_grad_sync` all-reduces (reduce-scatters) the buffer. `fsdp_backward` does
exactly the backward's part (fsdp_backward's docstring); `finalize_model_grads` the rest, as for DDP.
A rank then holds the reduced gradient in its shard of the main-grad buffer, which the manifest
reads (model_params.fsdp_shard).

After the distributed optimizer's reduce-scatter a rank holds the reduced gradient only in its own
shard of each bucket; `held_after_reduction` gathers the shards into a copy (the buckets themselves
untouched, so the optimizer reads what Megatron left it) for the manifest's record of each param.
"""

from __future__ import annotations

from typing import Dict, Tuple


def before_reduction(case) -> bool:
    """Whether the case's gradients enter before megatron-core's reduction (tally writes
    `gradients.enter` only then)."""
    return case["gradients"].get("enter") == "before_reduction"


def is_qk_layernorm(logical_name: str) -> bool:
    module = logical_name.rpartition(".")[0]
    return module.endswith("q_layernorm") or module.endswith("k_layernorm")


def placement(case, logical_name: str, param_class: str) -> Tuple[int, int]:
    """(the size of the group this rank's share of `logical_name` is dealt over, its place in it)."""
    from megatron.core import parallel_state as ps

    t, m = case["topology"], case["model"]
    dp_cp = ps.get_data_parallel_world_size(with_context_parallel=True)
    dp_cp_rank = ps.get_data_parallel_rank(with_context_parallel=True)
    if param_class.startswith("expert-"):
        return ps.get_expert_data_parallel_world_size(), ps.get_expert_data_parallel_rank()
    if param_class == "vocab" and t["pp"] > 1 and not m["untie_embeddings_and_output_weights"]:
        stage = 0 if ps.is_pipeline_first_stage(ignore_virtual=True) else 1
        return 2 * dp_cp, stage * dp_cp + dp_cp_rank
    if t["tp"] > 1 and m["qk_layernorm"] and is_qk_layernorm(logical_name):
        return t["tp"] * dp_cp, ps.get_tensor_model_parallel_rank() * dp_cp + dp_cp_rank
    return dp_cp, dp_cp_rank


class Contributions:
    """This rank's share of every logical gradient, read from tally's files as each group size is
    first needed."""

    def __init__(self, run):
        self.run = run
        self.classes = {p["name"]: p["class"] for p in run.index}
        self.by_size: Dict[int, Dict[str, object]] = {}

    def of(self, logical_name: str):
        """This rank's share of `logical_name`'s whole logical tensor (numpy, its shape)."""
        size, position = placement(self.run.case, logical_name, self.classes[logical_name])
        if size not in self.by_size:
            self.by_size[size] = self.run.request.shares(size)
        return self.by_size[size][logical_name][position]


def reduce(chunks) -> None:
    """megatron-core's own reduction of the gradients every rank wrote, as its training step runs
    it once after the backward. On gloo, each collective of DDP's coalesced block runs as it is
    issued (gloo refuses a coalesced all-reduce on CUDA tensors: tally_adapters.gloo_shims)."""
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    from ..gloo_shims import coalesced_one_by_one

    with coalesced_one_by_one():
        finalize_model_grads(list(chunks))


def fsdp_backward(modules, shares) -> None:
    """What one backward of Megatron-LM's training step leaves in Megatron-FSDP's `modules`, with
    `shares` (raw param, this rank's share of its TP-local gradient) as the gradients: the grad
    buffers zeroed (train_step's zero_grad_buffer); the raw params in place, as its forward begins;
    the root pre-backward hook (`pre_backward`, which Megatron-FSDP exposes for a backward it does
    not see); each share written into the param's main grad as Transformer Engine's fused gradient
    accumulation writes a weight gradient (`get_main_grad`, then `grad_added_to_main_grad`), so no
    bf16 `param.grad` rounds it; and the root post-backward hook (`post_backward`), which hands the
    gradients to Megatron-FSDP's reduction pipeline. Megatron-LM's schedule enters Megatron-FSDP's
    `no_sync` only with `--overlap-grad-reduce` (megatron/training/training.py, `config.no_sync_func`),
    which the worker does not set, so `is_last_microbatch` stays unset, as in that training (and the
    instances of hybrid FSDP are never reduced with each other:
    docs/findings/megatron-core-0.19.2-hybrid-fsdp-outer-dp-not-reduced.md)."""
    import torch

    for module in modules:
        module.zero_grad_buffer()
        # What Megatron-FSDP's forward does first: the raw params back in the module, each knowing
        # its Megatron-FSDP module (their main-grad getters ask it for buffers).
        module._replace_param_with_raw_if_needed()
        module.pre_backward()
    with torch.no_grad():
        for raw, values in shares:
            raw.main_grad = raw.get_main_grad()
            raw.main_grad.copy_(values.reshape(raw.main_grad.shape).to(raw.main_grad.device))
            raw.grad_added_to_main_grad = True
    for module in modules:
        module.post_backward()


def held_after_reduction(chunks) -> Dict[int, object]:
    """id(param) -> the reduced gradient of every param of the distributed optimizer's buckets, as
    the ranks of each reduce-scatter hold it together (their shards gathered into a copy, over the
    group and in the order megatron-core's start_grad_sync reduce-scatters them); {} where DDP
    all-reduced (every rank then holds it whole in its main_grad) and for Megatron-FSDP (a rank's
    record is its shard, which holds the reduced gradient)."""
    import torch
    import torch.distributed as dist
    from megatron.core.distributed.param_and_grad_buffer import shard_buffer

    held: Dict[int, object] = {}
    for chunk in chunks:
        if not chunk.ddp_config.use_distributed_optimizer or chunk.ddp_config.use_megatron_fsdp:
            continue  # DDP all-reduced; Megatron-FSDP's records read its buffer's shard
        for bucket_group in chunk.bucket_groups + chunk.expert_parallel_bucket_groups:
            group = bucket_group.intra_distributed_optimizer_instance_group
            size = bucket_group.intra_distributed_optimizer_instance_size
            rank = bucket_group.intra_distributed_optimizer_instance_rank
            for bucket in bucket_group.buckets:
                gathered = torch.empty_like(bucket.grad_data)
                dist.all_gather_into_tensor(gathered, shard_buffer(bucket.grad_data, size)[rank], group=group)
                for param, (begin, end) in bucket.param_to_index.items():
                    held[id(param)] = gathered[begin:end].view(param.shape)
    return held
