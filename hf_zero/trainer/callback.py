"""ZeroCallback: makes a Trainer + DeepSpeed ZeRO run fail loudly instead of silently wrong."""

import inspect
import json
import logging
import weakref
from pathlib import Path

from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState

from ..checkpoints.folders import set_aside_partial
from ..checks import CHECKS, LONG_CONTEXT, RunContext, raise_errors, run_moment
from ..checks.options import ZeroOptions
from ..compat.hf_api import (checkpointing_kwargs, checkpointing_on, enable_model_checkpointing, model_checkpointing_on,
                             rotate_checkpoints)
from ..compat.op_builds import prepare_op_builds
from ..config.live import deepspeed_config_of
from ..distributed import barrier, from_rank0
from ..engine.fixes import finish_offload_step
from ..errors import CheckpointError, ConfigError
from .memory import all_ranks_memory
from .wiring import trainer_calling, trainer_starting_train

logger = logging.getLogger("hf_zero")


def _loaded_use_cache(model):
    """use_cache as the model came: the Trainer (5.24) overwrites it with args.use_cache (False) at init,
    so every model it saves would otherwise generate without a KV cache."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "use_cache"):
        return None
    config_file = Path(getattr(config, "_name_or_path", "") or "/nonexistent") / "config.json"
    try:
        if config_file.is_file():
            return json.loads(config_file.read_text()).get("use_cache", config.use_cache)
        return getattr(type(config)(), "use_cache", None)
    except Exception:  # a config class that cannot be built bare: keep what the model says
        return config.use_cache


# Trainer -> the ZeroCallback that prepared it: a callback the Trainer re-creates from a checkpoint's state
# (restore_callback_states_from_checkpoint) takes over from it instead of preparing the run twice
_PREPARED = weakref.WeakKeyDictionary()


class ZeroCallback(TrainerCallback, ExportableState):
    """Checks and fixes a Trainer run under DeepSpeed ZeRO.

    Use it as any TrainerCallback: ``Trainer(..., callbacks=[ZeroCallback()])`` (or the class),
    ``trainer.add_callback(ZeroCallback())``, or ``hf_zero.attach(trainer)``. It prepares the run once, before the
    DeepSpeed engine exists: when the Trainer is built (callbacks=[...]), when attached, or, added later, when
    ``trainer.train()`` starts.

    It runs hf_zero.checks' list, the one ``hf_zero.prepare`` runs in an Accelerate loop (docs/run-checks.md names
    each check, its moment and its off-switch): the config before anything is built, the model and the launch before
    the engine, the engine at train begin, each checkpoint at save. Errors from one moment are raised together
    (ConfigError); ``skip_checks=[id, ...]`` turns checks off by id. Its keyword options are hf_zero.checks.options'
    ZeroOptions, the ones ``hf_zero.prepare`` takes (docs/callback.md#options lists each with its default), plus
    ``long_context`` (hf_zero.long_context before the engine exists), ``force_gather_on_save`` and ``log_memory``.

    Besides the checks, it keeps the Trainer's checkpoints safe: old ones rotate only after the newest is verified,
    a save cut short is set aside at the next start, and each saved config keeps ``use_cache`` as the model had it.
    """

    def __init__(self, **options):
        # the options (docs/callback.md#options): declared once, in hf_zero.checks.options, for both doors
        self.zero_options = ZeroOptions.for_door("trainer", options)
        self._fetch_watch = None
        self.trainer = None
        self.run = None  # the RunContext hf_zero.checks reads and records (run.ran: every check, per moment)
        self.stage = None
        self.warnings = []
        self.engine_fixes = []  # the notes of hf_zero.engine.fixes' fixes applied at train begin
        self._saved_use_cache = None
        self._save_total_limit = None

    @property
    def options(self) -> dict:
        """The options as plain values (kept in each checkpoint; ``ZeroCallback(**options)`` takes them back)."""
        return self.zero_options.as_dict()

    # ---- wiring -------------------------------------------------------------------------
    def attach(self, trainer) -> "ZeroCallback":
        """Hook into ``trainer`` and prepare its run; call after building it and before ``trainer.train()``.

        The callback goes first in the Trainer's list so the memory figures it adds to the logs
        reach TensorBoard/W&B, which log from their own callbacks.
        """
        if self.trainer is trainer:
            return self
        if self.trainer is not None:
            raise ConfigError("this ZeroCallback already serves another Trainer. Fix: give each Trainer its own "
                              "ZeroCallback() (or call hf_zero.attach(trainer) for each).")
        callbacks = trainer.callback_handler.callbacks
        others = [c for c in callbacks if isinstance(c, ZeroCallback) and c is not self]
        if others:
            raise ConfigError("this Trainer has a ZeroCallback already; one runs the checks. Fix: pass it once: "
                              "callbacks=[ZeroCallback()], trainer.add_callback(ZeroCallback()) or hf_zero.attach(trainer).")
        self.trainer = trainer
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        previous = _PREPARED.get(trainer)
        if previous is not None and previous is not self:
            self._take_over_from(previous)
            return self
        _PREPARED[trainer] = self
        self._saved_use_cache = _loaded_use_cache(trainer.model)
        self._before_engine(trainer)
        if deepspeed_config_of(trainer.args) is not None:
            self._take_over_rotation(trainer.args)
            self._set_aside_partial_checkpoints(trainer.args)
        if getattr(trainer, "is_in_train", False):
            self._redo_gradient_checkpointing(trainer)
        return self

    def _take_over_from(self, previous: "ZeroCallback") -> None:
        for name in ("stage", "warnings", "run", "_saved_use_cache", "_save_total_limit"):
            setattr(self, name, getattr(previous, name))
        _PREPARED[self.trainer] = self

    def _redo_gradient_checkpointing(self, trainer) -> None:
        """Added after the Trainer was built, the callback prepares the run inside train(), which has just turned
        gradient checkpointing on with the arguments' kwargs: turn it on again with the kwargs set now."""
        kwargs = checkpointing_kwargs(trainer.args)
        model = trainer.model
        if kwargs is not None and checkpointing_on(trainer.args) and model_checkpointing_on(model):
            enable_model_checkpointing(model, dict(kwargs))

    def on_init_end(self, args, state, control, **kwargs):
        # Trainer(callbacks=[ZeroCallback()]): the Trainer is built, its engine is not (see wiring.py)
        trainer = trainer_calling(self)
        if trainer is not None:
            self.attach(trainer)

    def state(self) -> dict:
        """What the Trainer keeps of this callback in a checkpoint (ExportableState). The Trainer also asks for
        it when train() starts, before it builds the engine: a callback added with add_callback prepares then
        (see wiring.py)."""
        if self.trainer is None:
            trainer = trainer_starting_train(self)
            if trainer is not None:
                self.attach(trainer)
        return {"args": self.options, "attributes": {}}

    def _take_over_rotation(self, args) -> None:
        """The Trainer deletes old checkpoints right after writing a new one, before anything checked it;
        hf_zero rotates in on_save instead, once the new checkpoint is verified complete."""
        if args.save_total_limit:
            self._save_total_limit, args.save_total_limit = args.save_total_limit, None

    def _set_aside_partial_checkpoints(self, args) -> None:
        """A save cut short (a rank killed mid-write) leaves checkpoint-N without trainer_state.json or with
        truncated shards, and resume_from_checkpoint=True would pick it and fail. Rename such folders to
        partial-checkpoint-N: nothing is deleted, and the Trainer resumes from the last complete one."""
        moved = []
        if args.should_save:
            moved = set_aside_partial(args.output_dir)
        barrier()
        for path, problems in moved:
            self._warn(f"set aside incomplete checkpoint as {path}: {'; '.join(problems)}")

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        logger.warning("hf_zero: %s", message)

    # ---- the checks: hf_zero.checks, the same list hf_zero.prepare runs ---------------------------------------
    def _run_of(self, trainer, config: dict) -> RunContext:
        """The run hf_zero.checks sees; ``trainer`` is None only for a save of a callback that never found its Trainer
        (that moment reads the folder and the model it is given)."""
        if self.run is None:
            args = getattr(trainer, "args", None)
            # the ids skipped on the arguments (their checks ran there) stay skipped here
            skip = set(self.zero_options.skip_checks) | set(getattr(args, "skip_checks", None) or ())
            self.run = RunContext("trainer", config, options=self.zero_options, skip=frozenset(skip),
                                  model=getattr(trainer, "model", None), args=args, trainer=trainer,
                                  accelerator=getattr(trainer, "accelerator", None),
                                  compiled=bool(getattr(args, "torch_compile", False)), warnings=self.warnings)
        return self.run

    def _before_engine(self, trainer) -> None:
        config = deepspeed_config_of(trainer.args)
        if config is None:  # no ZeRO run: only long_context applies (long sequences on one GPU without DeepSpeed)
            if self.zero_options.long_context is not None:
                raise_errors(run_moment(LONG_CONTEXT, "model", self._run_of(trainer, {})))
            return
        prepare_op_builds()  # the engine builds fused Adam / cpu_adam at the first step
        run = self._run_of(trainer, config)
        for moment in ("config", "model"):
            raise_errors(run_moment(CHECKS, moment, run))
        self.stage = run.stage

    # ---- train begin: what actually got built ----------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if deepspeed_config_of(args) is None and not args.deepspeed:
            return
        if self.trainer is None:
            raise ConfigError("ZeroCallback did not find the Trainer that runs it, so it could not prepare the run "
                              "before the DeepSpeed engine was built. Fix: hf_zero.attach(trainer) after building the Trainer.")
        run = self._run_of(self.trainer, deepspeed_config_of(args) or {})
        run.engine, run.model = self.trainer.model_wrapped, model
        run.loaders = [kwargs["train_dataloader"]] if kwargs.get("train_dataloader") is not None else []
        raise_errors(run_moment(CHECKS, "engine", run))
        self.engine_fixes = run.kept.get("engine_fixes", [])
        self._fetch_watch = run.kept.get("fetch_watch")
        if state.is_world_process_zero:
            logger.info("hf_zero: DeepSpeed ZeRO-%s engine on %d rank(s)%s", self.stage, run.launched,
                        ", gradient checkpointing with use_cache off" if checkpointing_on(args) else "")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or self.stage is None:
            return
        logs["zero_stage"] = self.stage
        if self.zero_options.log_memory:
            logs.update(all_ranks_memory())

    # ---- saves --------------------------------------------------------------------------
    def on_save(self, args, state, control, model=None, processing_class=None, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        barrier()  # rank 0 may still be writing the gathered weights
        problems = []
        if args.should_save and folder.is_dir():
            self._restore_use_cache_in(folder)
            if processing_class is not None and not (folder / "tokenizer_config.json").exists() \
                    and not (folder / "preprocessor_config.json").exists():
                processing_class.save_pretrained(folder)
            run = self._run_of(self.trainer, deepspeed_config_of(args) or {})
            run.folder, run.model, run.checkpoint = folder, model, True
            problems = run_moment(CHECKS, "save", run)
            if not problems and self._save_total_limit:
                # Only now may older checkpoints go: the newest is known to be complete. Newest by
                # mtime, as the Trainer does, so stale higher-numbered folders of an earlier run don't win.
                rotate_checkpoints(self.trainer, args.output_dir, self._save_total_limit)
        problems = from_rank0(problems)  # every rank raises together
        if problems:
            raise CheckpointError("hf_zero: checkpoint is incomplete or will not reload (older checkpoints were kept): "
                               + " ".join(problems))

    def _restore_use_cache_in(self, folder: Path) -> None:
        config_file = folder / "config.json"
        if self._saved_use_cache is None or not config_file.exists():
            return
        config = json.loads(config_file.read_text())
        if config.get("use_cache") == self._saved_use_cache:
            return
        config["use_cache"] = self._saved_use_cache
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.trainer is not None:  # the last step's weights, final before anyone reads them
            finish_offload_step(self.trainer.model_wrapped)
        if self._fetch_watch is not None:
            self._fetch_watch.remove()
        # So the final save_model() writes a model that generates with a cache.
        if self._saved_use_cache is not None and model is not None:
            model.config.use_cache = self._saved_use_cache


def attach(trainer, **options) -> ZeroCallback:
    """Give ``trainer`` a ZeroCallback (first in line) and prepare its run; returns the callback.

    A Trainer that already has one (from callbacks=[...] or add_callback) keeps it: ``options`` may only repeat
    its settings."""
    if not isinstance(trainer, Trainer):
        raise TypeError(f"hf_zero.attach needs a transformers Trainer (or a subclass, e.g. TRL's), got "
                        f"{type(trainer).__name__}")
    existing = next((c for c in trainer.callback_handler.callbacks if isinstance(c, ZeroCallback)), None)
    if existing is None:
        return ZeroCallback(**options).attach(trainer)
    asked = ZeroOptions.for_door("trainer", options).as_dict()
    differ = {name: options[name] for name in options if asked[name] != existing.options[name]}
    if differ:
        raise ConfigError(f"this Trainer has a ZeroCallback already, with {existing.options}; attach asked for "
                          f"{differ}. Fix: pass the options to the one ZeroCallback(...) you give the Trainer.")
    return existing.attach(trainer)


ZeroCallback.__init__.__signature__ = ZeroOptions.signature(
    "trainer", [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
