"""The queue loop's outcomes (tally_adapters.queue): a framework's own check that declines a case at
set-up is a refusal with its message, anything else an error; no torch needed."""

import types
import unittest

import tally_adapters.queue as queue


def module_raising(name, error):
    """A module named `name` whose check() raises `error` in its own code, as a framework's would."""
    module = types.ModuleType(name)
    exec("def check(error):\n    raise error\n", module.__dict__)
    return module


class FrameworkSetup(unittest.TestCase):
    def test_the_frameworks_own_check_is_a_refusal_with_its_message(self):
        folding = module_raising("deepspeed.module_inject.auto_ep_folding", None)
        with self.assertRaisesRegex(queue.FrameworkRefused, r"^ValueError: ZeRO optimizer/parameter offload .* not validated yet"):
            with queue.framework_setup("deepspeed"):
                folding.check(ValueError("ZeRO optimizer/parameter offload with AutoEP+AutoTP folding is not validated yet."))

    def test_an_error_outside_the_framework_stays_an_error(self):
        for name in ("tally_adapters.deepspeed.worker", "torch.nn.modules.module", "deepspeedx.core"):
            with self.subTest(module=name), self.assertRaises(LookupError):
                with queue.framework_setup("deepspeed"):
                    module_raising(name, None).check(LookupError("model mismatch"))

    def test_what_the_framework_called_raised_is_not_the_frameworks_check(self):
        torch_like = module_raising("torch.distributed.c10d", None)
        framework = types.ModuleType("megatron.core.parallel_state")
        framework.callee = torch_like
        exec("def initialize():\n    callee.check(RuntimeError('gloo: connection reset'))\n", framework.__dict__)
        with self.assertRaisesRegex(RuntimeError, "gloo: connection reset"):
            with queue.framework_setup("megatron"):
                framework.initialize()

    def test_nothing_raised_is_nothing(self):
        with queue.framework_setup("megatron"):
            pass


class ResultDocument(unittest.TestCase):
    def test_an_error_on_any_rank_wins_then_a_refusal_then_ok(self):
        self.assertEqual(queue.result_document([("ok", ""), ("ok", "")], 1.0)["status"], "ok")
        refused = queue.result_document([("refused", "rank 0: ValueError: no"), ("refused", "rank 1: ValueError: no")], 1.0)
        self.assertEqual((refused["status"], refused["message"]), ("refused", "rank 0: ValueError: no"))
        error = queue.result_document([("refused", "rank 0: x"), ("error", "rank 1: RuntimeError: y")], 1.0)
        self.assertEqual((error["status"], error["message"]), ("error", "rank 1: RuntimeError: y"))


if __name__ == "__main__":
    unittest.main()
