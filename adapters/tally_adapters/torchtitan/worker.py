#!/usr/bin/env python3
"""tally's worker for torchtitan: executes tally's cases with torchtitan's own meshes, FSDP2 wrapping
and gradient clipping, unmodified, and writes the manifests `tally` judges (`tally fuzz|run|replay
--target torchtitan`).

Started by tally, once per world size, under torchrun (one process per rank):

    torchrun --standalone --nproc-per-node WORLD -m tally_adapters.torchtitan.worker \\
        --queue DIR --parent-pid PID [--backend auto|nccl|gloo]

It speaks the queue protocol of tally_adapters.queue (docs/real-targets.md). Per case, on every rank:

1. torchtitan's `ParallelDims` for the case (dp_replicate from the case's `torchtitan` section,
   dp_shard the rest of DP, CP, TP, PP, EP; its `spmd_backend`) builds the meshes: the dense one
   (pp, dp_replicate, dp_shard, cp, tp) and the sparse one (pp, dp_replicate, efsdp, ep). Kept
   across cases of one layout: making them is most of a case's time on gloo.
2. A preset case on one pipeline stage: torchtitan's own model of its family (family_model,
   families), placed by the family's sharding config and `parallelize`, FSDP-wrapped as its
   parallelize function does (step 3), each param holding rows of tally's logical params. Any
   other case: the case's model as a torchtitan decoder on this rank's pipeline stage: `tok_embeddings` (the
   embeddings), `layers` (each decoder layer; a MoE layer's routed experts stacked into one tensor
   per weight under `moe.routed_experts.inner_experts`, as torchtitan's grouped experts are),
   `norm` and `lm_head`; `enable_weight_tying` where the output is the embedding. Each param is a
   DTensor placed as torchtitan's sharding places its kind: column-parallel weights and the
   embedding Shard(0) over TP, row-parallel Shard(1), the rest Replicate; experts Shard(0) over EP
   on the sparse mesh, or, without EP, split over TP (Shard(1) column, Shard(2) row). With
   `full_dtensor` every param lives on the whole dense (or sparse) mesh; with `partial_dtensor` on
   the TP (or EP) mesh only, as torchtitan's two backends lay them out.
3. torchtitan's own `apply_fsdp_to_decoder`, with the FSDP meshes its model parallelizers choose
   (`resolve_fsdp_mesh` and `resolve_sparse_fsdp_mesh`; for `partial_dtensor` the `fsdp` /
   `efsdp` meshes, with `dp_replicate` for HSDP).
4. Every param's gradient: after the reduction (the default), tally's values placed as the param
   is (`distribute_tensor` of the logical gradient), each rank's shard checked against the box its
   placements describe; before it (`torchtitan.gradients_enter`), each rank's share of every
   gradient left by a backward under FSDP2's hooks, which FSDP2's own reduce-scatter (and HSDP's
   all-reduce) sums; what it leaves each rank is recorded for the judge.
5. The clip the case names: torchtitan's `clip_grad_norm_` (`pp_mesh`, `ep_enabled` as its
   trainer passes them) or `torch.nn.utils.clip_grad_norm_`, with the case's max_norm (infinity
   where the case does not clip), and the manifests (tally_adapters.dtensor) of what it returned
   and of the gradients after it.

On a machine without GPUs it runs on the CPUs with gloo (torchtitan's module `device_type` is set to
"cpu", which torchtitan would otherwise take to be "cuda"); with GPUs, several ranks share one.
"""

import math
import sys

from .. import dtensor as tally_dtensor
from .. import fsdp2, gloo_shims
from .. import worker as base
from ..queue import THREAD_BUDGET, threads_of_this_process
from . import families
from .family_model import FamilyModel
from .plants import NOT_PLANTED, PLANTS
from .stage_model import StageModel

# --- one case ------------------------------------------------------------------------------------

# The threads a rank may hold before its least recently used layouts' groups are destroyed: half
# the queue's budget, so that the layout a case builds rarely takes a rank past it.
LAYOUT_THREADS = THREAD_BUDGET // 2


class Layouts:
    """torchtitan's ParallelDims of the layouts this worker has run lately, each layout's meshes built
    once (most of a case's time on gloo is making their process groups). A gloo group keeps its
    threads while a mesh holds it: past `most_threads` on any rank, the least recently used layouts'
    groups are destroyed (kept, a world-4 worker's ranks passed the queue's 512 within about 60
    cases and the worker retired)."""

    def __init__(self, most_threads=LAYOUT_THREADS):
        self.most_threads = most_threads
        self.dims = {}  # layout -> its ParallelDims, least recently used first
        self.groups = {}  # layout -> the process groups made while it was the current one
        self.known = []  # the groups torch held when the current layout became current
        self.current = None

    def parallel_dims(self, parallelism, world):
        """The ParallelDims of the job config's `parallelism` (tally's run/torchtitan/rules.h writes it)."""
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
        from torchtitan.distributed.parallel_dims import ParallelDims

        key = tuple(sorted(parallelism.items()))
        if key != self.current:
            # DTensor's sharding propagation caches output specs by value: an op on an earlier
            # layout's mesh would hand back that mesh object for this layout's equal one, which
            # fully_shard (checking identity) refuses. torchtitan builds one layout per process.
            _clear_sharding_prop_cache()
            self.note_groups_of_current()
            self.current = key
        if key in self.dims:
            self.dims[key] = self.dims.pop(key)  # the most recently used
        else:
            self.forget_least_recent(self.most_threads)
        if key not in self.dims:
            dims = ParallelDims(dp_replicate=parallelism["data_parallel_replicate_degree"],
                                dp_shard=parallelism["data_parallel_shard_degree"],
                                cp=parallelism["context_parallel_degree"], tp=parallelism["tensor_parallel_degree"],
                                pp=parallelism["pipeline_parallel_degree"], ep=parallelism["expert_parallel_degree"],
                                world_size=world, spmd_backend=parallelism["spmd_backend"])
            dims.build_mesh()
            self.dims[key] = dims
        return self.dims[key]

    def note_groups_of_current(self):
        """The groups made since the current layout became current are its own (its meshes', the
        ones its cases flattened)."""
        now = base.groups_but_the_world()
        if self.current is not None:
            made = [g for g in now if not any(g is k for k in self.known)]
            self.groups.setdefault(self.current, []).extend(made)
        self.known = now

    def forget_least_recent(self, most_threads):
        """While some rank holds `most_threads` threads or more, destroys the groups of the least
        recently used layout other than the current one. Every rank decides alike (the most of any
        rank's), so every rank builds the same layouts' groups in the same order later."""
        import torch.distributed as dist

        while len(self.dims) > int(self.current in self.dims):
            threads = [None] * dist.get_world_size()
            dist.all_gather_object(threads, threads_of_this_process())
            if max((t for t in threads if t is not None), default=0) < most_threads:
                return
            oldest = next(k for k in self.dims if k != self.current)
            del self.dims[oldest]
            forgotten = self.groups.pop(oldest, [])
            self.known = [g for g in self.known if not any(g is f for f in forgotten)]
            base.destroy_groups(forgotten)
            del forgotten


def layout_meshes(dims, backend):
    """The meshes torchtitan places params on before FSDP (dense, sparse) and the FSDP meshes its
    parallelizers choose (torchtitan/models/qwen3/parallelize.py)."""
    from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh, resolve_sparse_fsdp_mesh

    if backend == "full_dtensor":
        dp_mesh, dp_dims = resolve_fsdp_mesh(dims)
        edp_mesh, edp_dims = resolve_sparse_fsdp_mesh(dims)
        dense, sparse = dp_mesh, edp_mesh  # the storage meshes: every param lives on one
    else:
        dense = dims.get_optional_mesh("tp")
        sparse = dims.get_optional_mesh("ep") if dims.ep_enabled else None
        dp_mesh = dims.get_mesh(["dp_replicate", "fsdp"] if dims.dp_replicate_enabled else ["fsdp"])
        dp_dims = None
        edp_mesh = None
        if dims.ep_enabled:
            edp_mesh = dims.get_optional_mesh(["dp_replicate", "efsdp"] if dims.dp_replicate_enabled else ["efsdp"])
        edp_dims = None
    return (dense, sparse), (dp_mesh, dp_dims, edp_mesh, edp_dims)


def _row_pieces(p, local_name, segs, lo, hi, row, at, dims, attributes, shapes):
    """The pieces of rows [lo, hi) of `p` (over its expert dim too where it stacks experts), which
    begin at flat element `at` of this rank's shard: one per segment they meet, each a box of its
    logical param (the remaining dims of the shard's box, `dims`: offsets, extents)."""
    pieces = []
    offsets, extents = dims
    for s in segs:
        a, b = max(lo, s.begin), min(hi, s.end)
        if a >= b:
            continue
        pieces.append(tally_dtensor.Piece(p, local_name, at + (a - lo) * row, at + (b - lo) * row, s.logical,
                                          shapes[s.logical],
                                          [s.logical_begin + a - s.begin] + offsets, [b - a] + extents, attributes))
    return pieces


def pieces_of(named_params, holdings, boxes, shapes):
    """The manifest pieces of every param: its local box (`boxes`), split where it holds rows of
    several logical params (an expert stack, torchtitan's gate and up projections)."""
    pieces = []
    for local_name, p in named_params:
        _, segs, stacked = holdings[id(p)]
        offsets, extents = boxes[id(p)]
        if 0 in extents:  # FSDP left this rank no element of it (fewer rows than ranks)
            continue
        if not stacked:
            pieces += _row_pieces(p, local_name, segs, offsets[0], offsets[0] + extents[0],
                                  int(math.prod(extents[1:])), 0, (offsets[1:], extents[1:]),
                                  tally_dtensor.attributes_of(p), shapes)
            continue
        rows = int(p.shape[1])  # an expert's rows
        row = int(math.prod(extents[2:]))
        attributes = tally_dtensor.attributes_of(p, expert=True, dim_offset=1)
        for k in range(extents[0]):
            e = offsets[0] + k
            lo = e * rows + offsets[1]
            pieces += _row_pieces(p, f"{local_name}[{e}]", segs, lo, lo + extents[1], row, k * extents[1] * row,
                                  (offsets[2:], extents[2:]), attributes, shapes)
    return pieces


def _family_of_case(case):
    """torchtitan's family of the case's preset where the worker builds it on torchtitan's own model
    (one pipeline stage: torchtitan splits its models into stages by its own pipelining); None for
    tally's decoder of holder modules."""
    return families.FAMILIES.get(case["model"].get("preset")) if case["topology"]["pp"] == 1 else None


def build(run, layouts, world):
    """torchtitan's meshes for the case (`dims`, kept in `layouts`), the case's model on this rank's
    stage with its params placed as torchtitan places them, and torchtitan's own FSDP wrapping
    (`model`, `by_name`), onto `run`."""
    import torch
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    # The configuration as tally's run/torchtitan/rules.cpp wrote it (the one author of it: `tally
    # show` prints the same).
    run.config = run.request.engine_config()
    parallelism = run.config["parallelism"]
    run.dims = dims = layouts.parallel_dims(parallelism, world)
    run.pp_mesh = dims.get_optional_mesh("pp")
    stage = run.pp_mesh.get_local_rank() if run.pp_mesh is not None else 0
    (dense, sparse), (dp_mesh, dp_dims, edp_mesh, edp_dims) = layout_meshes(dims, parallelism["spmd_backend"])
    if _family_of_case(run.case):
        built = FamilyModel(run.case["model"], run.index, run.tensors, dims, parallelism["spmd_backend"],
                            (dp_mesh, dp_dims, edp_mesh, edp_dims), run.device)
        run.model, run.by_name = built.model, built.by_name
        return
    tied = not run.case["model"]["untie_embeddings_and_output_weights"]
    ep = run.case["topology"]["ep"]
    built = StageModel(run.index, run.tensors, stage, (dense, sparse), ep, tied, run.device)
    apply_fsdp_to_decoder(built.model, dp_mesh, torch.float32, torch.float32, run.case["topology"]["pp"] > 1,
                          ep_degree=ep, edp_mesh=edp_mesh, dp_mesh_dims=dp_dims, edp_mesh_dims=edp_dims)
    run.model, run.by_name = built.model, built.by_name


def group_position(dims, axes):
    """(this rank's position among the ranks torchtitan's one-axis meshes `axes` span together, read
    row-major; their number). An axis of size 1 (torchtitan builds no mesh for it) adds nothing."""
    position, size = 0, 1
    for axis in axes:
        mesh = dims.get_optional_mesh(axis)
        if mesh is not None:
            position, size = position * mesh.size() + mesh.get_local_rank(), size * mesh.size()
    return position, size


def contributions_of(run):
    """This rank's share of each of its params' gradients (model path -> numpy array of the param's
    logical shape, experts stacked): FSDP2 sums a dense gradient over torchtitan's FSDP mesh
    (dp_replicate x fsdp) and a routed expert's with EP over its sparse one (dp_replicate x efsdp),
    never dividing (torchtitan sets the divide factor to 1), so tally dealt every gradient into one
    nonzero share per rank of each group size (run/torchtitan/rules.h), exact in fp32 whatever order
    FSDP2 adds them in. A param TP replicates takes its share over the FSDP group times TP: under
    torchtitan's sequence parallelism its gradient is Partial over TP, which FSDP2 sums first. A rank
    takes the share at its position in torchtitan's meshes of that group."""
    import numpy as np

    dims = run.dims
    # "loss" spans dp_replicate x dp_shard x cp: the ranks of one (pp, tp) lane, FSDP's dense group.
    groups = {"dense": group_position(dims, ["loss"]), "tp-replicated": group_position(dims, ["loss", "tp"])}
    groups["expert"] = group_position(dims, ["dp_replicate", "efsdp"]) if dims.ep_enabled else groups["dense"]
    classes = {p["name"]: p["class"] for p in run.index}
    shares = {}
    out = {}
    for path, p in run.model.named_parameters():
        _, segs, _ = run.by_name[path]
        group = "expert" if dims.ep_enabled and classes[segs[0].logical].startswith("expert-") else \
            "tp-replicated" if fsdp2.replicated_over(p, "tp") else "dense"
        at, size = groups[group]
        if size not in shares:
            shares[size] = run.request.shares(size)
        out[path] = families.assemble(path, p.shape, segs, lambda name, of=shares[size], at=at: np.asarray(of[name][at]))
    return out


def reduce_contributions(run):
    """Each rank's contributions, reduced by FSDP2 itself (tally_adapters.fsdp2): each param's
    gradient is then what FSDP2's reduce-scatter (and HSDP's all-reduce) left this rank."""
    # FSDP2 reduces with PREMUL_SUM (torchtitan sets a divide factor), which gloo lacks.
    with gloo_shims.installed():
        fsdp2.backward_through_fsdp2(run.model, fsdp2.local_term(contributions_of(run), run.device, partial_over=("tp",)))


def set_gradients(run):
    """Every param's gradient (`before`, by param) and the manifest pieces of what each rank holds
    (`pieces`); returns the logical names held. After the reduction: tally's logical gradient placed
    as the param is. Before it: each rank's contribution, reduced by FSDP2 (reduce_contributions);
    the judge checks what it left against tally's gradient."""
    import numpy as np
    import torch

    named = [(n, p) for n, p in run.model.named_parameters() if p.requires_grad]
    logical = {id(p): run.by_name[name] for name, p in named}
    if run.case["torchtitan"].get("gradients_enter") == "before_reduction":
        reduce_contributions(run)
        boxes, run.before = fsdp2.held_gradients([p for _, p in named])
    else:
        run.before, boxes = {}, {}
        for name, p in named:
            full = torch.from_numpy(np.ascontiguousarray(logical[id(p)][0])).to(run.device)
            boxes[id(p)], run.before[id(p)] = tally_dtensor.place_gradient(p, full, name)
    run.params = [p for _, p in named]
    run.pieces = pieces_of(named, logical, boxes, {p["name"]: p["shape"] for p in run.index})
    return {piece.logical_name for piece in run.pieces}


def clip(run):
    """The clip the case names over every param, with the case's max_norm (infinity where the case
    does not clip): its norm (`norm`) and the gradients after it (`after`)."""
    import torch
    from torch.distributed.tensor import DTensor
    from torchtitan.distributed import utils as dist_utils

    max_norm = float(run.config["training"]["max_norm"])
    limit = max_norm if max_norm > 0 else math.inf
    if run.config["clip"] == "torchtitan":
        total = dist_utils.clip_grad_norm_(run.params, limit, foreach=True, pp_mesh=run.pp_mesh,
                                           ep_enabled=run.dims.ep_enabled)
    else:
        total = torch.nn.utils.clip_grad_norm_(run.params, limit, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    run.norm = float(total)
    run.after = {id(p): tally_dtensor.local_values(p.grad) for p in run.params}


def manifest(run, producer):
    """This rank's manifest: one child per half torchtitan's clip splits (EP and non-EP) and per mesh
    and placements, each over the world (tally_dtensor)."""
    import torch.distributed as dist

    config, dims, params = run.config, run.dims, run.params
    t = run.case["topology"]
    tp, ep = t["tp"], t["ep"]
    max_norm = float(config["training"]["max_norm"])
    world = dist.get_world_size()

    def child_of(p):
        half = "ep" if config["clip"] == "torchtitan" and dims.ep_enabled and \
            "ep" in (getattr(getattr(p, "device_mesh", None), "mesh_dim_names", None) or ()) else "dense"
        return (half,) + tally_dtensor.signature(p)

    children = tally_dtensor.canonical_children([child_of(p) for p in params], world)
    clips = tally_dtensor.clip_coefficients(children, params, child_of, run.before, run.after, max_norm, run.norm) \
        if max_norm > 0 else None
    tp_group = sorted(dims.get_optional_mesh("tp").mesh.flatten().tolist()) if tp > 1 else [dist.get_rank()]
    half_names = {"ep": "EP half", "dense": "non-EP half"}
    code = "torch.nn.utils.clip_grad_norm_" if config["clip"] == "torch" else "torchtitan clip_grad_norm_"
    return tally_dtensor.build_manifest(
        run.pieces, child_of, children, lambda p: run.before[id(p)],
        child_names=lambda key: f"{code} {half_names[key[0]] if dims.ep_enabled else 'params'} on "
                                f"({', '.join(key[1:])})",
        groups={"tp": tp_group, "expt_tp": tp_group if ep == 1 else [dist.get_rank()]},
        parallel={"tp": tp, "cp": t["cp"], "pp": t["pp"], "dp": world // (tp * t["cp"] * t["pp"]), "ep": ep,
                  "etp": t["etp"]},
        producer=producer,
        reported_norm=run.norm,
        clips=clips,
        clipped_of=lambda p: run.after[id(p)],
    )


class TorchTitanWorker(base.Worker):
    """tally's worker for torchtitan: executes tally's cases with torchtitan's meshes, FSDP2 wrapping and clip."""

    framework = "torchtitan"
    package = "torchtitan"
    plants = PLANTS
    not_planted = NOT_PLANTED

    def __init__(self, backend, devices, world):
        super().__init__(backend, devices, world)
        self.layouts = Layouts()

    def framework_version(self):
        import torchtitan

        return torchtitan.__version__

    def start(self):
        import torchtitan.distributed.parallel_dims as parallel_dims
        import torchtitan.distributed.utils  # noqa: F401  (planted faults replace its functions)

        if self.devices == 0:
            parallel_dims.device_type = "cpu"

    def dtypes(self):
        return ["fp32"]

    def build(self, run):
        build(run, self.layouts, self.world)

    def set_gradients(self, run):
        return set_gradients(run)

    def norm_step(self, run):
        clip(run)

    def manifest(self, run):
        return manifest(run, self.producer())


def main(argv=None):
    return base.run(TorchTitanWorker, argv)


if __name__ == "__main__":
    sys.exit(main())
