"""TrainingArguments that accept a preset name for ``deepspeed`` and do the launch glue once: hf_zero's own
class, and the same glue for any TrainingArguments class (TRL's SFTConfig, Seq2SeqTrainingArguments, yours)."""

import dataclasses
import os
import sys
from dataclasses import dataclass, field

import transformers

from ..checks import CHECKS, SKIP_IDS, RunContext, run_moment, skip_problem
from ..config.accelerate_yaml import launched_deepspeed_config
from ..config.live import drop_gpu_only_settings
from ..config.presets import load_config
from ..distributed import accelerate_launched_deepspeed, has_gpu, init_distributed
from ..errors import ConfigError


def accelerate_deepspeed_file():
    """The DeepSpeed config an ``accelerate launch --config_file FILE.yaml`` run uses: the path its YAML names, or the
    dict of the JSON text it holds (the YAMLs hf-zero presets writes carry their preset inline)."""
    if accelerate_launched_deepspeed():
        value = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
        return launched_deepspeed_config(value) if value else None
    return None


NVME_PATH_FIELD = field(default=None, metadata={"help": "Folder on a fast local disk for ZeRO-Infinity (zero3_nvme) offload."})
SKIP_CHECKS_FIELD = field(default_factory=list, metadata={
    "help": "hf_zero check ids to leave out, here and in ZeroCallback (hf_zero's docs, run-checks.md); the checks of "
            "the arguments themselves (fp16-arguments-on-cpu, deepspeed-config) are skipped only here."})
_GLUE_DOC = """
    hf_zero's launch glue, before the arguments compute anything:

    - ``deepspeed`` also takes a preset name ("zero3"), resolved to the shipped JSON;
    - hf_zero.checks' ``arguments`` moment runs before any process group exists: the config against
      DeepSpeed's own parser and hf_zero's rules, and fp16, which DeepSpeed's CPU accelerator lacks,
      refused on a machine without a GPU; every problem is reported at once (ConfigError), and
      ``skip_checks`` (ids, as ZeroCallback takes them) leaves checks out here and in the callback;
    - on a machine without a GPU it sets ``use_cpu=True`` (without it, 2 CPU ranks each train
      silently as world size 1);
    - it starts the process group (gloo on CPU, NCCL on GPU) before the Trainer computes batch
      sizes, and fills RANK/WORLD_SIZE for a plain ``python train.py``;
    - ``nvme_path`` fills the NVMe folder of zero3_nvme.
"""


def apply_launch_glue(args) -> None:
    """The glue itself, on arguments whose own __post_init__ has not run yet."""
    source = args.deepspeed if args.deepspeed is not None else accelerate_deepspeed_file()
    if source is None:
        return
    on_cpu = not has_gpu()
    config = load_config(source, nvme_path=getattr(args, "nvme_path", None))
    if on_cpu:
        drop_gpu_only_settings(config)
    check_arguments(args, config, source=source if isinstance(source, str) else None)
    if on_cpu:
        args.use_cpu = True
    init_distributed()
    if args.deepspeed is not None:
        # A resolved dict: preset names and nvme_path are ours, the Trainer wants a path or dict.
        args.deepspeed = config


def check_arguments(args, config: dict, *, source: str | None = None) -> None:
    """hf_zero.checks' arguments moment on ``args`` and its DeepSpeed ``config``: ConfigError listing every error."""
    skip = getattr(args, "skip_checks", None) or []
    problem = skip_problem(skip, SKIP_IDS)
    if problem:
        raise ConfigError(problem)
    errors = run_moment(CHECKS, "arguments", RunContext("trainer", config, args=args, skip=frozenset(skip)))
    if errors:
        raise ConfigError(errors, source=source)


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    """``transformers.TrainingArguments`` for DeepSpeed ZeRO runs that work the same everywhere.
""" + _GLUE_DOC + """    """

    nvme_path: str | None = NVME_PATH_FIELD
    skip_checks: list[str] = SKIP_CHECKS_FIELD

    def __post_init__(self):
        apply_launch_glue(self)
        super().__post_init__()


def has_launch_glue(args_class) -> bool:
    return getattr(args_class, "_hf_zero_launch_glue", False)


TrainingArguments._hf_zero_launch_glue = True


def zero_arguments(args_class: type) -> type:
    """``args_class`` (a TrainingArguments class: TRL's SFTConfig, DPOConfig, ..., Seq2SeqTrainingArguments, your own)
    with hf_zero's launch glue, as a subclass; HfArgumentParser parses it as it parses the original.

        SFTConfig = hf_zero.zero_arguments(trl.SFTConfig)
        args = SFTConfig(output_dir="out", deepspeed="zero3", bf16=True)
    """
    if not (isinstance(args_class, type) and issubclass(args_class, transformers.TrainingArguments)):
        raise TypeError(f"hf_zero.zero_arguments takes a TrainingArguments class (transformers.TrainingArguments, "
                        f"TRL's SFTConfig, a subclass of yours), got {args_class!r}")
    if has_launch_glue(args_class):
        return args_class
    if args_class is transformers.TrainingArguments:
        return TrainingArguments
    module = sys.modules[__name__]
    name = f"Zero{args_class.__name__}"
    glued = getattr(module, name, None)
    if glued is not None and glued.__bases__ == (args_class,):
        return glued

    def __post_init__(self):
        apply_launch_glue(self)
        args_class.__post_init__(self)

    fields = [(name, kind, default) for name, kind, default in (("nvme_path", str | None, NVME_PATH_FIELD),
                                                                 ("skip_checks", list[str], SKIP_CHECKS_FIELD))
              if name not in args_class.__dataclass_fields__]
    glued = dataclasses.make_dataclass(name, fields, bases=(args_class,), namespace={
        "__post_init__": __post_init__, "_hf_zero_launch_glue": True,
        "__doc__": f"{args_class.__module__}.{args_class.__qualname__} with hf_zero's launch glue.\n" + _GLUE_DOC})
    # Importable by name, so the Trainer can pickle the arguments into each checkpoint's training_args.bin
    glued.__module__, glued.__qualname__ = __name__, name
    setattr(module, name, glued)
    return glued
