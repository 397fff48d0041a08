"""The case's pipeline (PP > 1) on DeepSpeed's own pipeline engine.

DeepSpeed's pipeline parallelism is its own engine: a PipelineModule of layer specs, which makes
its own grid of process groups (PipeModelDataParallelTopology: TP fastest, then DP, then PP,
tally's default order) and hands it to DeepSpeed as the mpu. Each stage is one layer holding the
params tally's model places on it; a tied word embedding is a TiedLayerSpec on the first and the
last stage, so DeepSpeed itself marks the last stage's copy `ds_pipe_replicated` and sums the
copies' gradients. Each layer adds sum(param * weight) to the activation it passes on, and the
last stage's loss is that activation (its first entry): the gradient of every param is its
weight, reached through DeepSpeed's own schedule (train_batch), p2p sends, tied and data-parallel
reductions.
"""

from ..module_keys import module_key
from .models import EXPERT_PARAM_NAME, dense_param, local_box, moe_layer, split_experts


def stage_block_class():
    import torch.distributed as dist
    import torch.nn as nn

    class StageBlock(nn.Module):
        """The params tally's model places on one stage (or the tied word embedding), TP-sharded
        as build_model shards them, each MoE layer a deepspeed.moe.layer.MoE; `weights[id(param)]`
        is set to each one's gradient before the step."""

        def __init__(self, entries, moe, tp, dtype):
            super().__init__()
            tp_rank = dist.get_rank() % tp  # TP is the fastest axis of DeepSpeed's grid
            splits = {p["name"]: p["split_dim"] for p in entries}
            shapes = {p["name"]: list(p["shape"]) for p in entries}
            dense, moe_layers = split_experts(splits)
            self.params = nn.ParameterDict()
            self.moe = nn.ModuleDict()
            self.described, self.layers, self.weights = {}, {}, {}
            routers = {f"{prefix}router.weight" for prefix in moe_layers}
            for name in dense:
                if name not in routers:
                    p, self.described[id(p)] = dense_param(name, shapes, splits, tp_rank, tp, dtype)
                    self.params[module_key(name)] = p
            for prefix, suffixes in moe_layers.items():
                layer, wg, self.described[id(wg)] = moe_layer(prefix, suffixes, shapes, splits, moe, tp_rank, tp,
                                                              dtype)
                self.moe[module_key(prefix)] = self.layers[prefix] = layer
            self.shapes, self.splits = shapes, splits

        def forward(self, x):
            for p in self.parameters():
                x = x + (p * self.weights[id(p)]).sum()
            return x

    return StageBlock


def pipeline_plan(index, pp):
    """([the gradient index entries of each stage's params], the tied word embedding's or None): a
    param on its `stage`, the one with a last-stage copy on neither (it is a tied layer of the first
    and the last stage)."""
    stages, tied = [[] for _ in range(pp)], None
    for p in index:
        stage = p["stage"]
        if not 0 <= stage < pp:
            raise LookupError(f"model mismatch: {p['name']} is on stage {stage} of a pipeline of {pp}")
        if p.get("last_stage_copy", False):
            tied = p
        else:
            stages[stage].append(p)
    return stages, tied


def check_pipeline_plan(stages, tied, moe, tp):
    """Raises what building any stage's layers would raise (a split TP does not divide, a router
    that is not DeepSpeed's gate). Each rank builds only its own stage, inside collectives the other
    stages wait in, so the checks run on every rank for every stage first."""
    for entries in stages + ([[tied]] if tied is not None else []):
        splits = {p["name"]: p["split_dim"] for p in entries}
        shapes = {p["name"]: list(p["shape"]) for p in entries}
        _, moe_layers = split_experts(splits)
        for name, split_dim in splits.items():
            expert = EXPERT_PARAM_NAME.match(name) is not None
            split = tp if not expert or moe["expert_tp"] else 1
            for tp_rank in range(split):
                local_box(shapes[name], split_dim, tp_rank, split)
        for prefix in moe_layers:
            gate = [moe["experts"], moe["hidden"]]
            if shapes[f"{prefix}router.weight"] != gate:
                raise LookupError(f"model mismatch: DeepSpeed's gate is {gate}, {prefix}router.weight "
                                  f"{shapes[f'{prefix}router.weight']}")


def build_pipeline(case, index, moe, dtype, world):
    """The PipelineModule of the case (each rank builds only its own stage), and this rank's
    StageBlocks."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    t = case["topology"]
    tp, pp = t["tp"], t["pp"]
    StageBlock = stage_block_class()
    stages, tied = pipeline_plan(index, pp)
    check_pipeline_plan(stages, tied, moe, tp)
    # Two layer specs per stage, so DeepSpeed's uniform partition gives each stage its own.
    layers = []
    for s, entries in enumerate(stages):
        specs = [LayerSpec(StageBlock, entries, moe, tp, dtype)]
        if tied is not None and s in (0, pp - 1):
            tied_layer = TiedLayerSpec("word_embeddings", StageBlock, [tied], moe, tp, dtype,
                                       tied_weight_attr=[f"params.{tied['name'].replace('.', '__')}"])
            specs.insert(0 if s == 0 else 1, tied_layer)
        else:
            specs.append(LayerSpec(StageBlock, [], moe, tp, dtype))
        layers += specs
    topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=world // (tp * pp))
    # The loss is the activation's first entry. The activation has TP entries per TP rank, as
    # DeepSpeed splits activations over the TP group between stages (pipe_partitioned). Built
    # without autograd: the tied layers' first broadcast writes into a param, which gloo on a
    # GPU tensor does as an in-place copy autograd would refuse (ranks sharing a GPU use gloo).
    import torch

    with torch.no_grad():
        module = PipelineModule(layers=layers, topology=topology, loss_fn=lambda out, label: out[0],
                                partition_method="uniform")
    blocks = [block for block in module.modules() if isinstance(block, StageBlock)]
    return module, blocks


def make_expert_groups_on_every_stage(module, moe):
    """DeepSpeed's MoE layer makes its expert groups when the engine is built, on the ranks that hold
    one: in a pipeline whose stages do not all hold MoE layers, the other ranks never call
    new_group for them, their count of torch's groups falls behind, and the next group made on
    every rank (the next case's first) waits forever. Made here, before the engine, on every rank,
    with the function and arguments the layer would use; the layers then find them made."""
    from deepspeed.utils import groups

    groups.mpu = module.mpu()  # the pipeline grid, which deepspeed.initialize sets too
    if f"ep_size_{moe['ep']}" in groups._get_expert_parallel_group_dict():
        return
    if moe["expert_tp"]:
        groups._create_expert_data_and_model_parallel(moe["ep"], mpu=groups.mpu)
    else:
        groups._create_expert_and_data_parallel(moe["ep"])


def stage_pipeline_p2p_through_host(p2p):
    """gloo's send and recv fail on GPU tensors ("Bad address"), and ranks that share a GPU use
    gloo: DeepSpeed's pipeline sends (deepspeed.runtime.pipe.p2p.send/recv, which its engine calls
    through the module) are made through host copies for the worker's life. The values are the
    same; only where the bytes travel from changes."""
    import torch

    send, recv = p2p.send, p2p.recv

    def host_send(tensor, dest_stage, async_op=False):
        return send(tensor.detach().cpu() if tensor.is_cuda else tensor, dest_stage, async_op)

    def host_recv(tensor, src_stage, async_op=False):
        if not tensor.is_cuda:
            return recv(tensor, src_stage, async_op)
        staged = torch.empty_like(tensor, device="cpu")
        done = recv(staged, src_stage, async_op)
        with torch.no_grad():
            tensor.copy_(staged)
        return done

    p2p.send, p2p.recv = host_send, host_recv


def pipeline_groups(grid, expert_tp=False):
    """This rank's groups by name, from DeepSpeed's pipeline grid: `mp` is the grid's model
    group (every stage and TP rank of one data-parallel index), the group DeepSpeed's norms sum over."""
    topology = grid.topology()
    mp = sorted(topology.get_axis_list(axis="data", idx=grid.get_data_parallel_rank()))
    tp = sorted(getattr(grid, "slice_group", [grid.get_global_rank()]))
    return {"tp": tp, "mp": mp, "dp": sorted(grid.get_data_parallel_group_ranks()), "pp": sorted(grid.pp_group),
            "expert_tp": expert_tp}
