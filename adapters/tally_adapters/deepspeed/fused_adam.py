"""DeepSpeed's FusedAdam op, built before the worker's hello (tally_adapters.deepspeed.worker), and
the CUDA architecture list DeepSpeed's op builder can read.

DeepSpeed 0.19.8's builder reads TORCH_CUDA_ARCH_LIST as entries "major.minor" or
"major.minor+PTX" and converts both numbers with int() (op_builder/builder.py, compute_capability_args),
while torch's own forms include architecture-specific ("9.0a", "10.0f") and named ("Hopper") entries:
`invalid literal for int() with base 10: '0a'`. The worker builds the op for the list in the form
DeepSpeed reads, and leaves the variable as it found it.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Optional, Tuple

# torch.utils.cpp_extension's named architectures, as it expands them.
NAMED_ARCHITECTURES = {
    "Kepler+Tesla": "3.7", "Kepler": "3.5+PTX", "Maxwell+Tegra": "5.3", "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX", "Volta+Tegra": "7.2", "Volta": "7.0+PTX", "Turing": "7.5+PTX",
    "Ampere+Tegra": "8.7", "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX",
}
_ENTRY = re.compile(r"(\d+)\.(\d+)[a-z]?(\+PTX)?")


def deepspeed_arch_list(given: Optional[str], capability: Tuple[int, int]) -> str:
    """`given` (TORCH_CUDA_ARCH_LIST, ';' or whitespace between entries) in the form DeepSpeed's op
    builder reads: each entry "major.minor" with an optional "+PTX", an architecture-specific suffix
    dropped ("9.0a" -> "9.0"), a named architecture expanded, each once in the order given. Entries
    of no such form are left out; when none is left (or none was given), the device's `capability`."""
    entries = []
    for token in re.split(r"[;\s]+", (given or "").strip()):
        for entry in NAMED_ARCHITECTURES.get(token, token).split(";"):
            match = _ENTRY.fullmatch(entry)
            if match:
                form = f"{match.group(1)}.{match.group(2)}{match.group(3) or ''}"
                if form not in entries:
                    entries.append(form)
    return ";".join(entries) or f"{capability[0]}.{capability[1]}"


@contextlib.contextmanager
def arch_list(value: Optional[str]):
    """TORCH_CUDA_ARCH_LIST set to `value` (unset for None) for the block, then as it was."""
    before = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if value is None:
        os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
    else:
        os.environ["TORCH_CUDA_ARCH_LIST"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = before


def prepare_fused_adam(devices):
    """Builds DeepSpeed's FusedAdam op (or loads it from torch's extension cache) before the hello,
    so no case pays for the build or fails on it; returns why it cannot run here, or None.

    Rank 0 builds first while the others wait (the build is once per machine), then each loads it;
    every rank learns the first rank's failure. On a GPU the op is built for the architecture list
    DeepSpeed can read (deepspeed_arch_list); the variable is as it was afterwards, and the loaded op
    stays in DeepSpeed's cache of loaded ops for every later FusedAdam."""
    import torch
    import torch.distributed as dist

    given = os.environ.get("TORCH_CUDA_ARCH_LIST")
    arch = deepspeed_arch_list(given, torch.cuda.get_device_capability()) if devices else given

    def load():
        try:
            from deepspeed.ops.op_builder import FusedAdamBuilder

            with arch_list(arch):
                FusedAdamBuilder().load(verbose=False)
        except Exception as error:  # the compiler's or the loader's error, whatever its class
            first = (str(error).strip().splitlines() or [""])[0][:300]
            said = f"TORCH_CUDA_ARCH_LIST {arch or 'unset'}" + (f", from {given!r}" if given not in (None, arch) else "")
            return (f"DeepSpeed's FusedAdam op did not build on rank {dist.get_rank()} "
                    f"({said}): {type(error).__name__}: {first}")
        return None

    reason = load() if dist.get_rank() == 0 else None
    dist.barrier()
    if dist.get_rank() != 0:
        reason = load()
    reasons = [None] * dist.get_world_size()
    dist.all_gather_object(reasons, reason)
    return next((r for r in reasons if r), None)
