"""hf_zero in a user's own Accelerate loop: an Accelerator DeepSpeed really drives, the "auto" values only the
Trainer fills, the checks ZeroCallback runs for the Trainer (hf_zero.checks), and a save that reloads with
``from_pretrained``.

    accelerator = hf_zero.accelerator()          # accelerate launch --config_file recipes/accelerate/zero3.yaml
    model = AutoModelForCausalLM.from_pretrained(path)   # partitioned by zero.Init under ZeRO-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)   # or DummyOptim(...) for DeepSpeed's AdamW
    model, optimizer, loader = hf_zero.prepare(accelerator, model, optimizer, loader)
    ...  # the loop: accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
    hf_zero.save_pretrained(accelerator, model, "out/final", tokenizer)   # every rank calls it
"""

import inspect
import logging
import shutil
import weakref
from pathlib import Path

from .batch_counts import UNEVEN_FIX
from .checkpoints.export import replace_folder
from .checks import CHECKS, RunContext, check_options, raise_errors, run_moment
from .checks.options import ZeroOptions
from .config.findings import TRAINER_AUTO_KEYS
from .config.live import fill_adam_hyperparameters
from .distributed import accelerate_launched_deepspeed, from_rank0, has_gpu, is_distributed, wait_for_every_rank
from .engine_fixes import finish_offload_step
from .errors import CheckpointError, RanksDivergedError

logger = logging.getLogger("hf_zero")

# Accelerator -> the RunContext hf_zero.checks reads and records for its run (run.ran: every check, per moment)
_RUNS = weakref.WeakKeyDictionary()
# Accelerators from hf_zero.accelerator() on several ranks: their saves first find out that every rank called them
_WAITS_FOR_RANKS = weakref.WeakSet()
SAVE_ARRIVAL_TIMEOUT_S = 120


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
            _WAITS_FOR_RANKS.add(made)
    return made


def run_of(accelerator, skip_checks=()) -> RunContext:
    """The run an Accelerator with a DeepSpeed plugin drives, as hf_zero.checks sees it; the config checks run (and
    fix the live config) the first time it is asked for."""
    from accelerate.utils import DynamoBackend

    run = _RUNS.get(accelerator)
    if run is None:
        run = RunContext("accelerate", accelerator.state.deepspeed_plugin.deepspeed_config,
                         skip=frozenset(skip_checks), accelerator=accelerator,
                         compiled=accelerator.state.dynamo_plugin.backend != DynamoBackend.NO)
        raise_errors(run_moment(CHECKS, "config", run))
        _RUNS[accelerator] = run
    return run


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
    objects = [_with_preset_optimizer(run.config, obj) if isinstance(obj, (torch.optim.Optimizer, DummyOptim)) else obj
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


def deepspeed_adamw_for(config: dict, optimizer) -> str | None:
    """A DummyOptim asks for the config's DeepSpeed optimizer. The presets name none (so that a torch optimizer works
    in Accelerate's loop and the Trainer picks its own), and Accelerate refuses a DummyOptim without one: give the
    config DeepSpeed's AdamW with the DummyOptim's values (torch's betas/eps when it names none). Returns a note, or
    None when the config already has an optimizer block."""
    if "optimizer" in config:
        return None
    extra = optimizer.kwargs
    params = {"lr": optimizer.lr, "weight_decay": optimizer.weight_decay,
              "betas": list(extra.get("betas") or TRAINER_AUTO_KEYS["optimizer.params.betas"]),
              "eps": extra.get("eps") or TRAINER_AUTO_KEYS["optimizer.params.eps"]}
    config["optimizer"] = {"type": "AdamW", "params": params}
    return f"DummyOptim: DeepSpeed's AdamW with {params} (the config names no optimizer)"


def _with_preset_optimizer(config: dict, optimizer):
    """A DummyOptim (or, for a torch Adam/AdamW, one with its hyperparameters) for the config's optimizer block, with
    the "auto" betas/eps Accelerate does not fill taken from it (torch's AdamW defaults when it names none)."""
    import torch
    from accelerate.utils import DummyOptim

    if optimizer is None:
        return optimizer
    if "optimizer" not in config:
        # a torch optimizer goes to DeepSpeed as it is (Accelerate swaps it for DeepSpeedCPUAdam under offload)
        if isinstance(optimizer, DummyOptim):
            note = deepspeed_adamw_for(config, optimizer)
            logger.info("hf_zero: %s", note)
        return optimizer
    if isinstance(optimizer, torch.optim.Optimizer):
        if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            return optimizer  # the optimizer-type check refuses it unless skipped; then Accelerate says what it thinks
        defaults = optimizer.defaults
        params = [p for group in optimizer.param_groups for p in group["params"]]
        optimizer = DummyOptim(params, lr=defaults["lr"], weight_decay=defaults.get("weight_decay", 0.0),
                               betas=defaults.get("betas"), eps=defaults.get("eps"))
    if isinstance(optimizer, DummyOptim):
        extra = optimizer.kwargs
        for note in fill_adam_hyperparameters(config, betas=extra.get("betas") or TRAINER_AUTO_KEYS["optimizer.params.betas"],
                                              eps=extra.get("eps") or TRAINER_AUTO_KEYS["optimizer.params.eps"]):
            logger.info("hf_zero: %s", note)
    return optimizer


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


def save_pretrained(accelerator, model, out_dir, processing_class=None, *, arrival_timeout_s: float = SAVE_ARRIVAL_TIMEOUT_S) -> Path:
    """Save the trained model (gathered 16-bit weights under ZeRO-3) as a ``from_pretrained`` folder; every rank calls it.

    The folder is written beside ``out_dir`` and moved into place only once it is verified to reload (weights
    present, no zero-size tensors, shapes match), so a failed save never replaces a good folder. A rank that does not
    call it (a save under ``if accelerator.is_main_process:``) is found before anything is gathered or written: the
    ranks wait ``arrival_timeout_s`` for each other (Accelerators from ``hf_zero.accelerator()``)."""
    out_dir = Path(out_dir)
    if accelerator in _WAITS_FOR_RANKS:
        uneven = _RUNS[accelerator].kept.get("uneven_batches") if accelerator in _RUNS else None
        fix = "call it on every rank, not under `if accelerator.is_main_process:`."
        if uneven:  # the ranks that are missing still run the steps the others did not have
            fix = f"the likely cause is {uneven}; {UNEVEN_FIX[5:]}"
        try:
            wait_for_every_rank("hf_zero.save_pretrained (it gathers ZeRO-3's shards)", arrival_timeout_s, fix)
        except RanksDivergedError as e:
            raise CheckpointError(f"{e} Nothing was written.") from None
    finish_offload_step(model)  # a step prepare(offload_step_in_forward=True) left to the next forward
    state = accelerator.get_state_dict(model)  # a collective: gathers ZeRO-3's 16-bit weights to rank 0
    unwrapped = accelerator.unwrap_model(model)
    problems = []
    if accelerator.is_main_process:
        staging = out_dir.with_name(f".{out_dir.name}.saving")
        shutil.rmtree(staging, ignore_errors=True)
        unwrapped.save_pretrained(str(staging), state_dict=state, safe_serialization=True)
        if processing_class is not None:
            processing_class.save_pretrained(str(staging))
        run = _RUNS.get(accelerator) or RunContext("accelerate", {}, accelerator=accelerator)
        run.folder, run.model = staging, unwrapped
        problems = run_moment(CHECKS, "save", run)
        if problems:
            shutil.rmtree(staging, ignore_errors=True)
        else:
            replace_folder(staging, out_dir)
    problems = from_rank0(problems)
    if problems:
        raise CheckpointError("hf_zero: the saved model would not reload (nothing was replaced): " + " ".join(problems))
    return out_dir
