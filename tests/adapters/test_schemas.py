"""The documents the adapters write, and those tally writes for them, against the schemas of the
border (docs/schemas/): the hello of a Worker (a stand-in framework, and the real workers' fault
tables), the result `serve` writes, a manifest and groups.json built with tally_adapters.manifest,
and, where TALLY names a tally binary, the manifests, the gradient index and the request tally
writes. Validated with the jsonschema package; skipped, with the reason, where it is not installed.
No torch, no framework. Run: PYTHONPATH=adapters python3 -m pytest tests/adapters
(or pytest)."""

import glob
import json
import os
import shlex
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SCHEMAS = os.path.join(ROOT, "docs", "schemas")

try:
    import jsonschema
except ImportError:  # the system Python of a CI machine may lack it
    jsonschema = None

import tally_adapters.deepspeed.worker as deepspeed_worker  # noqa: E402
import tally_adapters.manifest as fmt  # noqa: E402
import tally_adapters.megatron.worker as megatron_worker  # noqa: E402
from tally_adapters.queue import result_document  # noqa: E402
from tally_adapters.worker import Worker  # noqa: E402


def schema(name):
    with open(os.path.join(SCHEMAS, f"{name}.schema.json")) as f:
        return json.load(f)


def errors(name, document):
    """Every way `document` breaks the schema `name`, as "path: message" lines (empty: valid)."""
    validator = jsonschema.Draft202012Validator(schema(name))
    found = sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path])
    return ["/" + "/".join(str(p) for p in e.absolute_path) + ": " + e.message for e in found]


class SchemaTest(unittest.TestCase):
    def setUp(self):
        if jsonschema is None:
            self.skipTest("the jsonschema package is not installed (pip install jsonschema)")
        if not hasattr(jsonschema, "Draft202012Validator"):
            self.skipTest("this jsonschema predates draft 2020-12 (pip install 'jsonschema>=4')")

    def assertValid(self, name, document, what=""):
        self.assertEqual(errors(name, document), [], f"{name}.schema.json: {what}")

    def assertInvalidNaming(self, name, document, word):
        found = errors(name, document)
        self.assertTrue(any(word in e for e in found), f"{name}.schema.json should refuse naming {word!r}: {found}")


class StandIn(Worker):
    """A framework that needs nothing installed."""

    framework = "deepspeed"
    plants = {"no-dedup-filter": ([("standin.rules", "keep", lambda orig: orig)], "replaces standin.rules.keep")}
    not_planted = {"zero-count-in-float32": "the stand-in counts no zeros"}

    def framework_version(self):
        return "0.19.8"

    def dtypes(self):
        return ["fp32", "bf16"]


class WithTheFrameworksVersion:
    """A real worker class, its framework's version stood in (the real one imports the framework)."""

    def framework_version(self):
        return "0.0.0"


class HelloTest(SchemaTest):
    def test_the_hello_of_a_worker_validates(self):
        self.assertValid("hello", StandIn("gloo", 0, 2).hello())

    def test_a_hello_without_dtypes_or_plants_validates(self):
        class Bare(StandIn):
            plants = {}
            not_planted = {}

            def dtypes(self):
                return None

        hello = Bare("nccl", 8, 8).hello()
        self.assertNotIn("dtypes", hello)
        self.assertValid("hello", hello)

    def test_the_hellos_of_the_megatron_and_deepspeed_workers_validate(self):
        # their fault tables name catalog faults only, each with a reason
        for worker_class in (megatron_worker.MegatronCoreWorker, deepspeed_worker.DeepSpeedWorker):
            with self.subTest(worker=worker_class.__name__):
                real = type("Real", (WithTheFrameworksVersion, worker_class), {"dtypes": lambda self: None})
                self.assertValid("hello", real("nccl", 1, 4).hello())

    def test_a_deepspeed_worker_whose_fused_adam_did_not_build_says_why_in_its_hello(self):
        real = type("Real", (WithTheFrameworksVersion, deepspeed_worker.DeepSpeedWorker), {"dtypes": lambda self: None})
        self.assertNotIn("cannot_run", real("nccl", 1, 4).hello(), "FusedAdam built: nothing to say")
        worker = real("nccl", 1, 4)
        worker.fused_adam_unavailable = "DeepSpeed's FusedAdam op did not build on rank 0: RuntimeError: nvcc failed"
        hello = worker.hello()
        self.assertEqual(hello["cannot_run"], {"deepspeed.fused_adam": worker.fused_adam_unavailable})
        self.assertValid("hello", hello)
        self.assertInvalidNaming("hello", dict(hello, cannot_run={"deepspeed.cpu_adam": "no"}), "deepspeed.cpu_adam")

    def test_a_field_the_schema_does_not_name_fails(self):
        class Chatty(StandIn):
            def hello(self):
                return dict(super().hello(), gpu_name="NVIDIA H200")

        self.assertInvalidNaming("hello", Chatty("gloo", 0, 2).hello(), "gpu_name")

    def test_a_fault_the_catalog_lacks_fails(self):
        class Renamed(StandIn):
            not_planted = {"zero-count-in-fp32": "renamed on this side only"}

        self.assertInvalidNaming("hello", Renamed("gloo", 0, 2).hello(), "zero-count-in-fp32")

    def test_model_rules_is_megatron_or_absent(self):
        hello = StandIn("gloo", 0, 2).hello()
        self.assertValid("hello", dict(hello, model_rules="megatron"))
        self.assertInvalidNaming("hello", dict(hello, model_rules="deepspeed"), "megatron")


class ResultTest(SchemaTest):
    def test_the_results_serve_writes_validate(self):
        ok = result_document([("ok", ""), ("ok", "")], 1.25)
        self.assertEqual(ok, {"status": "ok", "message": "", "seconds": 1.25})
        self.assertValid("result", ok)
        error = result_document([("ok", ""), ("error", "rank 1: ValueError: no"), ("error", "rank 2: x")], 0.0)
        self.assertEqual(error["message"], "rank 1: ValueError: no")
        self.assertValid("result", error)

    def test_a_status_other_than_ok_or_error_fails(self):
        self.assertInvalidNaming("result", {"status": "done"}, "done")


def attributes(tp=False, dim=-1, allreduce=True):
    return {"tensor_model_parallel": tp, "partition_dim": dim, "allreduce": allreduce, "shared": False,
            "grad_norm_group": None}


def stats(elements, value=1.0):
    return {"sum_squares": elements * value * value, "abs_max": value, "zeros": 0}


def rank_list_manifest(rank, world=4):
    """A TP 2 x DP 2 rank as an adapter builds it (groups as rank lists): a column-parallel weight
    split over TP and a replicated bias, one distributed optimizer over the world that owns half of
    each and clips them, and the reported values."""
    tp = [rank - rank % 2, rank - rank % 2 + 1]
    dp = [rank % 2, rank % 2 + 2]
    half = rank // 2  # this rank's half of each box, along DP
    weight = {"name": "decoder.layers.0.linear_fc1.weight", "logical_name": "decoder.layers.0.linear_fc1.weight",
              "logical_shape": [8, 4], "offsets": [4 * (rank % 2), 0], "extents": [4, 4],
              "attributes": attributes(tp=True, dim=0), "stats": stats(16)}
    bias = {"name": "decoder.layers.0.linear_fc2.bias", "logical_name": "decoder.layers.0.linear_fc2.bias",
            "logical_shape": [4], "offsets": [0], "extents": [4],
            "attributes": dict(attributes(), is_gtp_weight_remat=False), "stats": stats(4)}
    main_params = [
        {"param": 0, "begin": 8 * half, "end": 8 * half + 8, "attributes": attributes(tp=True, dim=0),
         "kept": True, "kept_zeros": True, "stats": stats(8), "clipped_stats": stats(8, 0.5)},
        {"param": 1, "begin": 2 * half, "end": 2 * half + 2, "attributes": attributes(), "kept": rank % 2 == 0,
         "kept_zeros": rank % 2 == 0, "stats": stats(2), "clipped_stats": stats(2, 0.5)},
    ]
    optimizer = {"name": "DistributedOptimizer (Adam)", "stats_group": list(range(world)), "tp_group": tp,
                 "expert_tp_group": None, "clip": {"max_norm": 4.0, "coefficient": 0.5}, "main_params": main_params}
    return {
        "tally_manifest": fmt.RANK_LISTS_VERSION,
        "producer": "tests/adapters/test_schemas.py",
        "rank": rank,
        "world": world,
        "parallel": {"tp": 2, "cp": 1, "pp": 1, "dp": 2, "ep": 1, "etp": 1},
        "groups": {"tp": tp, "expt_tp": [rank], "dp_cp": dp, "world": list(range(world))},
        "params": [weight, bias],
        "optimizers": [optimizer],
        "reported": {"norm": 8.0, "inf_norm": None, "zeros": 0, "group_norms": {"mtp": 0.0}},
    }


class ManifestTest(SchemaTest):
    def run_of(self, world=4):
        """Every rank's version-2 manifest and groups.json, as write_run makes them."""
        manifests = [rank_list_manifest(r, world) for r in range(world)]
        led = [fmt.led_groups(m["rank"], fmt.manifest_rank_lists(m)) for m in manifests]
        table = fmt.group_table(led)
        return [fmt.refer_to_groups(m, table) for m in manifests], fmt.groups_file(world, table)

    def test_the_manifests_and_groups_an_adapter_writes_validate(self):
        ranks, groups = self.run_of()
        self.assertValid("groups", groups)
        for m in ranks:
            self.assertValid("manifest", m, f"rank {m['rank']}")

    def test_the_files_write_run_writes_validate(self):
        ranks, groups = self.run_of()
        with tempfile.TemporaryDirectory() as d:
            fmt.write_groups(groups["world"], groups["groups"], d)
            for m in ranks:
                fmt.write_manifest(m, d)
            for path in sorted(glob.glob(os.path.join(d, "*.json"))):
                with open(path) as f:
                    document = json.load(f)
                name = "groups" if os.path.basename(path) == "groups.json" else "manifest"
                self.assertValid(name, document, path)

    def test_a_version_1_manifest_is_not_described(self):
        self.assertInvalidNaming("manifest", rank_list_manifest(0), "2 was expected")

    def test_a_field_the_schema_does_not_name_fails(self):
        ranks, _ = self.run_of()
        m = json.loads(json.dumps(ranks[0]))
        m["params"][0]["stats"]["l1"] = 16.0
        self.assertInvalidNaming("manifest", m, "l1")


class TallyWritesTest(SchemaTest):
    """What the tally binary ($TALLY) writes: the model target's manifests, and what it sends a
    worker (the gradient index and the request), kept by a stand-in worker on the adapters' own
    queue loop (tests/adapters/schema_worker.py), whose hello and results tally reads strictly."""

    def setUp(self):
        super().setUp()
        tally = os.environ.get("TALLY")
        if not tally:
            self.skipTest("TALLY names no tally binary")
        self.tally = os.path.abspath(tally)

    def tally_run(self, *args):
        return subprocess.run([self.tally, "run", *args], capture_output=True, text=True, timeout=300)

    def test_the_manifests_tally_writes_validate(self):
        for seed in ("founding-6099-world8.fail.json", "clip-per-stage-norm.fail.json",
                     "clipped-rounding-of-an-fp32-coefficient-world16.pass.json"):
            with self.subTest(seed=seed), tempfile.TemporaryDirectory() as d:
                run = self.tally_run(os.path.join(ROOT, "seeds", seed), "--manifests", d)
                self.assertIn(run.returncode, (0, 1), run.stderr)
                files = sorted(glob.glob(os.path.join(d, "*.json")))
                self.assertIn(os.path.join(d, "groups.json"), files)
                for path in files:
                    with open(path) as f:
                        document = json.load(f)
                    name = "groups" if os.path.basename(path) == "groups.json" else "manifest"
                    self.assertValid(name, document, path)

    def test_the_gradient_index_and_the_request_tally_sends_validate(self):
        worker = " ".join(shlex.quote(a) for a in (sys.executable, os.path.join(HERE, "schema_worker.py"), self.tally))
        with tempfile.TemporaryDirectory() as d:
            run = self.tally_run(os.path.join(ROOT, "seeds", "founding-6099-world2.pass.json"),
                                 "--target", "megatron-core", "--worker", worker + " {world}", "--worker-dir", d,
                                 "--start-timeout", "60s", "--case-timeout", "120s")
            queue = os.path.join(d, "world-2")
            if run.returncode != 0:
                with open(os.path.join(queue, "worker.log")) as log:
                    self.fail(f"tally run exited {run.returncode}: {run.stdout}{run.stderr}\nworker.log:\n{log.read()}")
            for file, name in (("hello.json", "hello"), ("case-1.seen.json", "case"),
                               ("case-1.gradients.seen.json", "gradient-index")):
                with open(os.path.join(queue, file)) as f:
                    self.assertValid(name, json.load(f), file)


if __name__ == "__main__":
    unittest.main()
