"""tally's Hugging Face target (transformers and accelerate): its worker (tally_adapters.hf.worker)."""
