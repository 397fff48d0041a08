"""Stand-ins the adapter tests share: torch.distributed for rank 0 of a world whose other ranks
answer what a test scripts. No torch is imported; a test puts `modules_with(dist)` into sys.modules
for as long as it runs the code under test (mock.patch.dict)."""

import types


class FakeDistributed(types.ModuleType):
    """torch.distributed as rank 0 of `world` sees it: every other rank's part of an
    all_gather_object is `peers_answer(what rank 0 sent)`."""

    class ProcessGroup:
        pass

    def __init__(self, world, peers_answer=lambda mine: mine):
        super().__init__("torch.distributed")
        self.world = world
        self.peers_answer = peers_answer
        self.group = types.SimpleNamespace(WORLD=self.ProcessGroup())
        # torch's registry of the groups it made: the world and one a case made on its own.
        self.case_group = self.ProcessGroup()
        self.distributed_c10d = types.SimpleNamespace(
            _world=types.SimpleNamespace(pg_map={self.group.WORLD: None, self.case_group: None}))
        self.destroyed = []
        self.gathered = []  # what rank 0 sent to each all_gather_object, in order

    def get_world_size(self, group=None):
        return self.world

    def get_rank(self, group=None):
        return 0

    def all_gather_object(self, out, mine):
        self.gathered.append(mine)
        out[0] = mine
        for i in range(1, self.world):
            out[i] = self.peers_answer(mine)

    def destroy_process_group(self, group):
        self.destroyed.append(group)


def modules_with(dist, **more):
    """sys.modules entries for a `torch` whose distributed package is `dist`, and `more` (name ->
    module) beside it."""
    torch = types.ModuleType("torch")
    torch.distributed = dist
    return {"torch": torch, "torch.distributed": dist, **more}
