"""The queue loop's outcomes (tally_adapters.queue): a framework's own check that declines a case at
set-up is a refusal with its message, anything else an error; no torch needed."""

import os
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

    def test_a_refusal_names_the_frameworks_file_and_line(self):
        parallel_state = module_raising("megatron.core.parallel_state", None)
        with self.assertRaisesRegex(queue.FrameworkRefused, r"^AssertionError: order .* \(raised at megatron/core/parallel_state.py:2\)$"):
            with queue.framework_setup("megatron"):
                parallel_state.check(AssertionError("order tp-dp is not supported"))

    def test_an_unexpected_call_in_the_framework_is_an_error_not_a_refusal(self):
        # MLASelfAttention handing the local DotProductAttention k_channels: a TypeError, the worker's to see.
        attention = module_raising("megatron.core.transformer.dot_product_attention", None)
        for error in (TypeError("__init__() got an unexpected keyword argument 'k_channels'"), KeyError("tp"),
                      RuntimeError("CUDA error")):
            with self.subTest(error=type(error).__name__), self.assertRaises(type(error)):
                with queue.framework_setup("megatron"):
                    attention.check(error)

    def test_an_exception_class_of_the_frameworks_own_is_a_check(self):
        errors = types.ModuleType("deepspeed.runtime.config_utils")
        exec("class DeepSpeedConfigError(Exception):\n    pass\n", errors.__dict__)
        config = module_raising("deepspeed.runtime.config", None)
        with self.assertRaisesRegex(queue.FrameworkRefused, r"^DeepSpeedConfigError: zero stage 4"):
            with queue.framework_setup("deepspeed"):
                config.check(errors.DeepSpeedConfigError("zero stage 4"))

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


class OneRankDistributed(types.ModuleType):
    """torch.distributed of a world of one: each collective over itself."""

    def __init__(self):
        super().__init__("torch.distributed")

    def get_rank(self):
        return 0

    def get_world_size(self):
        return 1

    def broadcast_object_list(self, objects, src=0):
        pass

    def all_gather_object(self, output, obj):
        output[0] = obj


class Retiring(unittest.TestCase):
    def test_the_rank_with_the_most_threads_past_the_budget_is_named(self):
        self.assertEqual(queue.retiring_reason([90, 700, 512, None], budget=512),
                         "rank 1 holds 700 threads, the budget is 512")

    def test_under_the_budget_or_unknown_is_no_reason(self):
        self.assertIsNone(queue.retiring_reason([511, 90], budget=512))
        self.assertIsNone(queue.retiring_reason([None, None], budget=512))

    def test_this_process_has_threads_where_linux_says(self):
        threads = queue.threads_of_this_process()
        if threads is None:
            self.skipTest("no /proc/self/status here")
        self.assertGreaterEqual(threads, 1)

    def test_the_names_of_this_process_threads_are_counted_commonest_first(self):
        import threading

        if not os.path.isdir("/proc/self/task"):
            self.skipTest("no /proc/self/task here")
        release = threading.Event()
        helpers = [threading.Thread(target=release.wait, name=f"tally-test-{i}") for i in range(3)]
        for t in helpers:
            t.start()
        try:
            names = queue.thread_names_of_this_process(most=100)
        finally:
            release.set()
            for t in helpers:
                t.join()
        counts = [int(part.rpartition(" x ")[2]) for part in names.split(", ")]
        self.assertEqual(counts, sorted(counts, reverse=True), names)
        self.assertGreaterEqual(sum(counts), 4, names)  # the main thread and the three waiting

    def test_a_worker_past_its_budget_writes_retiring_before_the_result_and_returns(self):
        import os
        import sys
        import tempfile
        from unittest import mock

        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "case-1.json"), "w") as f:
                f.write("{}")
            seen = []

            def execute(request):
                seen.append(request.k)

            torch = types.ModuleType("torch")
            torch.distributed = OneRankDistributed()
            with mock.patch.dict(sys.modules, {"torch": torch, "torch.distributed": torch.distributed}), \
                    mock.patch.object(queue, "threads_of_this_process", return_value=3):
                queue.serve(folder, 0, {"framework": "test"}, execute, thread_budget=2)  # returns: no stop file
            self.assertEqual(seen, [1])
            with open(os.path.join(folder, "retiring")) as f:
                self.assertEqual(f.read(), "rank 0 holds 3 threads, the budget is 2\n")
            self.assertTrue(os.path.exists(os.path.join(folder, "case-1.result.json")))


class ThreadBudget(unittest.TestCase):
    def test_the_variable_sets_it_and_its_absence_is_the_default(self):
        from tally_adapters.worker import thread_budget

        self.assertEqual(thread_budget({}), queue.THREAD_BUDGET)
        self.assertEqual(thread_budget({"TALLY_WORKER_THREAD_BUDGET": "96"}), 96)

    def test_a_budget_that_is_not_a_whole_number_1_or_more_names_the_variable(self):
        from tally_adapters.worker import thread_budget

        for text in ("0", "-3", "many", "1.5", " 512", "512 ", "5_12", "\uff15\uff11\uff12", "\u0665\u0661\u0662", ""):
            with self.subTest(text=text), self.assertRaisesRegex(ValueError, r"^TALLY_WORKER_THREAD_BUDGET="):
                thread_budget({"TALLY_WORKER_THREAD_BUDGET": text})
