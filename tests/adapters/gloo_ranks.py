"""Two ranks on this CPU over gloo, for the tests that need torch.distributed for real
(test_fsdp2.py, test_gloo_shims.py): each rank runs `checks(rank)` inside a process group of its
own process and reports what happened; the test passes when every rank reports ok."""

import os
import tempfile

WORLD = 2


def _rank_main(checks, rank, path, reports):
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
        try:
            checks(rank)
        finally:
            dist.barrier()
            dist.destroy_process_group()
        reports.put(f"rank {rank}: ok")
    except BaseException as error:  # reported by the parent, with the rank
        reports.put(f"rank {rank}: {type(error).__name__}: {error}")


def assert_every_rank_passes(test, checks):
    """Runs `checks` (a module-level function of the rank, so spawn can pickle it) on every rank
    and fails `test` with each rank's report unless all say ok."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    reports = context.SimpleQueue()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "store")
        processes = [context.Process(target=_rank_main, args=(checks, rank, path, reports)) for rank in range(WORLD)]
        for p in processes:
            p.start()
        for p in processes:
            p.join(120)
    reported = []
    while not reports.empty():
        reported.append(reports.get())
    # Each rank's own report decides: torch 2.11's gloo may abort a process as it exits after its
    # checks passed (terminate called at teardown), which says nothing of what they checked.
    test.assertEqual(sorted(reported), [f"rank {rank}: ok" for rank in range(WORLD)],
                     [p.exitcode for p in processes])
