"""What the checks read of a run, whichever door it came through: the Trainer (its arguments and model) or a user's
Accelerate loop (the Accelerator and what its prepare() was given)."""

import logging
from dataclasses import dataclass, field

from ..compat.hf_api import checkpointing_kwargs, checkpointing_on, model_checkpointing_kwargs, model_checkpointing_on
from ..config.dotted import half_precision, zero_stage
from ..distributed import has_gpu, is_main_process, world_size
from ..engine.checks import parallel_sizes
from ..sequence_parallel import active_parallelism_config
from .options import DOOR_CALLS, ZeroOptions

logger = logging.getLogger("hf_zero")

# the Trainer (ZeroCallback), a user's Accelerate loop (hf_zero.prepare), and a run planned from a config and a model
# shape, nothing launched (hf-zero check --model)
DOORS = (*DOOR_CALLS, "plan")


@dataclass
class RunContext:
    """One run as the checks see it. ``config`` is the live DeepSpeed config the engine will be built from (fixes
    change it in place); ``options`` are the door's ZeroOptions (ZeroCallback's or prepare's keyword arguments; the
    door's defaults when none are given)."""

    door: str
    config: dict
    options: ZeroOptions | None = None
    skip: frozenset = frozenset()
    model: object = None
    args: object = None  # TrainingArguments (the Trainer door)
    trainer: object = None
    accelerator: object = None  # the Trainer's own, or the loop's
    loaders: list = field(default_factory=list)  # the loop's DataLoaders (prepare's; Accelerate's shards from the engine moment on)
    engine: object = None
    folder: object = None  # the save moment: the folder written
    checkpoint: bool = False  # the save moment: a Trainer checkpoint (training state beside the model)
    compiled: bool = False  # the user asked torch.compile for the model
    warnings: list = field(default_factory=list)  # what the checks said at WARNING, in order
    # (moment, id, "fired" / "quiet" for a check, "ran" for a fix or a guard, "skipped")
    ran: list = field(default_factory=list)
    kept: dict = field(default_factory=dict)  # what a check leaves for the door (a watch to remove, fixes applied)
    stage: int | None = None  # the ZeRO stage the config asks for when the run is first checked
    moment: str = ""  # the moment being run (run_moment sets it)
    optimizers: list = field(default_factory=list)  # the loop's optimizers, as prepare() was given them
    world: int | None = None  # the plan door: the processes the run will have (hf-zero check --world-size)
    host_bytes: int | None = None  # the node's memory where it is not this machine's (hf-zero check --host-mem)

    def __post_init__(self):
        self.stage = zero_stage(self.config)
        if self.options is None:
            self.options = ZeroOptions.for_door(self.door, {})

    def say(self, message: str, severity: str) -> None:
        if severity == "warning":
            self.warnings.append(message)
            logger.warning("hf_zero: %s", message)
        elif is_main_process():
            logger.info("hf_zero: %s", message)

    # ---- the run, whichever door ---------------------------------------------------------------
    @property
    def launched(self) -> int:
        return self.world if self.door == "plan" else world_size()

    @property
    def declared_world(self) -> int:
        """The world size the door sized the run for: the Trainer's arguments, the Accelerator, or the plan."""
        if self.door == "plan":
            return self.world
        if self.args is not None:
            return self.args.world_size
        return self.accelerator.num_processes

    @property
    def parallelism(self):
        """Accelerate's ParallelismConfig, the Trainer's or the loop's."""
        return active_parallelism_config(self.accelerator, self.args)

    @property
    def sp_tp(self) -> tuple:
        return parallel_sizes(self.config, self.parallelism)

    @property
    def on_cpu(self) -> bool:
        return not has_gpu()

    @property
    def half_dtype(self):
        """The run's 16-bit training dtype (torch.bfloat16 / float16), or None for fp32."""
        import torch

        if self.door == "plan":
            return torch.bfloat16  # hf-zero check plans a 16-bit run
        if self.args is not None:
            flags = {flag: bool(getattr(self.args, flag, False)) for flag in ("bf16", "fp16")}
        else:
            mixed = str(getattr(self.accelerator, "mixed_precision", "no"))
            flags = {flag: mixed == flag for flag in ("bf16", "fp16")}
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(half_precision(self.config, flags))

    @property
    def checkpointing(self) -> bool:
        """Activation (gradient) checkpointing: asked in the Trainer's arguments, or turned on on the loop's model."""
        if self.args is not None:
            return checkpointing_on(self.args)
        return self.model is not None and model_checkpointing_on(self.model)

    @property
    def checkpointing_kwargs(self):
        """The checkpoint function's kwargs the user gave (None: not given, the Trainer door picks them)."""
        if self.args is not None:
            return checkpointing_kwargs(self.args)
        return model_checkpointing_kwargs(self.model) if self.checkpointing else None

    @property
    def collator(self):
        if self.trainer is not None:
            return getattr(self.trainer, "data_collator", None)
        return next((loader.collate_fn for loader in self.loaders), None)
