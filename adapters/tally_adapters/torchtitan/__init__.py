"""tally_adapters.torchtitan: tally's worker for torchtitan (`tally ... --target torchtitan`): tally's cases
on torchtitan's own meshes, FSDP2 wrapping and gradient clipping, recorded by tally_adapters.dtensor."""
