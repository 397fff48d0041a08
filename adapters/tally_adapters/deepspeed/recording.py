"""tally_adapters.deepspeed: what DeepSpeed counted in one gradient-norm step, as the manifests `tally check`
judges (docs/manifest.md, format version 2).

DeepSpeed computes the norm in one of several places, chosen by the ZeRO stage and the precision.
`Recording(engine)` wraps, for the length of one `engine.step()`, the function of each place that
receives the tensors DeepSpeed counts, and records which local pieces it kept, the groups it
summed over, and what it read of each piece (a copy taken as it reads it, divided by the static
fp16 loss scale: the pieces' statistics in the manifests); `clip_grad_norm_` also the coefficient
it scaled by and the gradients after it, and so does `DeepSpeedZeroOptimizer.unscale_and_clip_grads`
(ZeRO 1/2). Nothing in DeepSpeed's files changes; the wrappers call the originals.

| path (engine config)                                    | hook                                     | kept, stats group |
|---------------------------------------------------------|------------------------------------------|-------------------|
| fp32, ZeRO 0: `clip_fp32_gradients`                      | `runtime.engine.clip_grad_norm_`         | `mp_rank == 0 or is_model_parallel_parameter(param)`; the MP group, then the mean over DP |
| bf16/fp16, ZeRO 0, grads in the same dtype: `FP16_UnfusedOptimizer` | `fp16.unfused_optimizer.get_weight_norm` | the predicate of `get_weight_norm`, applied to the tensors it is given (the gradients); the MP group; expert gradients are never passed |
| bf16/fp16, ZeRO 0, grads in the same dtype, DeepSpeed's FusedAdam: `FP16_Optimizer` | `fp16.fused_optimizer.get_flattened_grad_norm` and `.get_norm_with_moe_layers` | dense groups: each param's range of its group's flat gradient outside the `grad_norm_mask` ranges it is given, the MP group; expert groups: every param of each flat gradient passed, MP (with expert TP) or the pipeline group, then its EP group |
| bf16 with fp32 gradient accumulation, ZeRO 1 (and bf16 at ZeRO 0 in a pipeline): `BF16_Optimizer` | `BF16_Optimizer.get_grads_for_norm`   | exactly the returned lists; dense: the MP group; each expert group: MP (with expert TP) or the pipeline group, then its EP group |
| ZeRO 1/2: `DeepSpeedZeroOptimizer`                       | `DeepSpeedZeroOptimizer.get_grad_norm_direct` | its predicate on each (partition piece, param); the DP group then the MP group (expert groups then averaged over their expert-DP group) |
| ZeRO 1/2 with `offload_optimizer` on the CPU | `DeepSpeedZeroOptimizer.complete_grad_norm_calculation_for_cpu_offload` | its predicate on each param's partition piece (`grad_position`), held norms only; the DP group then the MP group (expert groups then averaged over their expert-DP group) |
| ZeRO 3: `DeepSpeedZeroOptimizer_Stage3`                  | `DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct` | its predicate (with `_grad_norm_counts_every_rank`) on each param's partition; the partition group, then the MP group unless every rank counts |

The statistics of every param and piece are of the gradient values the caller states
(`gradient_of`), which DeepSpeed holds exactly when they are representable in its dtype and its
reductions add them to zeros (tally's worker ensures both); the reported norm is DeepSpeed's own. DeepSpeed reports no zero count.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import __version__ as ADAPTER_VERSION  # noqa: F401
from ..manifest import finite_or_none, optimizer_child, rank_manifest
from ..manifest import stats as _stats

# --- the groups ---------------------------------------------------------------------------------


def ranks_of(group) -> List[int]:
    import torch.distributed as dist

    if group is None:
        return list(range(dist.get_world_size()))
    return sorted(dist.get_process_group_ranks(group))


def expert_groups_by_name(mine: Dict[str, Any], names) -> Dict[str, Any]:
    """`mine` (this rank's groups by name) with the expert-parallel (`ep:<name>`) and
    expert-data-parallel (`edp:<name>`) groups of each of DeepSpeed's expert group names, as
    build_manifest reads them (the names: the `group_name` of each expert param)."""
    from deepspeed.utils import groups

    for name in sorted(names):
        mine[f"ep:{name}"] = sorted(groups._get_expert_parallel_group_ranks(name))
        mine[f"edp:{name}"] = sorted(groups._get_expert_data_parallel_group_ranks(name))
    return mine


def chained(first_by_rank: Dict[int, Sequence[int]], then: Sequence[int]) -> List[int]:
    """The ranks whose values reach a rank's sum when it is all-reduced over each rank's group of
    `first_by_rank` (a rank -> its group), then over the rank's own group `then`."""
    out = set()
    for r in then:
        out.update(first_by_rank[r])
    return sorted(out)


# --- what DeepSpeed counted -------------------------------------------------------------------


def split_by_mask(begin: int, end: int, masked: Sequence[Tuple[int, int]]) -> List[Tuple[int, int, bool]]:
    """The flat range [begin, end) as (lo, hi, kept) pieces: cut where a masked range [a, b) starts
    or ends inside it, each piece kept unless a masked range covers it (FP16_Optimizer's
    grad_norm_mask zeroes exactly the masked elements)."""
    cuts = sorted({begin, end} | {c for r in masked for c in r if begin < c < end})
    return [(lo, hi, not any(a <= lo and hi <= b for a, b in masked)) for lo, hi in zip(cuts, cuts[1:])]



class Recording:
    """Wraps DeepSpeed's norm hooks for one `engine.step()`. After the step, `children` holds one
    entry per norm DeepSpeed combined: (name, kind, [(param, begin, end, kept, held)]) where kind
    names how its sum was reduced (see `stats_group_of`) and `held` is what the norm code read of
    the param's elements [begin, end), in fp64, unscaled (ZeRO 1/2 read them times `grad_scale`,
    the static fp16 loss scale), taken when it read them (None where the code is given no
    tensor); `clip_norm` the value
    clip_grad_norm_ returned (the norm of the fp32 ZeRO-0 path, which the engine does not keep),
    and for that path `clips[child]` = (max_norm, coefficient, [clipped values per piece])."""

    def __init__(self, engine, grad_scale=1.0):
        self.engine = engine
        self.grad_scale = float(grad_scale)
        self.children: List[Tuple[str, str, List[Tuple[Any, int, int, bool, Any]]]] = []
        self.clip_norm = None
        self.clips: Dict[int, Tuple[float, float, List[Any]]] = {}
        self.zero_groups: Dict[int, int] = {}  # DeepSpeedZeroOptimizer's param group -> its child
        self.zero_clip_calls = 0
        self.patches = None

    def held(self, tensor, begin=0, end=None, scale=1.0):
        """Elements [begin, end) of `tensor` flattened, divided by `scale`, in fp64 on the CPU: a
        copy, since the step scales the tensor in place later. Which codes read gradients times
        the fp16 loss scale was measured on DeepSpeed 0.19.8 on a GPU: ZeRO 1/2's partitions do;
        FP16_Optimizer's and FP16_UnfusedOptimizer's gradients do not (they are unscaled by then)."""
        flat = tensor.detach().reshape(-1)
        flat = flat[begin:] if end is None else flat[begin:end]
        return flat.double().cpu().numpy() / scale

    def _wrap(self, owner, attr, make):
        self.patches.replace(owner, attr, make(getattr(owner, attr)))

    def __enter__(self):
        import deepspeed.runtime.engine as engine_module
        import deepspeed.runtime.fp16.fused_optimizer as fused
        import deepspeed.runtime.fp16.unfused_optimizer as unfused
        from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
        from deepspeed.runtime.utils import is_model_parallel_parameter
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

        from ..plants import Patches

        rec = self
        self.patches = Patches()
        mpu = self.engine.mpu

        def mp_rank():
            return mpu.get_model_parallel_rank() if mpu is not None else 0

        def tp_rank():
            if mpu is None:
                return 0
            get = getattr(mpu, "get_tensor_model_parallel_rank", None) or mpu.get_model_parallel_rank
            return get()

        params = [p for p in self.engine.module.parameters()]
        by_grad = {}

        def grad_owner(t):
            if not by_grad:
                for p in params:
                    if p.grad is not None:
                        by_grad[p.grad.data_ptr()] = p
            return by_grad.get(t.data_ptr())

        def clip_grad_norm_(orig):
            def wrapped(parameters, max_norm, norm_type=2, mpu=None):
                parameters = list(parameters)
                pieces = []
                for p in parameters:
                    if p.grad is None:
                        continue
                    kept = mpu is None or mp_rank() == 0 or is_model_parallel_parameter(p)
                    pieces.append((p, 0, p.numel(), kept, rec.held(p.grad)))
                rec.children.append(("clip_grad_norm_", "mp-then-dp-mean", pieces))
                norm = orig(parameters, max_norm, norm_type, mpu)
                rec.clip_norm = float(norm)
                # It scales every gradient by min(1, max_norm / (norm + 1e-6)), in place.
                coefficient = min(1.0, float(max_norm) / (rec.clip_norm + 1e-6))
                clipped = [rec.held(piece[0].grad) for piece in pieces]
                rec.clips[len(rec.children) - 1] = (float(max_norm), coefficient, clipped)
                return norm

            return wrapped

        def get_weight_norm(orig):
            def wrapped(parameters, norm_type=2, mpu=None):
                tensors = [parameters] if not isinstance(parameters, (list, tuple)) else list(parameters)
                passed, pieces = set(), []
                for t in tensors:
                    p = grad_owner(t)
                    if p is None:
                        raise LookupError("get_weight_norm was given a tensor that is no param's gradient")
                    passed.add(id(p))
                    # get_weight_norm's own tests, on the tensor it is given (a gradient)
                    kept = not getattr(t, "ds_pipe_replicated", False) and \
                        not (tp_rank() > 0 and not is_model_parallel_parameter(t))
                    pieces.append((p, 0, p.numel(), kept, rec.held(t)))
                # The params of the optimizer's groups whose gradients were not passed (experts).
                for group in rec.engine.optimizer.fp16_groups:
                    for p in group:
                        if id(p) not in passed and p.grad is not None:
                            pieces.append((p, 0, p.numel(), False, rec.held(p.grad)))
                            passed.add(id(p))
                rec.children.append((f"FP16_UnfusedOptimizer group {len(rec.children)}", "mp", pieces))
                return orig(parameters, norm_type, mpu)

            return wrapped

        def flat_group(optimizer, flat):
            """The params of `optimizer`'s group whose flat fp32 master (or its gradient) is `flat`,
            with each one's (begin, end) in it."""
            for i, master in enumerate(optimizer.fp32_groups_flat):
                if flat is master or flat is master.grad:
                    out, begin = [], 0
                    for p in optimizer.fp16_groups[i]:
                        out.append((p, begin, begin + p.numel()))
                        begin += p.numel()
                    return out
            raise LookupError("FP16_Optimizer's norm was given a tensor that is no group's flat gradient")

        def get_flattened_grad_norm(orig):
            def wrapped(parameters, norm_type=2, mpu=None, grad_norm_mask=None):
                import torch

                flats = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                flats = [f for f in flats if f.grad is not None]  # as the original indexes its mask
                pieces = []
                for idx, flat in enumerate(flats):
                    masked = []
                    if grad_norm_mask is not None and len(grad_norm_mask[idx]) > 0:
                        masked = [(int(a), int(b)) for a, b in grad_norm_mask[idx].tolist()]
                    grad = flat.grad if flat.grad is not None else flat
                    for p, begin, end in flat_group(rec.engine.optimizer, flat):
                        for lo, hi, kept in split_by_mask(begin, end, masked):
                            pieces.append((p, lo - begin, hi - begin, kept, rec.held(grad, lo, hi)))
                rec.children.append(("FP16_Optimizer dense", "mp", pieces))
                return orig(parameters, norm_type, mpu, grad_norm_mask)

            return wrapped

        def get_norm_with_moe_layers(orig):
            def wrapped(non_expert_norm, mpu, expert_tensors, norm_type=2):
                for name in sorted(expert_tensors):
                    pieces = [(p, 0, end - begin, True, rec.held(flat.grad if flat.grad is not None else flat, begin, end))
                              for flat in expert_tensors[name]
                              for p, begin, end in flat_group(rec.engine.optimizer, flat)]
                    rec.children.append((f"FP16_Optimizer experts {name}", f"mp-then-ep:{name}", pieces))
                return orig(non_expert_norm, mpu, expert_tensors, norm_type)

            return wrapped

        def get_grads_for_norm(orig):
            def wrapped(optimizer, for_clipping=False):
                out = orig(optimizer, for_clipping)
                if for_clipping:
                    return out
                dense, experts = out
                owner = {}
                for i, group in enumerate(optimizer.bf16_groups):
                    for j, lp in enumerate(group):
                        owner[id(optimizer.fp32_groups_gradients[i][j])] = (lp, i)
                counted = {id(t) for t in dense}
                for tensors in experts.values():
                    counted.update(id(t) for t in tensors)
                dense_pieces, expert_pieces = [], {}
                for i, group in enumerate(optimizer.bf16_groups):
                    param_group = optimizer.optimizer.param_groups[i]
                    name = param_group.get("name") if param_group.get("moe", False) else None
                    for j, lp in enumerate(group):
                        grad = optimizer.fp32_groups_gradients[i][j]
                        kept = id(grad) in counted
                        piece = (lp, 0, lp.numel(), kept, rec.held(grad))
                        (dense_pieces if name is None else expert_pieces.setdefault(name, [])).append(piece)
                rec.children.append(("BF16_Optimizer dense", "mp", dense_pieces))
                for name in sorted(expert_pieces):
                    rec.children.append((f"BF16_Optimizer experts {name}", f"mp-then-ep:{name}", expert_pieces[name]))
                return out

            return wrapped

        def zero_group(optimizer, params):
            """The index of DeepSpeedZeroOptimizer's param group whose partition is `params`, and how
            its norm is reduced: the DP group then MP, an expert group's then averaged over its
            expert-DP group."""
            i = next(k for k, group in enumerate(optimizer.params_in_partition) if group is params)
            if optimizer.has_moe_layers and optimizer.is_moe_param_group[i]:
                return i, f"dp-then-mp-then-edp-mean:{optimizer.optimizer.param_groups[i].get('name')}"
            return i, "dp-then-mp"

        def zero_keeps(optimizer, p):  # ZeRO 1/2's predicate, in both of its norm codes
            replicated = getattr(p, "ds_pipe_replicated", False)
            return not replicated and (is_model_parallel_parameter(p) or optimizer.model_parallel_rank == 0)

        def get_grad_norm_direct(orig):
            def wrapped(optimizer, gradients, params, norm_type=2):
                i, kind = zero_group(optimizer, params)
                real = [g for g in gradients if not getattr(g, "_zero_padding", False)]
                pieces = []
                for j, (g, p) in enumerate(zip(real, params)):
                    begin = int(optimizer.first_offset[i]) if j == 0 else 0
                    pieces.append((p, begin, begin + g.numel(), zero_keeps(optimizer, p),
                                   rec.held(g, scale=rec.grad_scale)))
                rec.children.append((f"DeepSpeedZeroOptimizer group {i}", kind, pieces))
                rec.zero_groups[i] = len(rec.children) - 1
                return orig(optimizer, gradients, params, norm_type)

            return wrapped

        def complete_grad_norm_calculation_for_cpu_offload(orig):
            def wrapped(optimizer, params):
                i, kind = zero_group(optimizer, params)
                pieces = []
                for p in params:
                    param_id = optimizer.get_param_id(p)
                    _, begin, _, elements = (int(x) for x in optimizer.grad_position[param_id])
                    kept = zero_keeps(optimizer, p) and param_id in optimizer.norm_for_param_grads
                    pieces.append((p, begin, begin + elements, kept, None))  # its norms only, no tensor
                rec.children.append((f"DeepSpeedZeroOptimizer group {i} (CPU offload)", kind, pieces))
                return orig(optimizer, params)

            return wrapped

        def get_grad_norm_direct_stage3(orig):
            def wrapped(optimizer, gradients, params, norm_type=2):
                import torch.distributed as dist

                group = optimizer._get_param_partition_group(params[0])
                every_rank = optimizer._grad_norm_counts_every_rank(params, group)
                index = dist.get_rank(group=group)
                pieces = []
                for g, p in zip(gradients, params):
                    size = p.ds_tensor.ds_numel  # each rank's partition, the last one padded
                    begin, end = min(index * size, p.ds_numel), min((index + 1) * size, p.ds_numel)
                    if begin == end:
                        continue  # this rank holds only padding of it
                    kept = every_rank or is_model_parallel_parameter(p) or optimizer.model_parallel_rank == 0
                    # The last partition is padded. With fp16, whether ZeRO 3 reads its partitions
                    # times the loss scale is not measured yet: tally's values stand in.
                    held = rec.held(g, 0, end - begin) if rec.grad_scale == 1.0 else None
                    pieces.append((p, begin, end, kept, held))
                ranks = ",".join(str(r) for r in ranks_of(group))
                kind = f"partition:{ranks}" if every_rank else f"partition-then-mp:{ranks}"
                # AutoEP's experts: partitioned over their expert-DP group, then summed over EP too.
                ep_group = getattr(optimizer, "_autoep_expert_parallel_group", lambda ps: None)(params)
                if ep_group is not None and dist.get_world_size(group=ep_group) > 1:
                    from deepspeed.utils import groups

                    name = params[0].ds_zero_partition_group_name
                    if sorted(ranks_of(group)) != sorted(groups._get_expert_data_parallel_group_ranks(name)):
                        raise ValueError(f"ZeRO 3 partitioned AutoEP's experts over {ranks}, not their expert-DP "
                                         "group: the adapter knows the other ranks' partition groups only for it")
                    kind = f"edp-then-ep:{name}" if every_rank else f"edp-then-mp-then-ep:{name}"
                rec.children.append((f"DeepSpeedZeroOptimizer_Stage3 group {len(rec.children)}", kind, pieces))
                return orig(optimizer, gradients, params, norm_type)

            return wrapped

        def unscale_and_clip_grads(orig):
            # Called once per param group, in order, with the group's fp32 partition gradient: the
            # group's pieces (get_grad_norm_direct's, in order) laid end to end, then padding.
            def wrapped(optimizer, grad_groups_flat, total_norm):
                out = orig(optimizer, grad_groups_flat, total_norm)
                i = rec.zero_clip_calls
                rec.zero_clip_calls += 1
                child = rec.zero_groups.get(i)
                if child is None or optimizer.clip_grad <= 0 or len(grad_groups_flat) != 1 \
                        or isinstance(grad_groups_flat[0], list):
                    return out
                flat, pieces, clipped, at = grad_groups_flat[0], rec.children[child][2], [], 0
                for _p, begin, end, _kept, _held in pieces:
                    clipped.append(rec.held(flat, at, at + (end - begin)))  # unscaled by now
                    at += end - begin
                # It multiplies by 1 / max(1, (norm / loss scale + 1e-6) / clip_grad).
                norm = float(total_norm) / float(optimizer.loss_scale)
                coefficient = 1.0 / max(1.0, (norm + 1e-6) / float(optimizer.clip_grad))
                rec.clips[child] = (float(optimizer.clip_grad), coefficient, clipped)
                return out

            return wrapped

        self._wrap(engine_module, "clip_grad_norm_", clip_grad_norm_)
        self._wrap(DeepSpeedZeroOptimizer, "unscale_and_clip_grads", unscale_and_clip_grads)
        self._wrap(DeepSpeedZeroOptimizer_Stage3, "get_grad_norm_direct", get_grad_norm_direct_stage3)
        self._wrap(unfused, "get_weight_norm", get_weight_norm)
        self._wrap(fused, "get_flattened_grad_norm", get_flattened_grad_norm)
        self._wrap(fused, "get_norm_with_moe_layers", get_norm_with_moe_layers)
        self._wrap(BF16_Optimizer, "get_grads_for_norm", get_grads_for_norm)
        self._wrap(DeepSpeedZeroOptimizer, "get_grad_norm_direct", get_grad_norm_direct)
        self._wrap(DeepSpeedZeroOptimizer, "complete_grad_norm_calculation_for_cpu_offload",
                   complete_grad_norm_calculation_for_cpu_offload)
        return self

    def __exit__(self, *exc):
        self.patches.restore()
        return False


# --- the manifest -----------------------------------------------------------------------------


def attributes_of(p) -> Dict[str, Any]:
    # The attributes themselves, not DeepSpeed's predicate on them (a planted fault replaces it).
    tp = bool(getattr(p, "tensor_model_parallel", False) or getattr(p, "model_parallel", False))
    return {
        "tensor_model_parallel": tp,
        "partition_dim": int(getattr(p, "partition_dim", -1)) if tp else -1,
        "allreduce": bool(getattr(p, "allreduce", True)),
        "shared": bool(getattr(p, "ds_pipe_replicated", False)),
        "grad_norm_group": None,
    }


def build_manifest(
    engine,
    recording: Recording,
    describe: Callable[[Any], Dict[str, Any]],
    gradient_of: Callable[[Any], Any],
    groups_by_rank: Dict[int, Dict[str, List[int]]],
    *,
    parallel: Dict[str, int],
    producer: str,
    reported_norm: Optional[float],
) -> Dict[str, Any]:
    """This rank's manifest (rank lists; manifest.write_run turns them into group indices).
    `describe(param)`: its `logical_name`, `logical_shape`, `offsets`, `extents`; or, for a param
    that holds pieces of several logical params (AutoEP's experts stacked in one tensor), a list of
    such dicts, each with `local`: the (begin, end) of the param's flattened elements it is.
    `gradient_of(param)`: the values of its gradient over its box (numpy, the param's shape).
    `groups_by_rank`: every rank's groups by name (`tp`, `dp`, `mp`, `pp` with PP, `ep:<name>`, `edp:<name>`)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = groups_by_rank[rank]
    params, index = [], {}  # index: param -> [(its manifest entry, begin, end of its flat elements)]
    for name, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        values = gradient_of(p).reshape(-1)
        described = describe(p)
        pieces = described if isinstance(described, list) else [dict(described, local=(0, values.size))]
        bounds = [piece["local"] for piece in pieces]
        if bounds[0][0] != 0 or bounds[-1][1] != values.size or any(a[1] != b[0] for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"{name}: its pieces {bounds} do not tile its {values.size} elements in order")
        index[id(p)] = []
        for piece in pieces:
            begin, end = piece["local"]
            box = {k: v for k, v in piece.items() if k != "local"}
            local_name = name if len(pieces) == 1 else f"{name}[{begin}:{end}]"
            index[id(p)].append((len(params), begin, end))
            params.append({"name": local_name, **box, "attributes": attributes_of(p), "stats": _stats(values[begin:end])})

    def stats_group(kind: str) -> List[int]:
        how, _, argument = kind.partition(":")
        if how == "mp":
            return mine["mp"]
        if how == "mp-then-dp-mean":
            return mine["mp"]  # the mean over DP is not a sum: l2-ledger shows it where DP ranks differ
        dp_of = {r: g["dp"] for r, g in groups_by_rank.items()}
        if how == "dp-then-mp":
            return chained(dp_of, mine["mp"])
        if how == "mp-then-ep":
            # get_global_norm_of_tensors sums expert norms over the MP group with expert TP, else
            # over the pipeline group (a rank alone without PP), then over the EP group.
            mp_of = {r: (g["mp"] if g.get("expert_tp", False) else g.get("pp", [r])) for r, g in groups_by_rank.items()}
            return chained(mp_of, mine[f"ep:{argument}"])
        if how == "dp-then-mp-then-edp-mean":
            return chained(dp_of, mine["mp"])
        if how in ("edp-then-ep", "edp-then-mp-then-ep"):
            edp_of = {r: g[f"edp:{argument}"] for r, g in groups_by_rank.items()}
            if how == "edp-then-ep":
                return chained(edp_of, mine[f"ep:{argument}"])
            edp_then_mp = {r: chained(edp_of, g["mp"]) for r, g in groups_by_rank.items()}
            return chained(edp_then_mp, mine[f"ep:{argument}"])
        if how in ("partition", "partition-then-mp"):
            partition = [int(r) for r in argument.split(",")]
            if how == "partition":
                return partition
            if partition != mine["dp"]:
                raise ValueError(f"ZeRO 3 partitioned over {partition}, not the DP group {mine['dp']}: "
                                 "the adapter knows the other ranks' partition groups only for DP")
            return chained(dp_of, mine["mp"])
        raise ValueError(f"unknown reduction {kind!r}")

    optimizers = []
    for child, (name, kind, pieces) in enumerate(recording.children):
        main_params = []
        max_norm, coefficient, clipped = recording.clips.get(child, (None, None, None))
        for k, (p, begin, end, kept, held) in enumerate(pieces):
            if id(p) not in index:
                raise LookupError(f"{name}: counts a param that is not the model's ({tuple(p.shape)})")
            # What the norm code read where it was given a tensor; else the values tally gave it.
            values = held if held is not None else gradient_of(p).reshape(-1)[begin:end]
            if values.size != end - begin:
                raise ValueError(f"{name}: read {values.size} elements of a piece of {end - begin}")
            for entry, entry_begin, entry_end in index[id(p)]:  # the manifest entries the piece overlaps
                lo, hi = max(begin, entry_begin), min(end, entry_end)
                if lo >= hi:
                    continue
                record = {
                    "param": entry,
                    "begin": int(lo - entry_begin),
                    "end": int(hi - entry_begin),
                    "attributes": attributes_of(p),
                    "kept": bool(kept),
                    "kept_zeros": False,
                    "stats": _stats(values[lo - begin:hi - begin]),
                }
                if clipped is not None:
                    record["clipped_stats"] = _stats(clipped[k][lo - begin:hi - begin])
                main_params.append(record)
        optimizers.append(optimizer_child(name, stats_group(kind), main_params, tp_group=mine["tp"],
                                          expert_tp_group=mine["tp"] if mine.get("expert_tp", False) else [rank],
                                          clip=None if max_norm is None else (max_norm, coefficient)))
    groups = {"tp": mine["tp"], "expt_tp": mine["tp"] if mine.get("expert_tp", False) else [rank],
              "dp": mine["dp"], "mp": mine["mp"],
              **{k.replace(":", "_").replace("ep_size_", "size"): v for k, v in mine.items() if k.startswith(("ep:", "edp:"))}}
    return rank_manifest(producer=producer, parallel=parallel, groups=groups, params=params, optimizers=optimizers,
                         norm=finite_or_none(reported_norm))
