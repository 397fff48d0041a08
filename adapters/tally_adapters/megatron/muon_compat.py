"""A shim between megatron-core 0.16.1's Muon and emerging_optimizers 0.3.0, the only release of
the latter on PyPI: applied where a Muon optimizer is built (the worker, the examples)."""


def emerging_optimizers_compat():
    """megatron-core 0.16.1's TensorParallelMuon calls
    OrthogonalizedOptimizer.__init__(params, lr, momentum_beta, use_nesterov=..., ...);
    emerging_optimizers 0.3.0 (the only release on PyPI) names that keyword `nesterov` and
    rejects the call with a TypeError. Translate the keyword (construction only; this script
    never steps). Returns whether the shim was needed."""
    try:
        from emerging_optimizers.orthogonalized_optimizers import OrthogonalizedOptimizer
    except ImportError:
        return False
    import inspect

    params = inspect.signature(OrthogonalizedOptimizer.__init__).parameters
    if "use_nesterov" in params or "nesterov" not in params:
        return False
    original = OrthogonalizedOptimizer.__init__

    def __init__(self, *args, **kwargs):
        if "use_nesterov" in kwargs:
            kwargs["nesterov"] = kwargs.pop("use_nesterov")
        return original(self, *args, **kwargs)

    OrthogonalizedOptimizer.__init__ = __init__
    return True
