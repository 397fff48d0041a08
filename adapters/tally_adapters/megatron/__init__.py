"""megatron-core: the manifests of a Megatron-core optimizer's grad-norm step (manifest.py, whose
docstring gives the call order), one call for a framework's own tests (`check_grad_norm`), and
tally's worker (`python -m tally_adapters.megatron.worker`, under torchrun). Megatron and torch
are imported when a function needs them, not here."""

from ..check import GradNormMiscount, TallyCannotJudge  # noqa: F401
from .manifest import (  # noqa: F401
    ClipCall,
    build_manifest,
    check_grad_norm,
    dump_manifest,
    release_clip,
)
