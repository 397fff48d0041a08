"""The case's process groups: the Megatron-style `mpu` DeepSpeed is given (Mpu), each rank's
groups by name as the manifests state them, and the groups a case made, destroyed after it
together with what DeepSpeed keeps of them (CaseGroups, forget_deepspeed_groups).
"""

import gc

from ..plants import Patches
from .recording import expert_groups_by_name


class Mpu:
    """The Megatron-style model-parallel unit DeepSpeed reads (TP only: PP and CP are 1)."""

    def __init__(self, tp):
        import torch.distributed as dist

        world, rank = dist.get_world_size(), dist.get_rank()
        self.tp, self.rank = tp, rank
        self.tp_ranks = self.dp_ranks = None
        for first in range(0, world, tp):
            ranks = list(range(first, first + tp))
            g = dist.new_group(ranks)
            if rank in ranks:
                self.tp_group, self.tp_ranks = g, ranks
        for i in range(tp):
            ranks = list(range(i, world, tp))
            g = dist.new_group(ranks)
            if rank in ranks:
                self.dp_group, self.dp_ranks = g, ranks

    def get_model_parallel_rank(self):
        return self.tp_ranks.index(self.rank)

    get_tensor_model_parallel_rank = get_model_parallel_rank

    def get_model_parallel_world_size(self):
        return self.tp

    get_tensor_model_parallel_world_size = get_model_parallel_world_size

    def get_model_parallel_group(self):
        return self.tp_group

    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self):
        return self.dp_ranks.index(self.rank)

    def get_data_parallel_world_size(self):
        return len(self.dp_ranks)

    def get_data_parallel_group(self):
        return self.dp_group

    def get_pipeline_model_parallel_world_size(self):
        return 1

    def get_pipeline_model_parallel_rank(self):
        return 0
def autotp_groups(mpu):
    """This rank's groups as AutoTP made them (deepspeed.utils.groups, the engine's mpu)."""
    import torch.distributed as dist

    tp = dist.get_process_group_ranks(mpu.get_tensor_model_parallel_group())
    return {"tp": tp, "mp": dist.get_process_group_ranks(mpu.get_model_parallel_group()),
            "dp": dist.get_process_group_ranks(mpu.get_data_parallel_group()), "expert_tp": False}


def groups_of_rank(layers, mpu, expert_tp):
    """This rank's groups by name, as tally_deepspeed.build_manifest reads them."""
    mine = {"tp": list(mpu.tp_ranks), "mp": list(mpu.tp_ranks), "dp": list(mpu.dp_ranks), "expert_tp": expert_tp}
    return expert_groups(mine, layers)


def expert_groups(mine, layers):
    """`mine` with each MoE layer's expert-parallel and expert-data-parallel groups added."""
    return expert_groups_by_name(mine, {layer.expert_group_name for layer in layers.values()})


class CaseGroups:
    """Every process group made while a case is set up (by the worker, DeepSpeed's expert groups,
    its pipeline grid and tied-layer groups), destroyed when the case ends, so a long campaign
    holds no more groups than one case needs."""

    def __init__(self):
        self.made, self.patches = [], None

    def __enter__(self):
        import torch.distributed as dist

        self.patches = Patches()
        original = dist.new_group

        def new_group(*args, **kwargs):
            group = original(*args, **kwargs)
            self.made.append(group)
            return group

        self.patches.replace(dist, "new_group", new_group)
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        if self.patches is not None:
            self.patches.restore()
        for g in self.made:
            if g is None or g == dist.GroupMember.NON_GROUP_MEMBER:
                continue
            try:
                dist.destroy_process_group(g)
            except Exception:  # a group torch already released
                pass
        self.made.clear()
        return False


def release_engines(engines):
    """Destroys the case's engines (the last references to them) and collects what they held."""
    while engines:
        engine = engines.pop()
        if hasattr(engine, "destroy"):
            engine.destroy()
        del engine
    gc.collect()


def forget_deepspeed_groups():
    """DeepSpeed keeps its expert groups and mpu in module globals: each case builds its own."""
    from deepspeed.utils import groups

    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_DATA_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS",
                 "_EXPERT_DATA_PARALLEL_GROUP_RANKS", "_ALL_TO_ALL_GROUP"):
        getattr(groups, name).clear()
    # its clone of the world group (a case without an mpu makes one), destroyed with the case's groups
    groups._WORLD_GROUP = None
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
    groups.mpu = None
    groups.expert_tensor_parallel_world_size = 1
    # AutoTP's TP/DP groups (a DeviceMesh's, made without dist.new_group): the next case makes its own
    import torch.distributed as dist

    for name in ("_TENSOR_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP"):
        group = getattr(groups, name)
        # A mesh dimension spanning every rank is the default group itself: that one stays.
        if group not in (None, dist.GroupMember.NON_GROUP_MEMBER, dist.GroupMember.WORLD):
            try:
                dist.destroy_process_group(group)
            except Exception:  # a group torch already released
                pass
    for name in ("_TENSOR_MODEL_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP",
                 "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_RANK", "mesh_device"):
        setattr(groups, name, None)
    # what deepspeed.tp_model_init records (the Trainer's deepspeed_init calls it with AutoTP) and
    # every later deepspeed.initialize merges into its config: the next case states its own
    from deepspeed.runtime.tensor_parallel import init_utils

    init_utils._TP_MODEL_INIT_ARGS = None
    # deepspeed.initialize puts AutoTP's layers into training mode for the whole process
    from deepspeed.module_inject import layers

    layers.set_autotp_mode(training=False)
