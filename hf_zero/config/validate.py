"""Validate a DeepSpeed config the way DeepSpeed itself reads it, plus hf_zero's rules, before any process starts."""

from ..errors import ConfigError
from .environment import environment_findings
from .findings import fill_auto
from .rules import CheckContext, config_findings
from .schema import schema_findings


def parser_findings(config: dict) -> list:
    """What DeepSpeed's own config parser says of ``config``, with the values the Trainer fills ("auto") filled."""
    filled = fill_auto(config)
    if not any(k in filled for k in ("train_batch_size", "train_micro_batch_size_per_gpu")):
        filled["train_micro_batch_size_per_gpu"] = 1  # a stand-in (batch-size-missing reports it), so the parser checks the rest
    elif "train_micro_batch_size_per_gpu" in filled:
        # batch-arithmetic checks it for the real world size; DeepSpeed's parser sees only its own
        filled.pop("train_batch_size", None)
    return schema_findings(filled)


def validate_config(config: dict, *, on_cpu: bool = False, world_size: int = 1, trainer_fills_auto: bool = True,
                    model_config: dict | None = None, trainer_args: dict | None = None, environment: bool = False,
                    sequence_parallel: int = 1) -> list:
    """Every finding for a DeepSpeed config; an empty list means it is sound.

    ``model_config`` (a config.json as a dict) and ``trainer_args`` (TrainingArguments as a dict)
    let the rules compare the config with the model and the Trainer; ``environment`` adds the
    checks of this process's environment (variables, compiler).
    """
    context = CheckContext(config, on_cpu=on_cpu, world_size=world_size, trainer_fills_auto=trainer_fills_auto,
                           model_config=model_config or {}, trainer_args=trainer_args or {},
                           sequence_parallel=sequence_parallel)
    findings = parser_findings(config) + config_findings(context)
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
