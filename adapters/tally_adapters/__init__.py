"""tally's adapters: what a framework counted in its gradient norm, written as the manifests
`tally check` judges (docs/manifest.md), and the workers through which `tally run|replay|fuzz
--target <framework>` executes tally's cases on the framework itself (docs/real-targets.md).

    tally_adapters.manifest        the manifest format: version, group table, atomic writer
    tally_adapters.check           judging a run's manifests with the tally binary, from the run
    tally_adapters.pytest_plugin   the `tally_grad_norm` fixture for a framework's own tests
    tally_adapters.worker          what every framework's worker shares (queue, plants, hello)
    tally_adapters.megatron        megatron-core: dump_manifest, check_grad_norm, its worker
    tally_adapters.deepspeed       DeepSpeed: Recording, build_manifest, its worker

Importing this package, or any of the modules above but a framework's worker, needs neither
torch nor a framework: each is imported where it is used.
"""

__version__ = "0.2.0"
