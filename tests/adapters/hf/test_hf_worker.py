"""Unit tests of the Hugging Face worker's tables, which need no torch: the plant table answers the
catalog, and each plant replaces accelerate's per-mesh norm, the Trainer's mixed-mesh norm (its expert
faults) or FSDP2's divide rule. The worker itself
runs on transformers and accelerate in ci/real-hf (tally_adapters.hf_models, which it shares with the
Automodel worker, is tested in tests/adapters/automodel/test_automodel_worker.py)."""

import unittest

import fault_catalog
import tally_adapters.hf.worker as hf_worker
from tally_adapters.plants import FSDP2_DIVIDE_FACTORS


class PlantTable(unittest.TestCase):
    def test_every_catalog_fault_is_planted_or_has_a_reason(self):
        fault_catalog.assert_plants_answer_the_catalog(self, hf_worker.PLANTS, hf_worker.NOT_PLANTED)

    def test_every_plant_replaces_accelerates_or_the_trainers_norm_or_fsdp2s_divide_rule(self):
        for fault, (targets, how) in hf_worker.PLANTS.items():
            self.assertTrue(how, fault)
            for where, attr, make in targets:
                if fault.startswith("grads-"):  # the reduction, before which the gradients may enter
                    self.assertEqual((where, attr), FSDP2_DIVIDE_FACTORS, fault)
                elif fault in ("expert-norm-dropped", "missing-ep-reduction", "clip-per-ep-group-norm"):
                    # the Trainer's mixed-mesh norm, whose DTensors under EP are the experts
                    self.assertEqual((where, attr), ("transformers.trainer:Trainer", "_mixed_mesh_grad_norm"), fault)
                else:
                    # A method, replaced on its class (plants.Planted: "module:Class").
                    self.assertEqual((where, attr), ("accelerate.accelerator:Accelerator",
                                                     "_clip_grad_norm_dtensor_aware"), fault)
                self.assertTrue(callable(make(lambda *args: None)), fault)


if __name__ == "__main__":
    unittest.main()
