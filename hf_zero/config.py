"""Validate a DeepSpeed config the way DeepSpeed itself reads it, before any process starts."""

import copy
from collections.abc import KeysView
from dataclasses import dataclass

from .errors import ConfigError
from .presets import set_dotted

# Keys the HF Trainer / Accelerate fill when they are "auto", with a stand-in value used only
# to run DeepSpeed's own parser over the rest of the config.
_TRAINER_AUTO_KEYS = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "train_batch_size": None,  # micro x accumulation x world size, filled below
    "gradient_clipping": 1.0,
    "optimizer.params.lr": 1e-3,
    "optimizer.params.betas": [0.9, 0.999],
    "optimizer.params.eps": 1e-8,
    "optimizer.params.weight_decay": 0.0,
    "scheduler.params.warmup_min_lr": 0.0,
    "scheduler.params.warmup_max_lr": 1e-3,
    "scheduler.params.warmup_num_steps": 0,
    "scheduler.params.total_num_steps": 1,
    "fp16.enabled": False,
    "bf16.enabled": False,
    "amp.enabled": False,
    "amp.opt_level": "O1",
    "zero_optimization.reduce_bucket_size": 500_000_000,
    "zero_optimization.stage3_prefetch_bucket_size": 500_000_000,
    "zero_optimization.stage3_param_persistence_threshold": 1_000_000,
}


@dataclass
class Finding:
    """One problem in a config: a stable code, how bad it is, what is wrong, and the fix."""

    code: str
    severity: str  # "error" stops a run; "warning" is logged
    message: str
    fix: str
    key: str | None = None  # the dotted config key it is about, where there is one

    def __str__(self):
        return f"{self.message} Fix: {self.fix}"


def _auto_paths(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _auto_paths(value, f"{prefix}{key}.")
    elif node == "auto":
        yield prefix[:-1]


def fill_auto(config: dict, *, world_size: int | None = None, dtype: str | None = None) -> dict:
    """A copy with the Trainer's "auto" keys replaced by stand-ins (unknown "auto" keys are left).

    ``dtype`` ("bf16" / "fp16") decides the mixed-precision blocks, so zero.Init creates the
    parameters in the dtype training will use. Without ``world_size`` an "auto"
    train_batch_size is dropped and DeepSpeed derives it for the world it sees.
    """
    filled = copy.deepcopy(config)
    for path in list(_auto_paths(filled)):
        if path in _TRAINER_AUTO_KEYS and path != "train_batch_size":
            value = _TRAINER_AUTO_KEYS[path]
            if path in ("bf16.enabled", "fp16.enabled"):
                value = dtype == path.split(".")[0]
            set_dotted(filled, path, value)
    if filled.get("train_batch_size") == "auto" and world_size is None:
        del filled["train_batch_size"]
    elif filled.get("train_batch_size") == "auto":
        micro = filled.get("train_micro_batch_size_per_gpu", 1)
        accumulation = filled.get("gradient_accumulation_steps", 1)
        filled["train_batch_size"] = micro * accumulation * world_size
    return filled


class _RecordingKeys(KeysView):
    def __init__(self, mapping, seen):
        super().__init__(mapping)
        self._seen = seen

    def __contains__(self, key):
        self._seen.add(key)
        return super().__contains__(key)


class _RecordingDict(dict):
    """A dict that notes which keys DeepSpeed looks up: a key it never looks at, it ignores."""

    def __init__(self, data, seen):
        super().__init__(data)
        self._seen = seen

    def get(self, key, default=None):
        self._seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self._seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._seen.add(key)
        return super().__contains__(key)

    def keys(self):
        return _RecordingKeys(self, self._seen)


def _schema_findings(filled: dict) -> list:
    """Run DeepSpeed's own config parser; turn what it rejects or ignores into findings.

    A block DeepSpeed rejects is dropped and the parse repeated, so one bad block does not
    hide the top-level keys DeepSpeed would ignore.
    """
    import pydantic
    from deepspeed.runtime.config import DeepSpeedConfig

    findings = []
    remaining = dict(filled)
    for _ in range(len(filled) + 1):
        seen = set()
        try:
            DeepSpeedConfig(_RecordingDict(remaining, seen))
        except pydantic.ValidationError as e:
            bad_blocks = set()
            for err in e.errors():
                where = ".".join(str(p) for p in err["loc"])
                block = _block_of(remaining, err["loc"])
                bad_blocks.add(block.rstrip("."))
                if err["type"] == "extra_forbidden":
                    findings.append(Finding("unknown-key", "error", f"DeepSpeed does not know the key {block}{where}.",
                                            "remove it or correct its spelling (see deepspeed.ai/docs/config-json).",
                                            key=f"{block}{where}"))
                else:
                    findings.append(Finding("invalid-value", "error", f"{block}{where}: {err['msg']} (got {err.get('input')!r}).",
                                            "give it a value of the type DeepSpeed expects."))
            bad_blocks &= set(remaining)
            if not bad_blocks:
                return findings
            remaining = {k: v for k, v in remaining.items() if k not in bad_blocks}
            continue
        except Exception as e:  # DeepSpeed also asserts and raises ValueError on values it rejects
            findings.append(Finding("invalid-config", "error", f"DeepSpeed rejects this config: {e}", "correct the value it names."))
            return findings
        break
    for key in remaining:
        if key not in seen:
            hint = _IGNORED_KEY_HINTS.get(key, "remove it or correct its spelling (see deepspeed.ai/docs/config-json).")
            findings.append(Finding("unknown-key", "error", f"DeepSpeed silently ignores the top-level key {key!r}.", hint, key=key))
    return findings


def _block_of(config, loc):
    """Pydantic reports locations inside a sub-config; find which top-level block it was."""
    first = str(loc[0]) if loc else ""
    for key, value in config.items():
        if isinstance(value, dict) and first in value:
            return f"{key}."
    return ""


_IGNORED_KEY_HINTS = {
    "gradient_checkpointing": "remove it and pass gradient checkpointing to the Trainer "
    "(TrainingArguments(gradient_checkpointing=True) / --gradient_checkpointing); DeepSpeed's "
    "activation_checkpointing block only drives DeepSpeed's own checkpointing API, not HF models.",
}


def validate_config(config: dict, *, on_cpu: bool = False, world_size: int = 1, trainer_fills_auto: bool = True,
                    model_config: dict | None = None, trainer_args: dict | None = None, environment: bool = False) -> list:
    """Every finding for a DeepSpeed config; an empty list means it is sound.

    ``model_config`` (a config.json as a dict) and ``trainer_args`` (TrainingArguments as a dict)
    let the rules compare the config with the model and the Trainer; ``environment`` adds the
    checks of this process's environment (variables, compiler).
    """
    from .rules import CheckContext, config_findings
    from .environment import environment_findings

    context = CheckContext(config, on_cpu=on_cpu, world_size=world_size, trainer_fills_auto=trainer_fills_auto,
                           model_config=model_config or {}, trainer_args=trainer_args or {})
    findings = config_findings(context)
    filled = fill_auto(config)
    if not any(k in filled for k in ("train_batch_size", "train_micro_batch_size_per_gpu")):
        filled["train_micro_batch_size_per_gpu"] = 1  # a stand-in (batch-size-missing reports it), so the parser checks the rest
    elif "train_micro_batch_size_per_gpu" in filled:
        # batch-arithmetic checks it for the real world size; DeepSpeed's parser sees only its own
        filled.pop("train_batch_size", None)
    findings = _schema_findings(filled) + findings
    if environment:
        findings += environment_findings(context)
    return findings


def check_config(config: dict, *, source=None, **kwargs) -> list:
    """Raise ConfigError listing every error; return the warnings."""
    findings = validate_config(config, **kwargs)
    errors = [str(f) for f in findings if f.severity == "error"]
    if errors:
        raise ConfigError(errors, source=source)
    return [f for f in findings if f.severity != "error"]
