#!/usr/bin/env python3
"""A stand-in worker on the queue loop the real workers share (tally_adapters.queue), with a torch.distributed of one process (tests/run/fake_torch), for tests
of that loop where torch is not installed. Every case hangs, as a rank stuck in the framework or in
a collective does, after writing `case-<K>.started` (its pid), so a test can end tally in the
middle of a case.

    queue_worker.py WORLD --queue DIR --parent-pid PID
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "fake_torch"), os.path.join(HERE, "..", "..", "adapters")]

from tally_adapters import queue as queue_loop  # noqa: E402
from tally_adapters.manifest import write_atomically  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("world", type=int)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--parent-pid", type=int, default=0)
    args = parser.parse_args()
    hello = {"framework": "megatron-core", "version": "0.19.2", "world": args.world,
             "producer": "tests/run/queue_worker.py"}

    def execute(request):
        write_atomically(f"{os.getpid()}\n", request.path(".started"))
        while True:
            time.sleep(3600)

    queue_loop.serve(args.queue, args.parent_pid, hello, execute)


if __name__ == "__main__":
    main()
