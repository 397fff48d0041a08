"""The megatron-core worker's reading of a case's --moe-layer-freq (no torch, no Megatron)."""

import unittest

from tally_adapters.megatron.build import moe_layer_freq


class MoeLayerFreq(unittest.TestCase):
    def test_an_integer_passes_through(self):
        self.assertEqual(moe_layer_freq(2), 2)

    def test_megatron_lms_list_expressions(self):
        self.assertEqual(moe_layer_freq("([0]*1+[1]*3)"), [0, 1, 1, 1])
        self.assertEqual(moe_layer_freq("([1]*2+[0]*1)*2"), [1, 1, 0, 1, 1, 0])
        self.assertEqual(moe_layer_freq("[1,0,1]"), [1, 0, 1])

    def test_anything_else_is_refused_naming_the_text(self):
        for text in ("__import__('os')", "[2]*3", "[0.5]", "3"):
            with self.assertRaisesRegex(ValueError, "moe_layer_freq"):
                moe_layer_freq(text)


if __name__ == "__main__":
    unittest.main()
