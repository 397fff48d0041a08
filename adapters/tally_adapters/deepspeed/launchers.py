"""The engine as a Hugging Face user with a DeepSpeed config gets it (`deepspeed.launcher accelerate`,
issue 52): accelerate's `Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
.prepare(model, optimizer)`, which fills the config's "auto" values (tally's has none) and calls
`deepspeed.initialize` without an mpu (accelerate/accelerator.py:2141-2450 at 1.15.0). The step is
`accelerator.backward(loss)`: the engine's backward, then its step (accelerate/utils/deepspeed.py:
264-281); the norm the user sees is what `accelerator.clip_grad_norm_` returns under
DistributedType.DEEPSPEED, the engine's get_global_grad_norm() (accelerator.py:3023-3026), which the
Trainer logs too (transformers/trainer.py:2678-2698 at 5.18.0, `_clip_grad_norm` / `_get_grad_norm`).

On CPUs accelerate takes DeepSpeed without a device (with LOCAL_RANK set and the plugin given its
state names the type DEEPSPEED, accelerate/state.py:201-217, 311-312), but with no accelerator device
it finds no backend and counts one process (state.py:769-815, 277-281). So on CPUs the worker first
starts accelerate's process state as a CPU one over the worker's gloo group, counting every rank
(`cpu_ranks_as_processes`), as `accelerate launch --cpu` would; the Accelerator made next is still
DeepSpeed's (state.py:974: the plugin, and no cpu flag of its own). Nothing of the engine or its norm
reads that state.
"""

import copy
import os


def cpu_ranks_as_processes():
    """accelerate's process state on the CPU over the process group the worker started: every rank
    counted (module docstring)."""
    from accelerate.state import PartialState

    PartialState(cpu=True)


def prepare(run, module, optimizer, cpu):
    """The engine for `module` and `optimizer` (None: the config's own, which accelerate takes as a
    DummyOptim, accelerator.py:2253-2260) built by accelerate's prepare, onto `run` (`accelerator`;
    `environ`: what accelerate writes into the environment is put back by `release`)."""
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, DummyOptim

    run.environ = dict(os.environ)
    if cpu:
        cpu_ranks_as_processes()
    config = copy.deepcopy(run.config)  # accelerate writes into the dict it is given
    if optimizer is None:
        optimizer = DummyOptim(list(module.parameters()), lr=0.0, weight_decay=0.0)
    run.accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    engine, _ = run.accelerator.prepare(module, optimizer)
    return engine


def step(run, loss):
    """The user's step: accelerate's backward (the engine's backward and step)."""
    run.accelerator.backward(loss)


def reported_norm(run, engine, max_norm):
    """What the user is given as the step's norm: accelerate's clip_grad_norm_."""
    return run.accelerator.clip_grad_norm_(engine.parameters(), max_norm)


def release(run):
    """accelerate's process state and environment forgotten, so the next case's Accelerator is made
    with its own plugin alone (accelerate keeps one shared state per process and refuses a second
    plugin, accelerator.py:356-365)."""
    if getattr(run, "accelerator", None) is None:
        return
    from accelerate.state import AcceleratorState, GradientState

    run.accelerator = None
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    saved = run.environ
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    os.environ.update(saved)
