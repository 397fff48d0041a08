"""Replacing a framework's functions for a while, shared by tally's workers and adapters: `Patches`
(set attributes, put them back), and `Planted`, which plants catalog faults for one case (the real
mutation score, docs/real-targets.md), and the reduction faults the FSDP2 workers plant in torch's
FSDP2 (and why not the others). No framework import of its own."""

import importlib
import sys

# FSDP2's choice of how a gradient's reduction divides (the reduce-scatter's and HSDP's all-reduce's
# ops, and the factors before and after them): a function of torch's, replaced on its own module.
FSDP2_DIVIDE_FACTORS = ("torch.distributed.fsdp._fully_shard._fsdp_collectives:", "_get_gradient_divide_factors")


def fsdp2_divided_again(orig):
    """grads-averaged-twice: what FSDP2 reduced is divided once more by its data-parallel size."""

    def _get_gradient_divide_factors(reduce_scatter_group, all_reduce_group, *args, **kwargs):
        predivide, postdivide, reduce_scatter_op, all_reduce_op = orig(reduce_scatter_group, all_reduce_group,
                                                                         *args, **kwargs)
        size = 1
        for group in (reduce_scatter_group, all_reduce_group):
            size *= group.size() if group is not None else 1
        return predivide, (postdivide or 1.0) * size, reduce_scatter_op, all_reduce_op

    return _get_gradient_divide_factors


def fsdp2_summed(orig):
    """grads-not-averaged: FSDP2 sums the contributions without dividing."""

    def _get_gradient_divide_factors(*args, **kwargs):
        from torch.distributed import ReduceOp

        return None, None, ReduceOp.SUM, ReduceOp.SUM

    return _get_gradient_divide_factors


# The two reduction faults a stack that reduces through FSDP2 plants in torch's divide rule, as
# plant-table rows (fault -> ([(where, attr, make)], how)).
FSDP2_REDUCTION_PLANTS = {
    "grads-averaged-twice": (
        [(*FSDP2_DIVIDE_FACTORS, fsdp2_divided_again)],
        "FSDP2's average of the contributions is divided by its data-parallel size once more",
    ),
    "grads-not-averaged": (
        [(*FSDP2_DIVIDE_FACTORS, fsdp2_summed)],
        "FSDP2 sums the contributions without dividing",
    ),
}


def fsdp2_reduction_not_planted(framework):
    """Why a stack that reduces through FSDP2 (torchtitan, NeMo-Automodel) does not plant the other
    reduction faults: FSDP2 divides every param by one rule of torch's, and the step faults are
    Megatron's."""
    divides = (f"FSDP2 divides every param's reduction by one rule (_get_gradient_divide_factors), with no "
               f"separate function of {framework}'s for the experts: not planted")
    finalize = f"a step of Megatron's finalize_model_grads, which {framework} does not run"
    return {
        "expert-grads-averaged-over-edp": divides,
        "tied-embedding-not-synced": finalize,
        "tied-embedding-synced-twice": finalize,
        "tp-replicated-grads-not-summed": finalize,
        "tp-replicated-grads-summed-twice": finalize,
    }

class Patches:
    """Attributes replaced for a while; `restore` puts every original back, last replaced first."""

    def __init__(self):
        self.undo = []

    def replace(self, owner, attr, value):
        self.undo.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def restore(self):
        for owner, attr, original in reversed(self.undo):
            setattr(owner, attr, original)
        self.undo.clear()


def owner_of(where):
    """"package.module" is the module; "package.module:Class" the class defined there."""
    module_name, _, cls = where.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls) if cls else module


def attribute(module, attr):
    """`module.attr`, or None: also where a module's own __getattr__ raises something other than
    AttributeError for a name it lacks (NeMo-Automodel's model registry raises ModuleNotFoundError)."""
    try:
        return getattr(module, attr, None)
    except Exception:
        return None


class Planted:
    """Plants `faults` for the duration of a `with` block. `plants`: fault -> ([(where, attr, make),
    ...], how): `make(original)` gives the replacement. A function of a module ("where" names the
    module) is replaced in every loaded module of `package` that imported it, and restored in those
    that imported the replacement meanwhile; a method ("where" is "module:Class") on its class, and a
    function of a module outside `package` ("module:", nothing after the colon) on that module.
    `not_planted`: fault -> why not, for the error naming a fault the worker cannot plant."""

    def __init__(self, faults, plants, not_planted, package):
        unknown = [f for f in faults if f not in plants]
        if unknown:
            reasons = "; ".join(f"{f}: {not_planted.get(f, 'not a fault this worker knows')}" for f in unknown)
            raise ValueError(f"cannot plant {reasons}")
        self.targets = [target for f in faults for target in plants[f][0]]
        self.package = package
        self.patches = Patches()
        self.originals = []

    def _modules(self):
        return [m for name, m in list(sys.modules.items()) if m is not None and name.startswith(self.package)]

    def __enter__(self):
        self.originals = []
        for where, attr, make in self.targets:
            owner = owner_of(where)
            original = getattr(owner, attr)
            replacement = make(original)
            replacement._tally_planted = True
            if ":" in where:
                self.patches.replace(owner, attr, replacement)
                continue
            self.originals.append((attr, original))
            for module in self._modules():
                if attribute(module, attr) is original:
                    self.patches.replace(module, attr, replacement)
        return self

    def __exit__(self, *exc):
        self.patches.restore()
        # A module imported while the fault was planted took the replacement: restore it too.
        for attr, original in self.originals:
            for module in self._modules():
                value = attribute(module, attr)
                if value is not None and value is not original and getattr(value, "_tally_planted", False):
                    setattr(module, attr, original)
        return False
