"""Unit tests of tally_plants (faults planted in a framework for one case), on stand-in modules:
no torch, no framework. Run: python3 -m pytest tests/adapters."""

import os
import sys
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

import fault_catalog  # noqa: E402
import tally_adapters.plants as tally_plants  # noqa: E402


def rule(x):
    return x > 0


class Rules:
    def decide(self):
        return "right"


def install(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class Planted(unittest.TestCase):
    def setUp(self):
        self.home = install("fakefw.rules", rule=rule, Rules=Rules)
        self.user = install("fakefw.user", rule=rule)  # imported the rule by name
        self.other = install("otherfw.user", rule=rule)  # another framework's module
        self.plants = {
            "keep-all": ([("fakefw.rules", "rule", lambda orig: lambda x: True)], "keeps every x"),
            "wrong-method": ([("fakefw.rules:Rules", "decide", lambda orig: lambda self: "wrong")], "decides wrong"),
        }

    def tearDown(self):
        for name in ("fakefw.rules", "fakefw.user", "fakefw.late", "otherfw.user"):
            sys.modules.pop(name, None)

    def test_a_function_is_replaced_in_every_module_of_the_package_that_imported_it_and_restored(self):
        with tally_plants.Planted(["keep-all"], self.plants, {}, "fakefw"):
            self.assertTrue(self.home.rule(-1))
            self.assertTrue(self.user.rule(-1))
            self.assertIs(self.other.rule, rule, "another package is left alone")
        self.assertIs(self.home.rule, rule)
        self.assertIs(self.user.rule, rule)

    def test_a_module_imported_while_planted_is_restored_too(self):
        with tally_plants.Planted(["keep-all"], self.plants, {}, "fakefw"):
            late = install("fakefw.late", rule=self.home.rule)
        self.assertIs(late.rule, rule)

    def test_a_method_is_replaced_on_its_class(self):
        with tally_plants.Planted(["wrong-method"], self.plants, {}, "fakefw"):
            self.assertEqual(Rules().decide(), "wrong")
        self.assertEqual(Rules().decide(), "right")

    def test_a_fault_without_a_counterpart_is_refused_with_its_reason(self):
        with self.assertRaisesRegex(ValueError, "cannot plant hang: a hang is not judged"):
            tally_plants.Planted(["hang"], self.plants, {"hang": "a hang is not judged"}, "fakefw")


class Patches(unittest.TestCase):
    def test_restore_puts_back_every_original_last_first(self):
        owner = types.SimpleNamespace(a=1)
        patches = tally_plants.Patches()
        patches.replace(owner, "a", 2)
        patches.replace(owner, "a", 3)
        patches.restore()
        self.assertEqual(owner.a, 1)


class MegatronPlants(unittest.TestCase):
    def test_every_catalog_fault_is_planted_or_has_a_reason_by_name(self):
        import tally_adapters.megatron.plants as megatron_plants

        fault_catalog.assert_plants_answer_the_catalog(self, megatron_plants.PLANTS, megatron_plants.NOT_PLANTED)


if __name__ == "__main__":
    unittest.main()
