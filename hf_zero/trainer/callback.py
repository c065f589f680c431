"""ZeroCallback: makes a Trainer + DeepSpeed ZeRO run fail loudly instead of silently wrong."""

import json
import logging
import os
import weakref
from pathlib import Path

from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState

from ..checkpoints.folders import set_aside_partial, training_state_problems
from ..checkpoints.saved_models import saved_model_problems
from ..compat.hf_api import enable_model_checkpointing, model_checkpointing_on, rotate_checkpoints
from ..config.dotted import half_precision, offload_devices, zero_stage
from ..config.live import GATHER_ON_SAVE, deepspeed_config_of, drop_gpu_only_settings, gather_weights_on_save
from ..config.validate import check_config
from ..distributed import barrier, from_rank0, gpu_memory_bytes, has_gpu, world_size
from ..engine_checks import engine_problems, layout_problems, parallel_sizes, training_alone
from ..engine_fixes import finish_offload_step, offload_fixes_applied, step_chunk_problem
from ..errors import CheckpointError, ConfigError
from ..long_context import LongContext, enable_long_context
from ..offload_threads import AUTO, threads_for_offload
from ..sequence_parallel import (active_parallelism_config, attention_head_counts, check_batches_of,
                                 sequence_parallel_problems)
from ..zero3.divergence import divergence_check_problem, watch_fetch_order
from ..zero3.generation import keep_generation_in_step
from ..zero3.modalities import keep_vision_in_step, vision_in_step_problem
from ..zero3.moe import make_moe_leaves, moe_leaves_problem
from ..zero3.partitions import full_numel, is_zero3_param
from .gradient_checkpointing import (default_checkpointing_kwargs, gradient_checkpointing_kwargs, gradient_checkpointing_on,
                                     peft_recompute_problems, set_gradient_checkpointing_kwargs,
                                     turn_on_gradient_checkpointing)
from .memory import all_ranks_memory, host_memory_problem_of
from .padding import padding_advice
from .peft_fixes import adapters_to_training_dtype, no_leaf_modules_with_frozen_weights, zero2_advice
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


def _half_dtype(config: dict, args):
    """The run's 16-bit training dtype (torch.bfloat16 / float16), or None for fp32."""
    import torch

    flags = {flag: bool(getattr(args, flag, False)) for flag in ("bf16", "fp16")}
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(half_precision(config, flags))


def single_process_note(config: dict, stage, ranks: int) -> str | None:
    """ZeRO shards across data-parallel ranks: one rank shards nothing, unless states go to CPU or NVMe."""
    if ranks != 1 or not stage or offload_devices(config):
        return None
    return (f"ZeRO-{stage} on a single process shards nothing: the whole model, its gradients and Adam states stay "
            "on this device, and DeepSpeed's bookkeeping only slows each step (measured: hf_zero's docs, "
            "performance.md). Fix: train without a DeepSpeed config, launch more processes, or use "
            "an offload preset (zero2_offload, zero3_offload) when the model does not fit.")


# Trainer -> the ZeroCallback that prepared it: a callback the Trainer re-creates from a checkpoint's state
# (restore_callback_states_from_checkpoint) takes over from it instead of preparing the run twice
_PREPARED = weakref.WeakKeyDictionary()


class ZeroCallback(TrainerCallback, ExportableState):
    """Checks and fixes a Trainer run under DeepSpeed ZeRO.

    Use it as any TrainerCallback: ``Trainer(..., callbacks=[ZeroCallback()])`` (or the class),
    ``trainer.add_callback(ZeroCallback())``, or ``hf_zero.attach(trainer)``. It prepares the run once, before the
    DeepSpeed engine exists: when the Trainer is built (callbacks=[...]), when attached, or, added later, when
    ``trainer.train()`` starts.

    Before training: the config passes DeepSpeed's own parser; ZeRO without offload on a single
    process (nothing to shard, only slower) is reported; stage 3 saves gathered 16-bit
    weights; gradient checkpointing is non-reentrant with ``use_cache=False``; a stage-3 model
    built whole (not by zero.Init) is reported with its host-memory cost; with ``torch_compile``,
    stage 3 compiles each repeated block's forward and keeps DeepSpeed's hooks out of the graph
    (hf_zero/trainer/compile.py).
    Before the engine: with the optimizer offloaded, torch's CPU thread count (DeepSpeed's CPU Adam runs on it) is
    raised to this process's share of the node's cores where a launcher left it lower (``offload_threads``: "auto",
    a number to raise it to, or None to leave it). Under ZeRO-3 a frozen base's fp32 adapters (peft's LoRA) are cast to its 16-bit
    dtype, as ZeRO-1/2 train them (``cast_adapters=False`` keeps them fp32).
    At train begin: DeepSpeed really drives the model, on the launched world size, and stage-3
    parameters are partitioned; otherwise ConfigError before the first step. Under ZeRO-1/2 with the optimizer
    offloaded, DeepSpeed's per-parameter host test for inf/NaN gradients (a synchronization per parameter) is left
    out; the gradient norm catches the same overflows. On one GPU the host's optimizer step runs in the next forward,
    in chunks (``offload_step_chunk`` elements), each just before the layer whose weights it updates, so the host and
    the GPU work at once (``offload_step_in_forward=False`` keeps DeepSpeed's step; the weights are final at train
    end, and whenever a state_dict or a save asks). Under ZeRO-3 with the optimizer offloaded and the 16-bit
    parameters on the GPU, each updated sub-group reaches the GPU through a pinned buffer instead of a synchronous
    copy from pageable memory (``overlap_offload_copies=False`` keeps DeepSpeed's own paths for all three).
    While training: per-rank memory and the ZeRO stage join the Trainer's logs.
    ``long_context=True`` (or a dict of parts) turns on hf_zero.long_context's tiled MLP, fused loss and
    offloaded checkpointed activations before the engine exists (and gradient checkpointing with them).
    Under ZeRO-3 on several ranks, ranks whose batch has no images run a vision-language model's vision tower on a
    dummy input, so every rank gathers the same modules (``vision_in_step``: "keep", "per_step" or "off";
    hf_zero/zero3/modalities.py).
    Under ZeRO-3, mixture-of-experts blocks whose ranks can run different experts become ZeRO-3 leaves before the
    engine exists (hf_zero/zero3/moe.py; ``moe_leaves="off"`` leaves the model as it is).
    At each checkpoint: the model folder is verified to reload with ``from_pretrained`` (weights
    present, no zero-size tensors, shapes match) and keeps ``use_cache`` as the model had it.
    """

    def __init__(self, *, log_memory: bool = True, force_gather_on_save: bool = True, cast_adapters: bool = True,
                 long_context=None, overlap_offload_copies: bool = True, offload_threads=AUTO,
                 offload_step_chunk: int | None = None, offload_step_in_forward: bool = True,
                 divergence_check: str = "first_steps", vision_in_step: str = "keep", moe_leaves: str = "auto"):
        self.log_memory = log_memory
        self.force_gather_on_save = force_gather_on_save
        self.cast_adapters = cast_adapters
        self.overlap_offload_copies = overlap_offload_copies
        self.offload_threads = offload_threads
        chunk_problem = step_chunk_problem(offload_step_chunk)
        if chunk_problem:
            raise ConfigError(chunk_problem)
        self.offload_step_chunk = offload_step_chunk
        self.offload_step_in_forward = offload_step_in_forward
        divergence_problem = divergence_check_problem(divergence_check) or vision_in_step_problem(vision_in_step)
        if divergence_problem:
            raise ConfigError(divergence_problem)
        self.divergence_check = divergence_check
        self.vision_in_step = vision_in_step
        moe_problem = moe_leaves_problem(moe_leaves)
        if moe_problem:
            raise ConfigError(moe_problem)
        self.moe_leaves = moe_leaves
        self._fetch_watch = None
        self.long_context = LongContext.from_option(long_context)
        self.trainer = None
        self.stage = None
        self.warnings = []
        self.engine_fixes = []  # the notes of hf_zero.engine_fixes' fixes applied at train begin
        self._saved_use_cache = None
        self._save_total_limit = None

    @property
    def options(self) -> dict:
        return {"log_memory": self.log_memory, "force_gather_on_save": self.force_gather_on_save,
                "cast_adapters": self.cast_adapters, "overlap_offload_copies": self.overlap_offload_copies,
                "offload_threads": self.offload_threads, "offload_step_chunk": self.offload_step_chunk,
                "offload_step_in_forward": self.offload_step_in_forward, "divergence_check": self.divergence_check,
                "vision_in_step": self.vision_in_step,
                "moe_leaves": self.moe_leaves,
                "long_context": self.long_context.as_dict() if self.long_context else None}

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
        if self.long_context is not None:
            self._prepare_long_context(trainer.args, trainer.model)
        self._before_engine(trainer.args, trainer.model)
        if deepspeed_config_of(trainer.args) is not None:
            self._take_over_rotation(trainer.args)
            self._set_aside_partial_checkpoints(trainer.args)
            advice = padding_advice(trainer.data_collator, has_gpu())
            if advice:
                self._warn(advice)
        if getattr(trainer, "is_in_train", False):
            self._redo_gradient_checkpointing(trainer)
        return self

    def _prepare_long_context(self, args, model) -> None:
        """The parts go on the model; offloading what checkpointing saves needs checkpointing on."""
        parts = enable_long_context(model, self.long_context)
        if parts.offload_activations and not gradient_checkpointing_on(args):
            turn_on_gradient_checkpointing(args)
            self._warn("long_context turned gradient checkpointing on: offload_activations moves the checkpointed "
                       "layer inputs to host memory.")

    def _take_over_from(self, previous: "ZeroCallback") -> None:
        for name in ("stage", "warnings", "_saved_use_cache", "_save_total_limit"):
            setattr(self, name, getattr(previous, name))
        _PREPARED[self.trainer] = self

    def _redo_gradient_checkpointing(self, trainer) -> None:
        """Added after the Trainer was built, the callback prepares the run inside train(), which has just turned
        gradient checkpointing on with the arguments' kwargs: turn it on again with the kwargs set now."""
        kwargs = gradient_checkpointing_kwargs(trainer.args)
        model = trainer.model
        if kwargs is not None and gradient_checkpointing_on(trainer.args) and model_checkpointing_on(model):
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

    # ---- before the engine exists ---------------------------------------------------------
    def _before_engine(self, args, model) -> None:
        config = deepspeed_config_of(args)
        if config is None:
            return
        if args.world_size != world_size():
            raise ConfigError(training_alone(args.world_size, world_size(), "the Trainer"))
        parallelism = active_parallelism_config(self.trainer, args)
        sp, tp = parallel_sizes(config, parallelism)
        heads, kv_heads = attention_head_counts(model)
        problems = layout_problems(world_size(), sp, tp, heads, kv_heads)
        problems += sequence_parallel_problems(model, parallelism, world_size(), sp, on_cpu=not has_gpu())
        if problems:
            raise ConfigError(problems)
        if sp > 1 and self.trainer is not None:
            check_batches_of(self.trainer, sp)
        if offload_devices(config):
            problem = host_memory_problem_of(config, model, args, half=2 if _half_dtype(config, args) else 4)
            if problem:
                raise ConfigError(problem)
            note = threads_for_offload(config, self.offload_threads)
            if note:
                self._warn(note)
        if not has_gpu():
            for note in drop_gpu_only_settings(config):  # the engine is built later from this dict
                self._warn(note)
        for finding in check_config(config, on_cpu=not has_gpu(), world_size=world_size(), environment=True,
                                    sequence_parallel=sp):
            if finding.code != "zero3-no-gather":
                self._warn(str(finding))
        self.stage = zero_stage(config)
        note = single_process_note(config, self.stage, world_size())
        if note:
            self._warn(note)
        if self.stage == 3:
            if not self.force_gather_on_save and not config["zero_optimization"].get(GATHER_ON_SAVE, False):
                raise ConfigError(f"stage 3 with {GATHER_ON_SAVE} off: every saved model would be "
                                  "ZeRO shards that from_pretrained cannot load. Fix: set it to true in the config.")
            # The engine is built later from this same dict, so this reaches save_model.
            note = gather_weights_on_save(config)
            if note:
                self._warn(note)
            self._frozen_weights_under_zero3(model, config, args)
            self._compile_blocks_not_hooks(model, config)
            # DeepSpeed reads leaf flags when it builds the engine; after compile's block leaves, which hold the MoE ones
            make_moe_leaves(model, config, self.moe_leaves)
            # Adapters (LoRA) wrapped around a zero.Init model are not partitioned until the engine
            # partitions them; only a base built whole costs host memory.
            if not any(is_zero3_param(p) for p in model.parameters()):
                n = sum(p.numel() for p in model.parameters())
                size = sum(p.numel() * p.element_size() for p in model.parameters())
                ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
                self._warn(f"the model ({n / 1e6:.1f}M parameters) was built whole on every rank before ZeRO-3 "
                           f"partitioned it: {size * ranks / 1024**3:.2f} GiB of host memory on this node at load. "
                           "Fix: create TrainingArguments(deepspeed=...) before from_pretrained, or load with "
                           "hf_zero.from_pretrained(cls, path, config).")
        if gradient_checkpointing_on(args) and gradient_checkpointing_kwargs(args) is None:
            # One choice across transformers releases (whose defaults differ), and never the one that fails here.
            # A user's own use_reentrant is left alone: on DeepSpeed 0.19.8 both train ZeRO-3 to the same bits
            # (tests/multiproc/test_reentrant_checkpointing.py); peft_recompute_problems stops the one that fails.
            set_gradient_checkpointing_kwargs(args, default_checkpointing_kwargs(model, args))
        problems = peft_recompute_problems(model, args)
        if problems:
            raise ConfigError(problems)

    def _frozen_weights_under_zero3(self, model, config, args) -> None:
        """LoRA/adapters under ZeRO-3: no leaf modules (DeepSpeed breaks them), adapters in the base's 16-bit
        dtype (as ZeRO-1/2 train them), and ZeRO-2 advice where it fits."""
        frozen = [p for p in model.parameters() if not p.requires_grad]
        if not frozen:
            return
        note = no_leaf_modules_with_frozen_weights(model, config)
        if note:
            self._warn(note)
        dtype = _half_dtype(config, args)
        note = adapters_to_training_dtype(model, dtype) if self.cast_adapters and dtype is not None else None
        if note:
            self._warn(note)
        advice = zero2_advice(sum(full_numel(p) for p in frozen), gpu_memory_bytes())
        if advice:
            self._warn(advice)

    def _compile_blocks_not_hooks(self, model, config) -> None:
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is None:
            return
        from .compile import take_over_zero3_compile  # imports DeepSpeed and Accelerate: only for compiled runs

        note = take_over_zero3_compile(accelerator, model, config)
        if note:  # it changes what the user asked Accelerate to do, so it is said, like the save-gather fix
            self._warn(note)

    # ---- train begin: what actually got built ----------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if deepspeed_config_of(args) is None and not args.deepspeed:
            return
        if self.trainer is None:
            raise ConfigError("ZeroCallback did not find the Trainer that runs it, so it could not prepare the run "
                              "before the DeepSpeed engine was built. Fix: hf_zero.attach(trainer) after building the Trainer.")
        launched = world_size()
        sp, tp = parallel_sizes(deepspeed_config_of(args) or {}, active_parallelism_config(self.trainer, args))
        problems = engine_problems(self.trainer.model_wrapped, model, self.stage, launched, sp=sp, tp=tp)
        if problems:
            raise ConfigError(problems)
        if gradient_checkpointing_on(args) and getattr(model.config, "use_cache", None):
            model.config.use_cache = False  # a KV cache is useless while checkpointing and warns every step
        in_forward = self.offload_step_in_forward and not args.torch_compile  # compile would trace its hooks
        self.engine_fixes = offload_fixes_applied(self.trainer.model_wrapped, in_forward,
                                                  self.offload_step_chunk) if self.overlap_offload_copies else []
        for note in self.engine_fixes if state.is_world_process_zero else []:
            logger.info("hf_zero: %s", note)
        self._fetch_watch = watch_fetch_order(self.trainer.model_wrapped, self.divergence_check)
        keep_generation_in_step(self.trainer.model_wrapped)
        keep_vision_in_step(self.trainer.model_wrapped, self.vision_in_step)  # its hooks on the model keep it alive
        if state.is_world_process_zero:
            logger.info("hf_zero: DeepSpeed ZeRO-%s engine on %d rank(s)%s", self.stage, launched,
                        ", gradient checkpointing with use_cache off" if gradient_checkpointing_on(args) else "")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or self.stage is None:
            return
        logs["zero_stage"] = self.stage
        if self.log_memory:
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
            problems = training_state_problems(folder) + saved_model_problems(folder, model)
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
    if "long_context" in options:  # True and the dict of all parts are the same request
        parts = LongContext.from_option(options["long_context"])
        options = {**options, "long_context": parts.as_dict() if parts else None}
    differ = {k: v for k, v in options.items() if existing.options.get(k, v) != v or k not in existing.options}
    if differ:
        raise ConfigError(f"this Trainer has a ZeroCallback already, with {existing.options}; attach asked for "
                          f"{differ}. Fix: pass the options to the one ZeroCallback(...) you give the Trainer.")
    return existing.attach(trainer)
