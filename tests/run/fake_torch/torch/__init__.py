"""A stand-in for torch in tests of tally's queue loop where torch is not installed: only what
adapters/megatron/tally_worker_queue.py reads (torch.distributed), for one process."""
