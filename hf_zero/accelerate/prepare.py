"""hf_zero.accelerator() and hf_zero.prepare(): an Accelerator DeepSpeed really drives, and Accelerate's prepare with
hf_zero.checks' model moment before the engine is built and its engine moment after."""

import inspect

from ..checks import CHECKS, check_options, raise_errors, run_moment
from ..checks.options import ZeroOptions
from ..distributed import accelerate_launched_deepspeed, has_gpu, is_distributed
from .optimizers import with_preset_optimizer
from .runs import WAITS_FOR_RANKS, run_of


def accelerator(*, skip_checks=(), **kwargs):
    """``accelerate.Accelerator(**kwargs)`` that DeepSpeed drives on GPU and CPU machines alike.

    Its ``prepare`` runs hf_zero.checks' model and engine checks around the engine it builds, as ``hf_zero.prepare``
    does with its default options, so Accelerate's own loop gets them unchanged; it also takes a DummyOptim with a
    config that names no optimizer (the presets): DeepSpeed's AdamW with the DummyOptim's lr, weight_decay, betas and
    eps (see ``deepspeed_adamw_for``). Under Ulysses sequence parallelism, the engine's ``model(**batch).loss`` is
    the loss over every shard of the sequences (hf_zero.sequence_parallel.loss_over_sequence_shards).

    On a CPU machine under ``accelerate launch`` with a DeepSpeed config (or with a ``deepspeed_plugin`` passed here,
    under any launcher), Accelerate alone gives each rank a world of one; the process state is started on the CPU
    first (gloo), as the Trainer does with ``use_cpu=True``. Then hf_zero.checks' config checks run on the live
    DeepSpeed config, as ZeroCallback runs them for the Trainer (``skip_checks``: ids to leave out; docs/run-checks.md)."""
    from accelerate import Accelerator, PartialState

    check_options(skip_checks=skip_checks)
    # DeepSpeed from `accelerate launch`'s config, or from a plugin the script passes (e.g. under torchrun)
    asked = accelerate_launched_deepspeed() or kwargs.get("deepspeed_plugin") is not None \
        or bool(kwargs.get("deepspeed_plugins"))
    if asked and not has_gpu():
        PartialState(cpu=True)
    made = _accelerator_class(Accelerator)(**kwargs)
    plugin = made.state.deepspeed_plugin
    if plugin is not None:
        run_of(made, skip_checks)
        if is_distributed():
            WAITS_FOR_RANKS.add(made)
    return made


_CLASSES = {}


def _accelerator_class(base):
    """``base`` (accelerate.Accelerator) whose ``prepare`` runs hf_zero.checks' model and engine checks around the
    engine it builds, as ``hf_zero.prepare`` does (with its default options), so Accelerate's own loop gets them with
    the one-line glue; made on first use so that importing hf_zero does not import accelerate."""
    if base not in _CLASSES:
        class ZeroAccelerator(base):
            hf_zero_base = base

            def prepare(self, *args, **kwargs):
                return _checked_prepare(self, base.prepare, args, kwargs, ZeroOptions.for_door("accelerate", {}))

        _CLASSES[base] = ZeroAccelerator
    return _CLASSES[base]


def _checked_prepare(accelerator, base_prepare, objects, kwargs, options: ZeroOptions):
    """``base_prepare(accelerator, *objects, **kwargs)`` (Accelerate's own prepare) with hf_zero.checks' model
    moment before it and its engine moment after it, when it builds a DeepSpeed engine (a model among ``objects``)."""
    import torch
    from accelerate.utils import DummyOptim

    plugin = accelerator.state.deepspeed_plugin
    model = next((obj for obj in objects if isinstance(obj, torch.nn.Module)), None)
    if plugin is None or model is None:
        return base_prepare(accelerator, *objects, **kwargs)
    run = run_of(accelerator, options.skip_checks)  # hf_zero.accelerator() ran the config checks; a plain one here
    run.skip = run.skip | frozenset(options.skip_checks)
    run.options, run.model = options, model
    run.loaders = [obj for obj in objects if isinstance(obj, torch.utils.data.DataLoader)]
    run.optimizers = [obj for obj in objects if isinstance(obj, (torch.optim.Optimizer, DummyOptim))]
    raise_errors(run_moment(CHECKS, "model", run))
    objects = [with_preset_optimizer(run.config, obj) if isinstance(obj, (torch.optim.Optimizer, DummyOptim)) else obj
               for obj in objects]
    prepared = base_prepare(accelerator, *objects, **kwargs)
    engine = next(obj for obj in (prepared if isinstance(prepared, tuple) else (prepared,))
                  if isinstance(obj, torch.nn.Module))
    run.engine, run.model = engine, accelerator.unwrap_model(engine)
    # the loaders as the loop iterates them: Accelerate's shards, one per rank
    run.loaders = [obj for obj in (prepared if isinstance(prepared, tuple) else (prepared,))
                   if isinstance(obj, torch.utils.data.DataLoader)]
    raise_errors(run_moment(CHECKS, "engine", run))
    return prepared


def prepare(accelerator, model, *objects, **options):
    """``accelerator.prepare(model, *objects)`` for a DeepSpeed run, with hf_zero.checks' list around it: the list
    ZeroCallback runs for the Trainer (docs/run-checks.md). The model checks run before the engine is built (world size,
    parallel layout, host memory, LoRA and checkpointing under ZeRO-3, ...), the engine checks after it (DeepSpeed
    drives the model, every launched rank trains in it, ZeRO-3 partitioned it; the ZeRO-3 guards); errors of one
    moment are raised together (ConfigError). Returns what ``accelerator.prepare`` returns.

    The optimizer among ``objects`` may be a DummyOptim (its betas/eps kwargs fill the config's "auto" ones, torch's
    defaults otherwise) or a torch Adam/AdamW, whose hyperparameters then configure the preset's DeepSpeed AdamW.

    The keyword options are ZeroCallback's, with the same meaning (hf_zero.checks.options' ZeroOptions;
    docs/callback.md#options lists each with its default here), but for the Trainer-only ones. One default differs:
    ``offload_step_in_forward`` is off, because a loop may read parameter tensors between ``optimizer.step()`` and
    the next forward; a ``state_dict``, ``accelerator.save_state`` and ``hf_zero.save_pretrained`` finish the step
    first, and ``hf_zero.finish_offload_step(model)`` finishes it on demand."""
    chosen = ZeroOptions.for_door("accelerate", options)
    if accelerator.state.deepspeed_plugin is None:
        return accelerator.prepare(model, *objects)
    # the class's own prepare; for an Accelerator from hf_zero.accelerator(), Accelerate's (its own runs the checks)
    base = getattr(type(accelerator), "hf_zero_base", type(accelerator))
    return _checked_prepare(accelerator, base.prepare, (model, *objects), {}, chosen)


prepare.__signature__ = ZeroOptions.signature("accelerate", [
    inspect.Parameter("accelerator", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    inspect.Parameter("objects", inspect.Parameter.VAR_POSITIONAL)])
