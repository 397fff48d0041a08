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
   group (DP, or expert-DP for experts) and divides by the DP size: each rank gives its own
   nonzero share of the gradient times the DP size, as tally dealt it (`Request.shares`), exact in
   the dtype in any order of addition, so a reduction over the wrong group changes the gradient.
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

With `deepspeed.launcher accelerate` (launchers.py) the same model, optimizer and configuration go
to accelerate's `Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=...)).prepare` instead of
`deepspeed.initialize` (no mpu: TP 1, or AutoTP's), the step is `accelerator.backward(loss)` (the
engine's backward and step), and the reported norm is what `accelerator.clip_grad_norm_` returns,
which at ZeRO 0 fp32 would be None (refused). With `deepspeed.launcher trainer` a transformers
Trainer made with TrainingArguments(deepspeed=...) builds it as its train() does before its loop
(deepspeed_init with the Trainer's own optimizer, then its accelerator's prepare), and the reported
norm is what Trainer._get_grad_norm returns. The engine's own norm is the reported norm of the same
case with launcher deepspeed. On CPUs the worker first starts accelerate's process state as a CPU
one over its gloo group, so it counts every rank (launchers.cpu_ranks_as_processes; accelerate finds
no backend without a device, accelerate/state.py:769-815), which the Trainer's arguments are told
to use; nothing of the norm reads it.
"""

import contextlib
import functools
import math
import os
import sys

from .. import worker as base
from . import launchers
from . import recording as tally_deepspeed
from .experts import (
    add_autoep_blocks,
    autoep_values,
    build_autoep_model,
    describe_autoep,
    describe_experts,
    moe_param_names,
)
from .families import build_family_model, describe_family, family_pieces, flat_values, uses_family
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
from .models import EXPERT_PARAM_NAME, build_autotp_model, build_model, describe_dense, moe_settings
from .pipeline import (
    build_pipeline,
    make_expert_groups_on_every_stage,
    pipeline_groups,
    stage_pipeline_p2p_through_host,
)
from .plants import NOT_PLANTED, PLANTS
from .recording import expert_groups_by_name


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


DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def build(run, world, devices):
    """DeepSpeed's engine for the case onto `run`: the groups the case makes (`made`), the model as
    DeepSpeed is given it (`module`, `blocks` with PP; `described`, `layers` and `moe_parts` of what
    the worker built), `deepspeed.initialize` with the configuration tally sent (`engine`)."""
    import deepspeed
    import torch

    case = run.case
    t = case["topology"]
    section = case["deepspeed"]
    run.dtype = getattr(torch, DTYPES[case["gradients"]["dtype"]])
    run.tp, run.pp = t["tp"], t["pp"]
    run.autotp, run.autoep = section.get("autotp", False), section.get("autoep", False)  # written where true
    run.family = uses_family(case)  # the preset's transformers class (families.py)
    run.made = CaseGroups()
    run.made.__enter__()
    # The configuration for deepspeed.initialize, as tally's run/deepspeed/engine.cpp wrote it (the one
    # author of it: `tally show` prints the same).
    run.config = run.request.engine_config()
    run.moe = moe = moe_settings(case)
    index, tensors, dtype = run.index, run.tensors, run.dtype
    case_mpu, run.blocks = None, []
    if run.pp > 1:
        module, run.blocks = build_pipeline(case, index, moe, dtype, world)
        run.described, run.layers = {}, {}
        for block in run.blocks:
            run.described.update(block.described)
            run.layers.update(block.layers)
        run.moe_parts = [(block.layers, block.shapes, block.splits) for block in run.blocks]
        if moe["experts"]:
            make_expert_groups_on_every_stage(module, moe)
    elif run.family:  # as DeepSpeed's users train the preset: AutoTP (with TP) cuts the class by its own plan
        module, run.emap = build_family_model(case, index, dtype)
        run.described, run.layers, run.moe_parts = {}, {}, []
    elif run.autotp:  # DeepSpeed makes the TP and DP groups and shards the model itself
        moe_names = moe_param_names(index)
        module = build_autotp_model([p for p in index if p["name"] not in moe_names], tensors, dtype)
        if run.autoep:  # and, folded over TP, replaces the MoE layers
            add_autoep_blocks(module, index, tensors, moe, dtype)
        run.described, run.layers, run.moe_parts = {}, {}, []
    elif run.autoep:  # DeepSpeed replaces the MoE layers and makes their expert groups itself
        module, run.described, run.layers, run.moe_parts = build_autoep_model(index, tensors, moe, dtype), {}, {}, []
    else:
        case_mpu = Mpu(run.tp)
        module, run.described, run.layers, shapes, splits = build_model(case, index, case_mpu, moe, dtype)
        run.moe_parts = [(run.layers, shapes, splits)]
    # the engine's own optimizer with AutoEP: it splits the params AutoEP makes into MoE groups
    optimizer = None if run.autoep else client_optimizer(module, run.layers, section.get("fused_adam", False))
    run.launcher = section.get("launcher", "deepspeed")  # written where not deepspeed
    if run.launcher != "deepspeed":  # as a Hugging Face user gets it: no mpu (TP 1 or AutoTP's)
        run.engine = launchers.prepare(run, module, optimizer, run.launcher, cpu=devices == 0)
    elif optimizer is None:
        run.engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(),
                                                   config=run.config)
    else:  # no mpu for a pipeline (its grid is one) or AutoTP (whose groups are)
        run.engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, mpu=case_mpu,
                                                   config=run.config)
    # The groups the worker reads: the engine's, or at TP 1 through accelerate (no mpu) its own of TP 1.
    run.mpu = run.engine.mpu if run.engine.mpu is not None else case_mpu


def describe(run):
    """Which piece of which logical param each of the engine's params holds (`described`, and
    `pieces` and `local_values` for params holding pieces of several: AutoEP's experts); returns the
    logical names this rank holds. Raises LookupError where DeepSpeed holds a param the worker did
    not build."""
    engine, tensors = run.engine, run.tensors
    mpu = run.mpu  # None with AutoEP (TP 1): no model parallelism
    run.pieces, run.local_values = {}, {}
    # At ZeRO 3 each rank holds a partition: AutoTP's and AutoEP's tensors are checked whole.
    whole = contextlib.nullcontext()
    if engine.zero_optimization_stage() == 3 and (run.autotp or run.autoep):
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters

        whole = GatheredParameters(list(engine.module.parameters()))
    if run.family:
        run.held = describe_family(engine.module, run.emap, run.index)
        run.pieces = family_pieces(run.held, run.index)
        values = flat_values(tensors, run.index)
        run.local_values = {key: values[ids] for key, ids in run.held.items()}
        return sorted({piece["logical_name"] for ps in run.pieces.values() for piece in ps})
    mismatch = None
    with whole:
        try:
            if run.autoep:
                run.described, run.pieces, run.local_values = describe_autoep(
                    engine.module, {p["name"]: list(p["shape"]) for p in run.index}, tensors)
            if run.autotp or run.autoep:
                tp_rank = mpu.get_tensor_model_parallel_rank() if run.autotp else 0
                run.described.update(describe_dense(engine.module, run.index, tensors, tp_rank, run.tp))
            for part_layers, shapes, splits in run.moe_parts:
                describe_experts(part_layers, run.described, run.moe["expert_tp"],
                                 mpu.get_tensor_model_parallel_rank(), run.tp, shapes, splits)
        except LookupError as error:  # raised once the gathered params are given back
            mismatch = error
    if mismatch is not None:
        raise mismatch
    undescribed = [path for path, p in engine.module.named_parameters() if id(p) not in run.described
                   and id(p) not in run.pieces]
    if undescribed:
        raise LookupError(f"model mismatch: DeepSpeed holds {undescribed[:3]}, which the worker did not build")
    return sorted({run.described[id(p)][0] for p in engine.module.parameters() if id(p) in run.described} |
                  {piece["logical_name"] for ps in run.pieces.values() for piece in ps})


def box_of(run, p):
    """tally's values of the piece param `p` of the engine holds (numpy, its shape)."""
    if id(p) in run.local_values:
        return run.local_values[id(p)]
    name, _, offsets, extents = run.described[id(p)]
    return run.tensors[name][tuple(slice(o, o + e) for o, e in zip(offsets, extents))]


def contributions_of(run):
    """This rank's share of every logical gradient (name -> numpy array of its shape): DeepSpeed sums a
    dense gradient over the DP group and an expert's over its expert-DP group, each divided by the DP
    size (tally's run/deepspeed/engine.h), so tally dealt every gradient times the DP size into one
    nonzero share per rank of each group size, exact in the dtype whatever order DeepSpeed adds them in
    (run/contributions.h). A dense param takes its DP group's share at its DP rank, an expert its
    expert-DP group's at its expert-DP rank: a reduction over another group, or one that leaves a rank
    out, changes the gradient DeepSpeed holds."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    mpu = run.mpu  # None with AutoEP at TP 1: one DP group of the world
    if mpu is None:
        dp_size, dp_rank = dist.get_world_size(), dist.get_rank()
    else:
        dp_size, dp_rank = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    dense = run.request.shares(dp_size)
    expert_groups_here = sorted({p.group_name for p in run.engine.module.parameters() if hasattr(p, "group_name")})
    if len(expert_groups_here) > 1:
        raise LookupError(f"model mismatch: DeepSpeed made expert groups {expert_groups_here}; the worker builds "
                          "one expert-parallel size per case")
    expert_shares, edp_rank = {}, 0
    if expert_groups_here:
        group = expert_groups_here[0]
        edp_rank = groups._get_expert_data_parallel_rank(group)
        expert_shares = run.request.shares(groups._get_expert_data_parallel_world_size(group))
    return {name: expert_shares[name][edp_rank] if expert_shares and EXPERT_PARAM_NAME.match(name) else values[dp_rank]
            for name, values in dense.items()}


def term_weights_of(run):
    """Each param's weight in the loss whose backward gives this rank's contribution to its gradient,
    which DeepSpeed's own reduction then turns into tally's gradient (contributions_of). AutoTP sums
    a q/k norm's gradient over TP as well, and the pipeline a tied embedding's over its two copies:
    there TP rank 0 and the first stage's copy give the share, the others 0."""
    import torch

    engine = run.engine
    mpu = run.mpu
    device = next(engine.module.parameters()).device
    contribution = contributions_of(run)
    local_shares = autoep_values(engine.module, {p["name"]: list(p["shape"]) for p in run.index}, contribution) \
        if run.autoep else {}
    if run.family:
        shares = flat_values(contribution, run.index)
        local_shares = {key: shares[ids] for key, ids in run.held.items()}

    def share_of(p):
        if id(p) in local_shares:
            return local_shares[id(p)]
        name, _, offsets, extents = run.described[id(p)]
        return contribution[name][tuple(slice(o, o + e) for o, e in zip(offsets, extents))]

    # AutoTP sums a q/k norm's gradient over TP: only TP rank 0 gives it. The family's class has
    # its tensor-parallel plan's `replicated_with_grad_allreduce` params summed so (hooks AutoTP marks).
    if run.family:
        tp_summed = {id(p) for p in engine.module.parameters() if getattr(p, "_ds_grad_allreduce_registered", False)}
    else:
        tp_summed = {id(p) for p in engine.module.tp_summed.parameters()} if run.autotp else set()
    tp_first = mpu is None or mpu.get_tensor_model_parallel_rank() == 0
    # AutoEP folded over TP divides an expert's gradient by TP: its forward's all-gather back over TP
    # leaves that factor on it, which the worker's loss does not, so it gives it.
    folded = run.tp if run.autotp and run.autoep else 1

    def term_weights(p, first=True):
        expert = not getattr(p, "allreduce", True)
        gives = first and (tp_first or id(p) not in tp_summed)
        values = share_of(p) * (folded if expert else 1) if gives else share_of(p) * 0
        return torch.from_numpy(values).to(device=device, dtype=p.dtype)

    return term_weights


def step(run):
    """The backward of the weighted loss and DeepSpeed's step (the pipeline's train_batch with PP),
    recorded (`recording`), and the norm DeepSpeed reports (`norm`). A step DeepSpeed skips (an fp16
    overflow) raises FloatingPointError: there is no norm to judge."""
    import torch

    engine = run.engine
    # fp16 runs scale the loss by the case's static loss scale: the norm codes read the gradients
    # times it, and the manifests record them divided by it.
    grad_scale = float(run.config["fp16"]["loss_scale"]) if "fp16" in run.config else 1.0
    if run.pp > 1:
        start = torch.zeros(run.tp * run.tp, dtype=run.dtype, device=next(engine.module.parameters()).device)
        with tally_deepspeed.Recording(engine, grad_scale) as recording:
            engine.train_batch(data_iter=iter([(start, start)]))
    else:
        if engine.zero_optimization_stage() == 3:
            # The params are partitioned outside the forward: the loss is the module's forward.
            engine.module.term_weights = {path: run.term_weights(p) for path, p in engine.module.named_parameters()}
            loss = engine()
        else:
            loss = sum((p * run.term_weights(p)).sum() for p in engine.module.parameters())
        if run.launcher != "deepspeed":
            # accelerate's backward is the engine's backward and step together (launchers.step)
            with tally_deepspeed.Recording(engine, grad_scale) as recording:
                launchers.step(run, loss)
        else:
            engine.backward(loss)
            if os.environ.get("TALLY_DEBUG_GRADS") and engine.zero_optimization_stage() == 0:
                print_gradient_distance(engine, functools.partial(box_of, run))
            with tally_deepspeed.Recording(engine, grad_scale) as recording:
                engine.step()
    norm = engine.get_global_grad_norm()
    if run.launcher != "deepspeed":
        # What accelerate's clip_grad_norm_ (and the Trainer) returns: None where the engine keeps none
        # (run/deepspeed/rules.cpp refuses those cases).
        norm = launchers.reported_norm(run, engine, float(run.config["gradient_clipping"]))
    elif norm is None:
        norm = recording.clip_norm
    norm = float(norm) if norm is not None else None
    # A skipped step (an fp16 overflow) computed no norm to judge: the same on every rank.
    if getattr(engine.optimizer, "overflow", False) or norm is None or not math.isfinite(norm) \
            or not recording.children:
        raise FloatingPointError(
            f"DeepSpeed skipped the step (norm {norm}, overflow {getattr(engine.optimizer, 'overflow', None)}): "
            "the gradients times the loss scale do not fit the precision, so there is no norm to judge")
    run.recording, run.norm = recording, norm


def groups_of_every_rank(run):
    """Every rank's groups by name (recording.build_manifest's `groups_by_rank`), gathered."""
    import torch.distributed as dist

    engine, mpu, world = run.engine, run.mpu, dist.get_world_size()
    if run.pp > 1:
        mine = expert_groups(pipeline_groups(mpu, run.moe["expert_tp"]), run.layers)
    elif run.autotp or run.autoep or run.family:
        rank = dist.get_rank()
        mine = autotp_groups(mpu) if run.autotp else {"tp": [rank], "mp": [rank], "dp": list(range(world)),
                                                      "expert_tp": False}
        mine = expert_groups_by_name(mine, {p.group_name for p in engine.module.parameters() if hasattr(p, "group_name")})
    else:
        mine = groups_of_rank(run.layers, mpu, run.moe["expert_tp"])
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    return dict(enumerate(gathered))


class DeepSpeedWorker(base.Worker):
    """tally's worker for DeepSpeed: executes tally's cases with DeepSpeed's own, unmodified engine."""

    framework = "deepspeed"
    package = "deepspeed"
    plants = PLANTS
    not_planted = NOT_PLANTED
    fused_adam_unavailable = None  # why DeepSpeed's FusedAdam cannot run here (start() finds out)
    trainer_bf16_unavailable = None  # why the Trainer cannot take bf16 here (start() finds out)

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
        self.trainer_bf16_unavailable = launchers.trainer_cannot_run()

    def cannot_run(self):
        out = {}
        if self.fused_adam_unavailable:
            out["deepspeed.fused_adam"] = self.fused_adam_unavailable
        if self.trainer_bf16_unavailable:
            out["deepspeed.launcher"] = self.trainer_bf16_unavailable
        return out

    def dtypes(self):
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        return ["fp32"] + [name for name, supported in (("bf16", accelerator.is_bf16_supported),
                                                         ("fp16", accelerator.is_fp16_supported)) if supported()]

    def build(self, run):
        build(run, self.world, self.devices)

    def set_gradients(self, run):
        held = describe(run)
        # The loss's weights: with PP each block's, which the pipeline's forward reads.
        run.term_weights = term_weights_of(run)
        if run.pp > 1:
            first_stage = run.engine.mpu.get_pipe_parallel_rank() == 0
            for block in run.blocks:
                copy = block in run.engine.module.tied_modules.values() and not first_stage
                for p in block.parameters():
                    block.weights[id(p)] = run.term_weights(p, first=not copy)
        return held

    def norm_step(self, run):
        step(run)

    def manifest(self, run):
        t = run.case["topology"]
        tp, pp = run.tp, run.pp
        return tally_deepspeed.build_manifest(
            run.engine, run.recording,
            describe=lambda p: run.pieces.get(id(p)) or dict(zip(("logical_name", "logical_shape", "offsets", "extents"),
                                                                 run.described[id(p)])),
            gradient_of=functools.partial(box_of, run),
            groups_by_rank=groups_of_every_rank(run),
            parallel={"tp": tp, "cp": 1, "pp": pp, "dp": self.world // (tp * pp), "ep": t["ep"], "etp": t["etp"]},
            producer=self.producer(),
            reported_norm=run.norm,
        )

    def release(self, run, failed):
        engines = [run.engine] if getattr(run, "engine", None) is not None else []
        run.engine = None
        made = getattr(run, "made", None)
        # Every step runs, whichever raises: a step left out would leak into the next case.
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(launchers.release, run)
            if made is not None:
                cleanup.callback(made.__exit__, None, None, None)
            cleanup.callback(forget_deepspeed_groups)
            cleanup.callback(release_engines, engines)


def main(argv=None):
    return base.run(DeepSpeedWorker, argv)


if __name__ == "__main__":
    sys.exit(main())
