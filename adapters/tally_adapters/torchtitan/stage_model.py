"""tally's model as a torchtitan decoder on one pipeline stage (tally_adapters.torchtitan.worker
builds it): `tok_embeddings`, `layers` (a MoE layer's routed experts stacked into one tensor per
weight under `moe.routed_experts.inner_experts`, as torchtitan's grouped experts are), `norm` and
`lm_head`, each param a DTensor placed as torchtitan's sharding places its kind."""

import re

from ..hf_models import Segment
from ..module_keys import module_key

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.(\d+)\.(.+)$")


def holder(named=None):
    """A module holding `named` params (name -> tensor) under names without dots."""
    import torch.nn as nn

    module = nn.Module()
    for name, tensor in (named or {}).items():
        module.register_parameter(module_key(name), nn.Parameter(tensor))
    return module


def placements(mesh, split_dim, over):
    """Shard(split_dim) on the mesh dim named `over`, Replicate on every other (all where split_dim
    is None)."""
    from torch.distributed.tensor import Replicate, Shard

    return [Shard(split_dim) if name == over and split_dim is not None else Replicate()
            for name in mesh.mesh_dim_names]


def placed(full, mesh, split_dim, over):
    """`full` (the whole logical tensor) as a param: a DTensor on `mesh` where there is one."""
    from torch.distributed.tensor import distribute_tensor

    if mesh is None:
        return full.clone()
    return distribute_tensor(full, mesh, placements(mesh, split_dim, over), src_data_rank=None)


class StageModel:
    """This rank's stage of tally's model as a torchtitan decoder, and what each of its params holds:
    `logical[id(param)]` is (full logical tensor, the rows of logical params it holds: one Segment of a
    whole param, or of a stack expert e's at rows e*R.. of its first two dims, stacked: whether its
    dim 0 is experts), as tally_adapters.torchtitan.families gives them for torchtitan's own models."""

    def __init__(self, index, tensors, stage, meshes, ep, tied, device):
        import numpy as np
        import torch
        import torch.nn as nn

        dense_mesh, sparse_mesh = meshes
        self.logical = {}
        blocks, experts, tok, norm, head = {}, {}, {}, {}, {}
        classes = {p["name"]: p["class"] for p in index}
        shapes = {p["name"]: list(p["shape"]) for p in index}
        # The dim TP splits each param along (the gradient index's, from its class); None: replicated.
        splits = {p["name"]: p["split_dim"] for p in index}

        def make(name, values, stacked=False):
            full = torch.from_numpy(values.copy()).to(device)
            split = splits[name]
            if classes[name].startswith("expert-"):
                if ep > 1:
                    return placed(full, sparse_mesh, 0, "ep")
                # Of a stacked expert tensor [E, ...] without EP: the expert's own dim plus one.
                return placed(full, dense_mesh, None if split is None else split + stacked, "tp")
            return placed(full, dense_mesh, split, "tp")

        for p in index:
            if p["stage"] != stage:
                continue
            name = p["name"]
            expert = _EXPERT.match(name)
            if expert:
                layer, e, suffix = int(expert.group(1)), int(expert.group(2)), expert.group(3)
                experts.setdefault(layer, {}).setdefault(suffix, {})[e] = name
                continue
            layer = _LAYER.match(name)
            if layer:
                blocks.setdefault(int(layer.group(1)), {})[layer.group(2)] = name
            elif name.startswith("embedding."):
                tok[name[len("embedding."):]] = name
            elif name.startswith("decoder.final_layernorm."):
                norm[name[len("decoder.final_layernorm."):]] = name
            elif name.startswith("output_layer."):
                head[name[len("output_layer."):]] = name
            else:
                raise ValueError(f"model mismatch: the worker has no place in a torchtitan decoder for {name}")

        def module_of(entries):
            if not entries:
                return None
            named = {}
            for local, name in entries.items():
                named[local] = make(name, tensors[name])
            module = holder(named)
            for local, name in entries.items():
                param = getattr(module, module_key(local))
                self.logical[id(param)] = (tensors[name], [Segment(0, shapes[name][0], name, 0)], False)
            return module

        self.model = holder()
        self.model.enable_weight_tying = tied
        self.model.tok_embeddings = module_of(tok)
        self.model.norm = module_of(norm)
        self.model.lm_head = module_of(head)
        self.model.layers = nn.ModuleDict()
        for layer in sorted(set(blocks) | set(experts)):
            block = module_of(blocks.get(layer, {})) or holder()
            block.moe_enabled = layer in experts
            if layer in experts:
                stacked = {}
                for suffix, by_expert in experts[layer].items():
                    names = [by_expert[e] for e in sorted(by_expert)]
                    if sorted(by_expert) != list(range(len(names))):
                        raise ValueError(f"model mismatch: layer {layer}'s experts of {suffix} are {sorted(by_expert)}")
                    full = np.stack([tensors[n] for n in names])
                    param = nn.Parameter(make(names[0], full, stacked=True))
                    rows = shapes[names[0]][0]
                    stacked[suffix] = (param, full, [Segment(e * rows, (e + 1) * rows, n, 0) for e, n in enumerate(names)])
                inner = holder()
                inner.num_experts = len(next(iter(experts[layer].values())))
                for suffix, (param, full, logical) in stacked.items():
                    inner.register_parameter(module_key(suffix), param)
                    self.logical[id(param)] = (full, logical, True)
                block.moe = holder()
                block.moe.routed_experts = holder()
                block.moe.routed_experts.inner_experts = inner
            self.model.layers[str(layer)] = block
        # FSDP replaces every param by its sharded DTensor under the same name.
        self.by_name = {name: self.logical[id(p)] for name, p in self.model.named_parameters()}
