"""tally's NeMo-Automodel target: its worker (tally_adapters.automodel.worker)."""
