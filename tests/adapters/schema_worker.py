#!/usr/bin/env python3
"""A stand-in worker for tests/adapters/test_schemas.py: tally_adapters' own hello (a `Worker`) and
queue loop (`serve`), over the one-process torch.distributed of tests/run/fake_torch, executing
each case with tally's own model (`tally run CASE --manifests DIR`), as tests/run/model_worker.sh
does. tally deletes a passing case's files, so it keeps a copy of what tally sent:
case-<K>.seen.json (the request) and case-<K>.gradients.seen.json (the gradient index).

    schema_worker.py TALLY WORLD --queue DIR --parent-pid PID
"""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "run", "fake_torch"))
try:  # the installed package (ci/python-test), else the checkout's
    import tally_adapters  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "adapters"))

from tally_adapters.manifest import manifest_text, with_case_digest, write_atomically  # noqa: E402
from tally_adapters.queue import serve  # noqa: E402
from tally_adapters.worker import Worker, parse_args  # noqa: E402


class ModelWorker(Worker):
    """megatron-core as tally's own model plays it (tally's --target megatron-core takes it)."""

    framework = "megatron-core"
    not_planted = {"no-dedup-filter": "a stand-in plants nothing"}

    def __init__(self, tally, world):
        super().__init__("gloo", 0, world)
        self.tally = tally

    def framework_version(self):
        return "0.19.2"

    def execute(self, request):
        for suffix in (".json", ".gradients.json"):
            shutil.copyfile(request.path(suffix), request.path(suffix.replace(".json", ".seen.json")))
        try:
            import numpy  # noqa: F401  (the values are read where numpy is there)
        except ImportError:
            pass
        else:
            request.gradients()  # the index and the values agree, as the worker reads them
        run = subprocess.run([self.tally, "run", request.path(".json"), "--manifests", request.manifests_dir],
                             capture_output=True, text=True)
        if run.returncode > 1:
            raise RuntimeError(f"tally run exited {run.returncode}: {run.stderr.strip()}")
        # Each rank's file echoes the request's case_digest, as write_run(..., case_digest) writes it.
        for name in os.listdir(request.manifests_dir):
            if name.startswith("rank-"):
                path = os.path.join(request.manifests_dir, name)
                with open(path) as f:
                    manifest = json.load(f)
                write_atomically(manifest_text(with_case_digest(manifest, request.case_digest)), path)


def main():
    tally, world = sys.argv[1], int(sys.argv[2])
    args = parse_args("a stand-in worker", sys.argv[3:])
    worker = ModelWorker(tally, world)
    serve(args.queue, args.parent_pid, worker.hello(), worker.execute)


if __name__ == "__main__":
    main()
