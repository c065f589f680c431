"""The benchmark's named setups (DDP, FSDP, HF-docs "auto" DeepSpeed configs, every hf_zero preset) and sweep variants.

A setup is data: how the Trainer is driven (ddp / fsdp / deepspeed), the DeepSpeed config as a plain dict,
the micro batch, gradient checkpointing, extra TrainingArguments and environment variables. Each named
setup comes at micro batch 4 and as "NAME+gc" at micro batch 8 with gradient checkpointing.

Variants for sweeps: ``NAME=BASE:key=value,key=value`` where BASE is any setup name and each key is
``mbs``, ``gc``, ``env.VAR`` (an environment variable of the workers), ``args.FIELD`` (a TrainingArguments
field), ``torchrun.OPTION`` (an option of the launch, e.g. ``torchrun.numa-binding=node``),
``dynamo.NAME`` (a ``torch._dynamo.config`` setting of the workers, e.g. ``dynamo.recompile_limit=64``),
``lora.FIELD`` (train a PEFT LoRA adapter on the frozen model: a ``peft.LoraConfig`` field, e.g. ``lora.r=16``),
``callback.OPTION`` (a ZeroCallback option of DeepSpeed setups, e.g. ``callback.cast_adapters=false``),
``long_context=true`` / ``long_context.PART=false`` (hf_zero.enable_long_context, any setup; turns on checkpointing),
``activation_offload=true`` (torch's ``save_on_cpu(pin_memory=True)`` around each forward: what checkpointing keeps
goes to pinned host memory, the stack a user builds from PyTorch and the Trainer alone; turns on checkpointing),
``data.min_seq`` / ``data.pad_to_multiple_of`` (variable-length samples of min_seq..seq tokens, each batch padded
to its longest, as DataCollatorWithPadding pads a tokenized dataset) or a dotted DeepSpeed key (``zero_optimization.reduce_bucket_size``); a value is JSON where it parses (``1e9``
becomes an integer, ``null`` removes the key), else a string.
"""

import argparse
import copy
import json
import re
from dataclasses import asdict, dataclass, field

from hf_zero.errors import ConfigError
from hf_zero.config.dotted import get_dotted, set_dotted
from hf_zero.config.presets import load_config, preset_names, preset_problem
from hf_zero.long_context import LongContext

MICRO_BATCH, GC_MICRO_BATCH = 4, 8
# named, but never in a default sweep: its swap files go to the work folder's disk (worker.nvme_folder), which
# says more about that disk than about ZeRO
EXTRA_BASES = ("zero3_nvme",)
# every usable JSON in recipes/ is a setup of the harness (a preset added there included)
PRESETS = tuple(name for name in preset_names() if name not in EXTRA_BASES and not preset_problem(name))
BASES = ("ddp", "fsdp", "ds_auto_zero2", "ds_auto_zero3") + PRESETS
# On one GPU there is nothing to shard or compare FSDP with; what matters there is offload vs plain.
ONE_GPU_BASES = ("ddp", "zero2", "zero3", "zero2_offload", "zero3_offload")
DATA_FIELDS = ("min_seq", "pad_to_multiple_of")  # variable-length batches (worker.PadToLongest)
GROUPS = {"all": None, "nogc": False, "gc": True}  # group name -> gradient checkpointing filter

_AUTO_COMMON = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}

# The ZeRO-2 / ZeRO-3 configs of the transformers DeepSpeed docs, as users copy them, minus their
# offload_* blocks (those are compared as zero2_offload / zero3_offload): "auto" buckets become
# hidden^2 elements, 4.2M for a 2048-wide model. 1e9 is written as an integer (same value).
DS_AUTO = {
    "ds_auto_zero2": {**_AUTO_COMMON, "zero_optimization": {
        "stage": 2, "allgather_partitions": True, "allgather_bucket_size": 200_000_000, "overlap_comm": True,
        "reduce_scatter": True, "reduce_bucket_size": "auto", "contiguous_gradients": True}},
    "ds_auto_zero3": {**_AUTO_COMMON, "zero_optimization": {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 1_000_000_000,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1_000_000_000,
        "stage3_max_reuse_distance": 1_000_000_000, "stage3_gather_16bit_weights_on_model_save": True}},
}

_NAME = re.compile(r"^[A-Za-z0-9_.\-+@]+$")  # @: a setup at a batch, e.g. zero2_offload@64k


@dataclass
class Setup:
    name: str
    kind: str  # "ddp" | "fsdp" | "deepspeed": who wraps the model
    micro_batch: int
    gradient_checkpointing: bool
    deepspeed: dict | None = None
    args: dict = field(default_factory=dict)  # extra TrainingArguments fields
    env: dict = field(default_factory=dict)  # extra environment variables of the workers
    torchrun: dict = field(default_factory=dict)  # extra torchrun options (name without "--" -> value)
    dynamo: dict = field(default_factory=dict)  # torch._dynamo.config settings of the workers
    lora: dict = field(default_factory=dict)  # peft.LoraConfig fields; empty: full fine-tuning
    data: dict = field(default_factory=dict)  # DATA_FIELDS; empty: every sample is --seq tokens long
    callback: dict = field(default_factory=dict)  # ZeroCallback options (hf_zero.attach keywords)
    long_context: dict = field(default_factory=dict)  # hf_zero.enable_long_context parts; empty: off
    activation_offload: bool = False  # torch.autograd.graph.save_on_cpu around each forward
    weights: str = ""  # "bf16": DDP/FSDP train a model cast to bf16 (DeepSpeed's bf16 arithmetic); "": fp32 + autocast
    base: str = ""  # the named setup it derives from

    @property
    def stage(self) -> int | None:
        return get_dotted(self.deepspeed, "zero_optimization.stage") if self.deepspeed else None

    @property
    def planner_gap(self) -> str | None:
        """Why the planner has no prediction for this setup, or None."""
        if self.kind == "fsdp":
            return "the planner has no FSDP model"
        if self.kind != "ddp" and self.deepspeed:
            from hf_zero.planner import layout_problem

            return layout_problem(self.deepspeed)
        return None

    def lora_targets(self, model_type: str) -> tuple:
        """The Linear names the LoRA adapter is on: target_modules, or peft's default for the architecture."""
        targets = self.lora.get("target_modules")
        if targets is None:
            from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS

            return tuple(PEFT_DEFAULTS.get(model_type, ()))
        return (targets,) if isinstance(targets, str) else tuple(targets)

    @property
    def planner_setup(self) -> str | None:
        """The planner's name for this setup (None: see planner_gap)."""
        if self.planner_gap:
            return None
        if self.kind == "ddp":
            return "ddp"
        from hf_zero.planner import setup_of_config

        return setup_of_config(self.deepspeed)

    def as_dict(self) -> dict:
        return asdict(self)


def _named(base: str, gc: bool) -> Setup:
    mbs = GC_MICRO_BATCH if gc else MICRO_BATCH
    name = base + ("+gc" if gc else "")
    if base == "ddp":
        return Setup(name, "ddp", mbs, gc, base=base)
    if base == "fsdp":
        return Setup(name, "fsdp", mbs, gc, args={"fsdp": "full_shard auto_wrap"}, base=base)
    config = copy.deepcopy(DS_AUTO[base]) if base in DS_AUTO else load_config(base)
    return Setup(name, "deepspeed", mbs, gc, deepspeed=config, base=base)


def named_setups() -> dict:
    """Every named setup, in table order: each base at micro batch 4, then all "+gc" ones."""
    return {s.name: s for gc in (False, True) for s in (_named(b, gc) for b in BASES + EXTRA_BASES)}


def default_names(nproc: int) -> list:
    bases = BASES if nproc > 1 else ONE_GPU_BASES
    return [b + suffix for suffix in ("", "+gc") for b in bases]


def _parse_value(text: str):
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    # 1e9 is how bucket sizes are written; DeepSpeed wants element counts as integers
    if isinstance(value, float) and value.is_integer() and "e" in text.lower():
        return int(value)
    return value


# the harness sets these for every launch
_HARNESS_TORCHRUN = {"nproc-per-node", "nproc_per_node", "master-addr", "master_addr", "master-port", "master_port"}


def _torchrun_problem(option: str, value: str) -> str | None:
    """Ask torchrun's own parser, so a typo fails here rather than in the middle of a sweep."""
    from torch.distributed.run import get_args_parser

    if option in _HARNESS_TORCHRUN:
        return f"torchrun.{option}: the harness sets it (--nproc for the process count)"
    parser = get_args_parser()
    parser.exit_on_error = False
    parser.allow_abbrev = False  # torchrun itself would take --numa for --numa-binding; here a name is exact
    try:
        _, unknown = parser.parse_known_args([f"--{option}={value}", "worker.py"])
    except argparse.ArgumentError as e:
        return f"torchrun.{option}={value!r}: {e}"
    return f"torchrun has no option --{option}" if unknown else None


def _lora_problem(name: str) -> str | None:
    """Ask peft's own LoraConfig, so a misspelt field fails here rather than in every rank of a launch."""
    try:
        from peft import LoraConfig
    except ImportError:
        return f"lora.{name}: peft is not installed (pip install peft)"
    if name == "task_type":
        return "lora.task_type: the benchmark trains a causal LM (CAUSAL_LM); leave it out"
    if name not in LoraConfig.__dataclass_fields__:
        return f"peft.LoraConfig has no field {name!r}"
    return None


def _callback_problem(option: str, value) -> str | None:
    from hf_zero.checks.options import ZeroOptions, option_problems

    options = [name for name in ZeroOptions.names("trainer") if name != "log_memory"]
    if option not in options:
        return f"callback.{option}: ZeroCallback has no option {option!r} (the bench sets log_memory); options: {', '.join(options)}"
    problems = option_problems({option: value})
    return f"callback.{problems[0]}" if problems else None


def parse_variant(spec: str, known: dict) -> Setup:
    """``NAME=BASE:key=value,...`` -> a Setup derived from the setup BASE (see the module docstring)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise ConfigError(f"--variant {spec!r}: expected NAME=BASE[:key=value,...], e.g. "
                          "z3big=zero3:zero_optimization.reduce_bucket_size=1e9")
    if not _NAME.match(name):
        raise ConfigError(f"--variant {spec!r}: the name {name!r} may only use letters, digits and _ . - + @")
    if name in known:
        raise ConfigError(f"--variant {spec!r}: {name!r} is already a setup name; pick another name")
    base, _, assignments = rest.partition(":")
    if base not in known:
        raise ConfigError(f"--variant {spec!r}: unknown base setup {base!r}; choose one of: {', '.join(known)}")
    setup = copy.deepcopy(known[base])
    setup.name = name
    problems = []
    long_parts = setup.long_context or None
    # split on commas that start a new key=, so values such as PYTORCH_CUDA_ALLOC_CONF's "a:1,b:2" survive
    for item in filter(None, re.split(r",(?=[A-Za-z_][\w.\-]*=)", assignments)):
        key, eq, raw = item.partition("=")
        if not eq or not key:
            problems.append(f"{item!r} is not key=value")
            continue
        value = _parse_value(raw)
        if "," in raw and isinstance(value, str) and not key.startswith("env."):
            # items are split at ",key="; a stray ",word" would otherwise silently join the previous value
            problems.append(f"{key}={raw!r}: a comma inside a value is only allowed in env.VAR values and JSON "
                            "lists; separate items as key=value")
            continue
        if key == "mbs":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"mbs must be a positive integer, got {raw!r}")
            else:
                setup.micro_batch = value
        elif key == "gc":
            if value not in (True, False, 0, 1):
                problems.append(f"gc must be true or false, got {raw!r}")
            else:
                setup.gradient_checkpointing = bool(value)
        elif key.startswith("env."):
            setup.env[key[4:]] = raw  # environment values stay strings, exactly as written
        elif key.startswith("args."):
            setup.args[key[5:]] = value
        elif key.startswith("torchrun."):
            option = key.removeprefix("torchrun.")
            problem = _torchrun_problem(option, raw)
            if problem:
                problems.append(problem)
            else:
                setup.torchrun[option] = raw
        elif key.startswith("dynamo."):
            from torch._dynamo import config as dynamo_config

            name = key.removeprefix("dynamo.")
            if not hasattr(dynamo_config, name):
                problems.append(f"torch._dynamo.config has no setting {name!r}")
            else:
                setup.dynamo[name] = value
        elif key.startswith("lora."):
            problem = _lora_problem(key.removeprefix("lora."))
            if problem:
                problems.append(problem)
            else:
                setup.lora[key.removeprefix("lora.")] = value
        elif key.startswith("callback.") and setup.kind == "deepspeed":
            problem = _callback_problem(key.removeprefix("callback."), value)
            if problem:
                problems.append(problem)
            else:
                setup.callback[key.removeprefix("callback.")] = value
        elif key == "long_context" or key.startswith("long_context."):
            part = key.partition(".")[2]
            if value not in (True, False):
                problems.append(f"{key} must be true or false, got {raw!r}")
            elif part:  # naming a part turns the switch on; the parts not named stay on
                long_parts = {**(long_parts or {}), part: value}
            else:
                long_parts = {} if value else None
        elif key == "activation_offload":
            if value not in (True, False):
                problems.append(f"activation_offload must be true or false, got {raw!r}")
            else:
                setup.activation_offload = value
                setup.gradient_checkpointing = setup.gradient_checkpointing or value  # it moves what checkpointing keeps
        elif key == "weights":
            if value not in ("bf16", "fp32") or setup.kind == "deepspeed":
                problems.append(f"weights={raw!r}: a DDP or FSDP setup's weights are bf16 or fp32 (DeepSpeed setups "
                                "take their precision from the config's bf16 block)")
            else:
                setup.weights = "" if value == "fp32" else value
        elif key.startswith("data."):
            name = key.removeprefix("data.")
            if name not in DATA_FIELDS:
                problems.append(f"data.{name}: unknown; the data keys are {', '.join('data.' + f for f in DATA_FIELDS)}")
            elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{key} must be a positive integer (tokens), got {raw!r}")
            else:
                setup.data[name] = value
        elif setup.kind != "deepspeed":
            problems.append(f"{key!r}: {base} is not a DeepSpeed setup; use mbs, gc, env.VAR, args.FIELD, "
                            "activation_offload, weights, torchrun.OPTION, dynamo.NAME, lora.FIELD or data.FIELD")
        elif value is None:
            parent, _, leaf = key.rpartition(".")
            node = get_dotted(setup.deepspeed, parent) if parent else setup.deepspeed
            if isinstance(node, dict):
                node.pop(leaf, None)
        else:
            set_dotted(setup.deepspeed, key, value)
    if long_parts is not None:
        try:
            parts = LongContext.from_option(long_parts)
        except ConfigError as e:
            problems.append(str(e))
        else:
            setup.long_context = parts.as_dict()
            if parts.offload_activations:
                setup.gradient_checkpointing = True  # the offload moves what checkpointing keeps
    if setup.data and "min_seq" not in setup.data:
        problems.append("data.pad_to_multiple_of pads variable-length samples: give data.min_seq too")
    if problems:
        raise ConfigError([f"--variant {spec!r}: {p}" for p in problems])
    return setup


def select(names, variants, nproc: int) -> list:
    """The setups to run: names (or groups all / nogc / gc) then the variants; every unknown name at once."""
    known = named_setups()
    parsed = []
    for spec in variants:
        setup = parse_variant(spec, {**known, **{s.name: s for s in parsed}})
        parsed.append(setup)
    if names is None:
        names = [] if variants else default_names(nproc)
    chosen, unknown = [], []
    for name in names:
        if name in GROUPS:
            gc = GROUPS[name]
            chosen += [n for n in known if (gc is None or known[n].gradient_checkpointing == gc)
                       and known[n].base not in EXTRA_BASES]
        elif name in known:
            chosen.append(name)
        else:
            unknown.append(name)
    if unknown:
        raise ConfigError(f"unknown setup(s) {', '.join(map(repr, unknown))}; choose from: {', '.join(known)} "
                          f"(or the groups {', '.join(GROUPS)}; define others with --variant NAME=BASE:key=value)")
    setups = [known[n] for n in dict.fromkeys(chosen)] + parsed
    if not setups:
        raise ConfigError("no setups to run: pass --setups NAMES and/or --variant NAME=BASE:...")
    return setups


def reduce_bucket(setup: Setup, hidden: int) -> int:
    """Reduce-bucket elements the engine will use ("auto" is hidden^2, as the Trainer fills it)."""
    value = get_dotted(setup.deepspeed or {}, "zero_optimization.reduce_bucket_size", 500_000_000)
    return hidden * hidden if value == "auto" else int(value)
