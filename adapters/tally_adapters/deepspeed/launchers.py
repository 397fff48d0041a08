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


def cpu_ranks_as_processes(launcher):
    """accelerate's process state on the CPU over the process group the worker started: every rank
    counted; for the Trainer named DEEPSPEED, which TrainingArguments requires of a state it is told
    to use (module docstring)."""
    from accelerate.state import DistributedType, PartialState

    state = PartialState(cpu=True)
    if launcher == "trainer":
        state.distributed_type = DistributedType.DEEPSPEED


def trainer_cannot_run():
    """Why the Trainer cannot take bf16 on this machine, or None (module docstring)."""
    from transformers.utils import is_torch_bf16_gpu_available

    if is_torch_bf16_gpu_available():
        return None
    return ("the Trainer with bf16: transformers' TrainingArguments raises ValueError \"Your setup doesn't support "
            "bf16/gpu\" without a bf16 GPU (transformers/training_args.py:1745-1750 at 5.18.0)")


def prepare(run, module, optimizer, launcher, cpu):
    """The engine for `module` built through `launcher`, onto `run` (`accelerator`, `trainer`;
    `environ`: what accelerate writes into the environment is put back by `release`). accelerate
    takes `optimizer` (None: the config's own, as accelerate's DummyOptim, accelerator.py:2253-2260);
    the Trainer makes its own (below)."""
    from accelerate.utils import DummyOptim

    run.environ = dict(os.environ)
    run.trainer = None
    if cpu:
        cpu_ranks_as_processes(launcher)
    config = copy.deepcopy(run.config)  # accelerate writes into the dict it is given
    if launcher == "trainer":
        return prepare_trainer(run, module, config, cpu)
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    if optimizer is None:
        optimizer = DummyOptim(list(module.parameters()), lr=0.0, weight_decay=0.0)
    run.accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    engine, _ = run.accelerator.prepare(module, optimizer)
    return engine


def prepare_trainer(run, module, config, cpu):
    """A transformers Trainer of `module` with TrainingArguments(deepspeed=config), prepared as
    Trainer.train prepares it (trainer.py:1700-1729 at 5.18.0) without its data loop: deepspeed_init
    finishes the config and makes the optimizer (the Trainer's own AdamW from its arguments, at lr 0,
    or with a config optimizer accelerate's DummyOptim: integrations/deepspeed.py:547-561, 630), then
    the Trainer's accelerator prepares the model and optimizer."""
    from transformers import Trainer, TrainingArguments
    from transformers.integrations.deepspeed import deepspeed_init

    dtype = run.case["gradients"]["dtype"]
    # TrainingArguments checks the config against its own values (integrations/deepspeed.py:133-181):
    # each stated as tally's config has it.
    args = TrainingArguments(output_dir=run.request.manifests_dir, report_to=[], deepspeed=config,
                             per_device_train_batch_size=1, gradient_accumulation_steps=1,
                             max_grad_norm=float(config["gradient_clipping"]), learning_rate=0.0, weight_decay=0.0,
                             bf16=dtype == "bf16", fp16=dtype == "fp16", save_strategy="no",
                             # on CPUs the state the worker made (cpu_ranks_as_processes)
                             accelerator_config={"use_configured_state": cpu})
    trainer = Trainer(model=module, args=args)
    trainer.optimizer, trainer.lr_scheduler = deepspeed_init(trainer, num_training_steps=1)
    engine, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    trainer.model_wrapped = trainer.deepspeed = engine
    run.accelerator, run.trainer = trainer.accelerator, trainer
    return engine


def step(run, loss):
    """The user's step: accelerate's backward (the engine's backward and step)."""
    run.accelerator.backward(loss)


def reported_norm(run, engine, max_norm):
    """What the user is given as the step's norm: accelerate's clip_grad_norm_, or what the Trainer
    logs, _get_grad_norm of its _clip_grad_norm (trainer.py:1892-1894)."""
    if run.trainer is not None:
        return run.trainer._get_grad_norm(engine, grad_norm=run.trainer._clip_grad_norm(engine))
    return run.accelerator.clip_grad_norm_(engine.parameters(), max_norm)


def release(run):
    """accelerate's process state and environment forgotten, so the next case's Accelerator is made
    with its own plugin alone (accelerate keeps one shared state per process and refuses a second
    plugin, accelerator.py:356-365)."""
    if getattr(run, "accelerator", None) is None:
        return
    from accelerate.state import AcceleratorState, GradientState

    run.accelerator = run.trainer = None
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    saved = run.environ
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    os.environ.update(saved)
