"""DeepSpeed: what one `engine.step()` counted in its gradient norm (`Recording`), the manifests of
it (`build_manifest`, `dump_manifest`), and tally's worker (`python -m
tally_adapters.deepspeed.worker`, under torchrun). DeepSpeed and torch are imported when a
function needs them, not here."""

from .recording import Recording, build_manifest, dump_manifest, expert_groups_by_name  # noqa: F401
