"""A preset case as torchtitan's own model of its family (tally_adapters.torchtitan.families), built
as torchtitan builds it for training: the family's builders at the case's sizes, the family's own
sharding config (`set_<family>_sharding_config`, what its `update_from_config` sets), the model's
own `parallelize` on torchtitan's ParallelDims (TP and EP placements, as the family's parallelize
function calls it) and the family's FSDP wrapping. Its params keep torchtitan's names; each holds
rows of tally's logical params (families.segments), which the manifests name."""

from . import families


class FamilyModel:
    """`model`: torchtitan's model of the case's preset on this rank, parallelized and FSDP-wrapped;
    `by_name[path]`: (the param's whole tensor of tally's logical values, the segments it holds,
    whether it stacks experts)."""

    def __init__(self, case_model, index, tensors, dims, spmd_backend, meshes, device):
        import torch
        from torchtitan.config import ParallelismConfig
        from torchtitan.distributed.full_dtensor import validate_config

        family = families.family_of(case_model)
        config = families.model_config(case_model, index)
        # Sequence parallelism as torchtitan's job config has it by default (the reduction groups of
        # run/torchtitan/rules.h assume it).
        families.set_sharding(config, family, enable_sp=ParallelismConfig().enable_sequence_parallel,
                              enable_ep=dims.ep_enabled)
        with torch.device(device):
            model = config.build()
        # As the family's parallelize function does (e.g. torchtitan/models/qwen3/parallelize.py:44-57).
        if spmd_backend in ("full_dtensor", "spmd_types"):
            validate_config(dims, model)
            model.parallelize(dims)
        elif dims.tp_enabled or dims.ep_enabled:
            model.parallelize(dims)
        segs = families.segments(case_model, index)
        families.check_cover(segs, {n: list(p.shape) for n, p in model.named_parameters()}, index)
        self.by_name = {}
        for name, p in model.named_parameters():
            full = families.assemble(name, p.shape, segs[name], lambda logical: tensors[logical])
            self.by_name[name] = (full, segs[name], families.stacked(name))
        dp_mesh, dp_dims, edp_mesh, edp_dims = meshes
        families.fsdp_of(family)(model, dp_mesh, torch.float32, torch.float32, False, ep_degree=dims.ep,
                                 edp_mesh=edp_mesh, dp_mesh_dims=dp_dims, edp_mesh_dims=edp_dims)
        self.model = model
