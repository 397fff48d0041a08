"""The engine as a Hugging Face user with a DeepSpeed config gets it (`deepspeed.launcher`, issue 52):
accelerate's `Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config)).prepare(model,
optimizer)` (`accelerate`), or the accelerator a transformers `Trainer` makes from
`TrainingArguments(deepspeed=config)`, prepared as `Trainer.train` prepares it (`trainer`). Both end
in accelerate's `_prepare_deepspeed`, which fills the config's "auto" values (tally's has none) and
calls `deepspeed.initialize` (accelerate/accelerator.py:2141-2450 at 1.15.0). The step is
`accelerator.backward(loss)` (the engine's backward, then its step: accelerate/utils/deepspeed.py:264-281),
and the norm the user sees is what `accelerator.clip_grad_norm_` returns under
DistributedType.DEEPSPEED (the engine's get_global_grad_norm(), accelerator.py:3023-3026), or
`Trainer._get_grad_norm(model, Trainer._clip_grad_norm(model))` (transformers/trainer.py:2678-2698 at
5.18.0).

On CPUs accelerate takes DeepSpeed without a device: with LOCAL_RANK set and the plugin given, its
process state adopts the process group the worker started and names the type DEEPSPEED
(accelerate/state.py:201-217, 311-312), although with no accelerator device it counts one process
(state.py:277-281: no backend); nothing of DeepSpeed's engine or norm reads that count, and the
config tally writes states every batch size, so no step is added here.
"""

import copy
import os

LAUNCHERS = ("deepspeed", "accelerate", "trainer")


def prepare(run, module, optimizer, launcher):
    """The engine for `module` and `optimizer` (None: the config's own, which accelerate takes as a
    DummyOptim, accelerator.py:2253-2260) built through `launcher`, onto `run` (`accelerator`,
    `trainer`, `environ`: what accelerate writes into the environment is put back by `release`)."""
    from accelerate.utils import DummyOptim

    run.environ = dict(os.environ)
    config = copy.deepcopy(run.config)  # accelerate writes into the dict it is given
    if optimizer is None:
        optimizer = DummyOptim(list(module.parameters()), lr=0.0, weight_decay=0.0)
    if launcher == "accelerate":
        from accelerate import Accelerator
        from accelerate.utils import DeepSpeedPlugin

        run.accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
        run.trainer = None
        engine, _ = run.accelerator.prepare(module, optimizer)
        return engine
    from transformers import Trainer, TrainingArguments

    dtype = run.case["gradients"]["dtype"]
    # TrainingArguments checks the config against its own values (must_match, integrations/deepspeed.py:
    # 133-181 at 5.18.0): each stated as tally's config has it.
    args = TrainingArguments(output_dir=run.request.manifests_dir, report_to=[], deepspeed=config,
                             per_device_train_batch_size=1, gradient_accumulation_steps=1,
                             max_grad_norm=float(config["gradient_clipping"]), learning_rate=0.0, weight_decay=0.0,
                             bf16=dtype == "bf16", fp16=dtype == "fp16", save_strategy="no")
    trainer = Trainer(model=module, args=args, optimizers=(optimizer, None))
    # Trainer.train's preparation (trainer.py:1700-1729): deepspeed_init finishes the config and
    # keeps the given optimizer, then its accelerator prepares the model and optimizer.
    from transformers.integrations.deepspeed import deepspeed_init

    trainer.optimizer, trainer.lr_scheduler = deepspeed_init(trainer, num_training_steps=1)
    engine, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    trainer.model_wrapped = trainer.deepspeed = engine
    run.accelerator, run.trainer = trainer.accelerator, trainer
    return engine


def step(run, engine, loss):
    """The user's step: accelerate's backward (the engine's backward and step)."""
    run.accelerator.backward(loss)


def reported_norm(run, engine, max_norm):
    """What the user is given as the step's norm: accelerate's clip_grad_norm_, or the Trainer's."""
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
