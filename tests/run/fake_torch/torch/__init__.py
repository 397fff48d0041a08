"""A stand-in for torch in tests of tally's queue loop where torch is not installed: only what
tally_adapters.queue reads (torch.distributed), for one process."""
