"""DeepSpeed: what one `engine.step()` counted in its gradient norm (`Recording`), the manifests of
it (`build_manifest`, `dump_manifest`), and tally's worker (`python -m
tally_adapters.deepspeed.worker`, under torchrun). DeepSpeed and torch are imported when a
function needs them, not here."""

from ..manifest import write_run as dump_manifest  # noqa: F401  (the one writer, under the name users call)
from .recording import Recording, build_manifest, expert_groups_by_name  # noqa: F401
