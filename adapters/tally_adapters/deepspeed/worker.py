#!/usr/bin/env python3
"""tally's worker for DeepSpeed: executes tally's cases with DeepSpeed's own, unmodified engine
and optimizers and writes the manifests `tally` judges (`tally fuzz|run|replay --target deepspeed`).

Started by tally, once per world size, under torchrun (one process per rank):

    torchrun --standalone --nproc-per-node WORLD -m tally_adapters.deepspeed.worker \\
        --queue DIR --parent-pid PID [--backend auto|nccl|gloo]

It speaks the queue protocol of tally_adapters.queue (docs/real-targets.md). Per case, on every rank:

1. Process groups for the case's topology, as a Megatron-style `mpu` DeepSpeed is given: TP
   groups of consecutive ranks, DP groups strided by TP (tally's order tp-cp-ep-dp-pp with CP
   and PP 1). DeepSpeed makes its own expert groups from them (`ep_size_<EP>`: EP groups are
   consecutive ranks of a DP group). With PP > 1 the case runs on DeepSpeed's pipeline engine
   instead (build_pipeline, below), whose grid is the mpu.
2. The case's model, as a Megatron-DeepSpeed model presents it to DeepSpeed: every param of
   tally's logical model, sharded by its class over TP (dim 0 for column/vocab, dim 1 for row;
   marked `tensor_model_parallel` with its `partition_dim`) or whole; each MoE layer a real
   `deepspeed.moe.layer.MoE` whose gate weight is the router and whose experts are the routed
   experts (DeepSpeed marks them `allreduce=False`). `etp == tp > 1` turns on DeepSpeed's expert
   tensor parallelism (the experts' FC1/FC2 sharded over TP like the dense MLP, the shards of the
   expert given to the MoE layer marked as Megatron-DeepSpeed marks them; DeepSpeed's copies are
   left as DeepSpeed makes them); `etp == 1` leaves every expert whole on each TP rank,
   DeepSpeed's default.
3. `deepspeed.initialize` with an AdamW at lr 0 (torch's, or DeepSpeed's FusedAdam with
   `deepspeed.fused_adam`) and the DeepSpeed configuration tally sends with the case
   (`case-<K>.engine.json`, from the case's `deepspeed` section: ZeRO stage, fp32 gradient
   accumulation, loss scale; the precision is the case's gradient dtype), then one backward of sum(param * gradient) through
   `engine.backward`: every rank holds tally's values of its pieces, so after DeepSpeed's own
   data-parallel reductions (and ZeRO's partitioning) each gradient is tally's value, exactly
   (the values are representable in the dtype). DeepSpeed sums a gradient over its reduction
   group (DP, or expert-DP for experts) and divides by the DP size: only the group's first rank
   gives the gradient, times the DP size (a power of two), the others 0, so no 16-bit sum rounds.
   A step DeepSpeed skips (an fp16 overflow) is reported as an error, not judged.
4. `engine.step()` inside `recording.Recording`, which records what DeepSpeed's norm code
   kept, and the manifests of `engine.get_global_grad_norm()` into `case-<K>/`.

With `deepspeed.autotp` and `deepspeed.autoep` DeepSpeed shards the model itself instead, as it
does a Hugging Face model: no mpu (AutoTP makes the TP and DP groups), whole `nn.Linear` layers
AutoTP cuts (build_autotp_model), Hugging Face-style MoE blocks AutoEP replaces
(add_autoep_blocks), both together for AutoEP folded over AutoTP, and for AutoEP the engine's own
optimizer (an AdamW at lr 0), since AutoEP makes its params inside `deepspeed.initialize`.
At ZeRO 3 the loss is the module's forward (weighted_sum_model), which makes ZeRO 3 gather every
param.
"""

import contextlib
import math
import os
import sys

from .. import worker as base
from ..queue import framework_setup
from . import recording as tally_deepspeed
from .experts import add_autoep_blocks, build_autoep_model, describe_autoep, describe_experts, moe_param_names
from .fused_adam import prepare_fused_adam
from .groups import (
    CaseGroups,
    Mpu,
    autotp_groups,
    expert_groups,
    forget_deepspeed_groups,
    groups_of_rank,
    release_engines,
)
from .models import build_autotp_model, build_model, describe_dense, moe_settings
from .pipeline import (
    build_pipeline,
    make_expert_groups_on_every_stage,
    pipeline_groups,
    stage_pipeline_p2p_through_host,
)
from .plants import NOT_PLANTED, PLANTS
from .recording import expert_groups_by_name


def check_every_param_held(local_error, held, tensors):
    """Raises a model mismatch on every rank together (after one collective, so no rank is left
    waiting in the next): one rank's own, or a logical param no rank holds."""
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (local_error, held))
    errors = [error for error, _ in everyone if error]
    if errors:
        raise LookupError(errors[0])
    missing = set(tensors) - set().union(*(set(names) for _, names in everyone))
    if missing:
        raise LookupError(f"model mismatch: no rank of DeepSpeed's model holds {sorted(missing)[:5]} "
                          f"({len(missing)} of tally's params)")


def print_gradient_distance(engine, box_of):
    """TALLY_DEBUG_GRADS=1, at ZeRO 0 (where each param's .grad is whole after the backward): how far
    every gradient DeepSpeed holds is from tally's value, so a run's truth is known to be the truth
    of what DeepSpeed holds."""
    import torch
    import torch.distributed as dist

    for path, p in engine.module.named_parameters():
        if p.grad is not None:
            want = torch.from_numpy(box_of(p).copy()).reshape(p.grad.shape)
            distance = float((p.grad.float().cpu() - want).abs().max())
            print(f"rank {dist.get_rank()} {path}: max|grad - tally's value| {distance}", flush=True)


def client_optimizer(module, layers, fused_adam):
    """The AdamW at lr 0 the worker gives DeepSpeed, with DeepSpeed's MoE param groups where the
    module has MoE layers (DeepSpeed requires them): torch's, or with `fused_adam` DeepSpeed's
    FusedAdam (an op DeepSpeed compiles on first use), which makes a 16-bit engine at ZeRO 0 take
    FP16_Optimizer instead of FP16_UnfusedOptimizer."""
    import torch

    params = {"params": list(module.parameters()), "name": "all"}
    if layers:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        groups = split_params_into_different_moe_groups_for_optimizer(params)
    else:
        groups = [{"params": params["params"]}]
    if fused_adam:
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(groups, lr=0.0, weight_decay=0.0)
    return torch.optim.AdamW(groups, lr=0.0, weight_decay=0.0)


def execute(request, planted, producer):
    """Runs the request's case on this rank, its faults planted by `planted`, and writes its
    manifests."""
    import deepspeed
    import torch
    import torch.distributed as dist

    case = request.case
    t = case["topology"]
    world = dist.get_world_size()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        case.get("gradients", {}).get("dtype", "fp32")]
    tp, pp = t.get("tp", 1), t.get("pp", 1)
    autotp = case.get("deepspeed", {}).get("autotp", False)
    autoep = case.get("deepspeed", {}).get("autoep", False)
    fused_adam = case.get("deepspeed", {}).get("fused_adam", False)
    engine = None
    made = CaseGroups()
    try:
        planted.__enter__()
        made.__enter__()
        tensors = request.gradients()
        index = request.gradient_index()
        # The configuration for deepspeed.initialize, as tally's run/deepspeed/engine.cpp wrote it
        # (the one author of it: `tally show` prints the same).
        config = request.engine_config()
        local_error = None
        moe = moe_settings(case)
        expert_tp = moe["expert_tp"]
        case_mpu = None
        # DeepSpeed's own checks of the case (deepspeed.initialize's, AutoTP's, AutoEP's) decline it:
        # a refusal counted by reason, not an error of the worker.
        with framework_setup("deepspeed"):
            if pp > 1:
                module, blocks = build_pipeline(case, index, moe, dtype, world)
                described, layers = {}, {}
                for block in blocks:
                    described.update(block.described)
                    layers.update(block.layers)
                moe_parts = [(block.layers, block.shapes, block.classes) for block in blocks]
                if moe["experts"]:
                    make_expert_groups_on_every_stage(module, moe)
            elif autotp:  # DeepSpeed makes the TP and DP groups and shards the model itself
                moe_names = moe_param_names(index)
                module = build_autotp_model([p for p in index if p["name"] not in moe_names], tensors, dtype)
                if autoep:  # and, folded over TP, replaces the MoE layers
                    add_autoep_blocks(module, index, tensors, moe, dtype)
                described, layers, moe_parts = {}, {}, []
            elif autoep:  # DeepSpeed replaces the MoE layers and makes their expert groups itself
                module, described, layers, moe_parts = build_autoep_model(index, tensors, moe, dtype), {}, {}, []
            else:
                case_mpu = Mpu(tp)
                module, described, layers, shapes, classes = build_model(case, index, case_mpu, moe, dtype)
                moe_parts = [(layers, shapes, classes)]
            if autoep:  # the engine's own optimizer: it splits the params AutoEP makes into MoE groups
                engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=config)
            else:  # no mpu for a pipeline (its grid is one) or AutoTP (whose groups are)
                engine, _, _, _ = deepspeed.initialize(model=module, optimizer=client_optimizer(module, layers, fused_adam),
                                                       mpu=case_mpu, config=config)
        mpu = engine.mpu  # None with AutoEP (TP 1): no model parallelism
        pieces, local_values = {}, {}  # params holding pieces of several logical params (AutoEP's experts)
        # At ZeRO 3 each rank holds a partition: AutoTP's and AutoEP's tensors are checked whole.
        whole = contextlib.nullcontext()
        if engine.zero_optimization_stage() == 3 and (autotp or autoep):
            from deepspeed.runtime.zero.partition_parameters import GatheredParameters

            whole = GatheredParameters(list(engine.module.parameters()))
        with whole:
            try:
                if autoep:
                    described, pieces, local_values = describe_autoep(
                        engine.module, {p["name"]: list(p["shape"]) for p in index}, tensors)
                if autotp or autoep:
                    tp_rank = mpu.get_tensor_model_parallel_rank() if autotp else 0
                    described.update(describe_dense(engine.module, index, tensors, tp_rank, tp))
                for part_layers, shapes, classes in moe_parts:
                    describe_experts(part_layers, described, expert_tp, mpu.get_tensor_model_parallel_rank(), tp, shapes,
                                     classes)
            except LookupError as e:
                local_error = f"rank {dist.get_rank()}: {e}"
        undescribed = [path for path, p in engine.module.named_parameters() if id(p) not in described
                       and id(p) not in pieces]
        if undescribed and not local_error:
            local_error = f"rank {dist.get_rank()}: model mismatch: DeepSpeed holds {undescribed[:3]}, which the " \
                          "worker did not build"
        held = [] if local_error else sorted({described[id(p)][0] for p in engine.module.parameters()
                                              if id(p) in described} |
                                             {piece["logical_name"] for ps in pieces.values() for piece in ps})
        check_every_param_held(local_error, held, tensors)

        def box_of(p):
            if id(p) in local_values:
                return local_values[id(p)]
            name, _, offsets, extents = described[id(p)]
            return tensors[name][tuple(slice(o, o + e) for o, e in zip(offsets, extents))]

        device = next(engine.module.parameters()).device
        # DeepSpeed sums a gradient over its reduction group (DP for dense params, expert-DP for
        # experts) and divides by the DP size. Only the group's first rank gives the gradient, times
        # the DP size (a power of two): every other term is 0, so the 16-bit sums are exact, as
        # sums of equal values (3g) would not be. So does only the first stage's copy of a tied
        # embedding, which the pipeline sums over its copies.
        if mpu is None:
            dp_size, dp_first = world, dist.get_rank() == 0
        else:
            dp_size, dp_first = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank() == 0
        from deepspeed.utils import groups

        def expert_first(p):  # DeepSpeed's MoE and AutoEP name each expert param's group
            return groups._get_expert_data_parallel_rank(p.group_name) == 0

        # AutoTP sums a q/k norm's gradient over TP: only TP rank 0 gives it.
        tp_summed = {id(p) for p in engine.module.tp_summed.parameters()} if autotp else set()
        tp_first = mpu is None or mpu.get_tensor_model_parallel_rank() == 0

        # AutoEP folded over TP divides an expert's gradient by TP: its forward's all-gather back
        # over TP leaves that factor on it, which the worker's loss does not, so it gives it.
        folded = tp if autotp and autoep else 1

        def term_weights(p, first=True):
            expert = not getattr(p, "allreduce", True)
            first = first and (expert_first(p) if expert else dp_first)
            first = first and (tp_first or id(p) not in tp_summed)
            values = box_of(p) * (dp_size * (folded if expert else 1)) if first else box_of(p) * 0
            return torch.from_numpy(values).to(device=device, dtype=p.dtype)

        # fp16 runs scale the loss by the case's static loss scale: the norm codes read the
        # gradients times it, and the manifests record them divided by it.
        grad_scale = float(config["fp16"]["loss_scale"]) if "fp16" in config else 1.0
        if pp > 1:
            first_stage = mpu.get_pipe_parallel_rank() == 0
            for block in blocks:
                copy = block in engine.module.tied_modules.values() and not first_stage
                for p in block.parameters():
                    block.weights[id(p)] = term_weights(p, first=not copy)
            start = torch.zeros(tp * tp, dtype=dtype, device=device)
            with tally_deepspeed.Recording(engine, grad_scale) as recording:
                engine.train_batch(data_iter=iter([(start, start)]))
        else:
            if engine.zero_optimization_stage() == 3:
                # The params are partitioned outside the forward: the loss is the module's forward.
                engine.module.term_weights = {path: term_weights(p) for path, p in engine.module.named_parameters()}
                loss = engine()
            else:
                loss = sum((p * term_weights(p)).sum() for p in engine.module.parameters())
            engine.backward(loss)
            if os.environ.get("TALLY_DEBUG_GRADS") and engine.zero_optimization_stage() == 0:
                print_gradient_distance(engine, box_of)
            with tally_deepspeed.Recording(engine, grad_scale) as recording:
                engine.step()
        norm = engine.get_global_grad_norm()
        if norm is None:
            norm = recording.clip_norm
        norm = float(norm) if norm is not None else None
        # A skipped step (an fp16 overflow) computed no norm to judge: the same on every rank.
        if getattr(engine.optimizer, "overflow", False) or norm is None or not math.isfinite(norm) \
                or not recording.children:
            raise FloatingPointError(
                f"DeepSpeed skipped the step (norm {norm}, overflow "
                f"{getattr(engine.optimizer, 'overflow', None)}): the gradients times the loss scale "
                "do not fit the precision, so there is no norm to judge")
        if pp > 1:
            mine = expert_groups(pipeline_groups(mpu, expert_tp), layers)
        elif autotp or autoep:
            rank = dist.get_rank()
            mine = autotp_groups(mpu) if autotp else {"tp": [rank], "mp": [rank], "dp": list(range(world)),
                                                      "expert_tp": False}
            mine = expert_groups_by_name(mine, {p.group_name for p in engine.module.parameters()
                                                if hasattr(p, "group_name")})
        else:
            mine = groups_of_rank(layers, mpu, expert_tp)
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        manifest = tally_deepspeed.build_manifest(
            engine, recording,
            describe=lambda p: pieces.get(id(p)) or dict(zip(("logical_name", "logical_shape", "offsets", "extents"),
                                                             described[id(p)])),
            gradient_of=box_of,
            groups_by_rank=dict(enumerate(gathered)),
            parallel={"tp": tp, "cp": 1, "pp": pp, "dp": world // (tp * pp), "ep": t.get("ep", 1),
                      "etp": t.get("etp", tp)},
            producer=producer,
            reported_norm=norm,
        )
        tally_deepspeed.dump_manifest(manifest, request.manifests_dir, request.case_digest)
    finally:
        engines = [engine] if engine is not None else []
        engine = None
        # Every step runs, whichever raises: a step left out would leak into the next case.
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(made.__exit__, None, None, None)
            cleanup.callback(forget_deepspeed_groups)
            cleanup.callback(release_engines, engines)
            cleanup.callback(planted.__exit__, None, None, None)


class DeepSpeedWorker(base.Worker):
    """tally's worker for DeepSpeed: executes tally's cases with DeepSpeed's own, unmodified engine."""

    framework = "deepspeed"
    package = "deepspeed"
    plants = PLANTS
    not_planted = NOT_PLANTED
    fused_adam_unavailable = None  # why DeepSpeed's FusedAdam cannot run here (start() finds out)

    def framework_version(self):
        import deepspeed

        return deepspeed.__version__

    def before_process_group(self):
        if self.devices == 0:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        else:
            # DeepSpeed's engine takes its device from LOCAL_RANK: with more ranks than GPUs,
            # each rank's LOCAL_RANK becomes the GPU it shares.
            os.environ["LOCAL_RANK"] = str(int(os.environ.get("LOCAL_RANK", "0")) % self.devices)
        import deepspeed  # noqa: F401

        # Every module that imports a replaced function is loaded before any fault is planted.
        import deepspeed.runtime.bf16_optimizer  # noqa: F401
        import deepspeed.runtime.fp16.fused_optimizer  # noqa: F401
        import deepspeed.runtime.fp16.unfused_optimizer  # noqa: F401
        import deepspeed.runtime.pipe.module  # noqa: F401
        import deepspeed.runtime.pipe.topology  # noqa: F401
        import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401

    def start(self):
        # torch's own init ran (DeepSpeed's passes device_id=cuda:LOCAL_RANK, which one shared GPU
        # refuses); deepspeed.init_distributed adopts the default group.
        import deepspeed

        deepspeed.init_distributed(dist_backend=self.backend)
        if self.backend == "gloo" and self.devices:
            import deepspeed.runtime.pipe.p2p as p2p

            stage_pipeline_p2p_through_host(p2p)
        self.fused_adam_unavailable = prepare_fused_adam(self.devices)

    def cannot_run(self):
        if self.fused_adam_unavailable:
            return {"deepspeed.fused_adam": self.fused_adam_unavailable}
        return {}

    def dtypes(self):
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        return ["fp32"] + [name for name, supported in (("bf16", accelerator.is_bf16_supported),
                                                         ("fp16", accelerator.is_fp16_supported)) if supported()]

    def execute(self, request):
        execute(request, self.planted(request), self.producer())


def main(argv=None):
    return base.run(DeepSpeedWorker, argv)


if __name__ == "__main__":
    sys.exit(main())
