"""A DeepSpeed config is a plain dict: read and write it by dotted key ("zero_optimization.stage")."""

from ..errors import ConfigError


def get_dotted(config: dict, dotted_key: str, default=None):
    """config["a"]["b"] for "a.b", or ``default`` where a level is missing or not a dict."""
    node = config
    for key in dotted_key.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def set_dotted(config: dict, dotted_key: str, value) -> None:
    """config["a"]["b"] = value for "a.b", creating the inner dicts."""
    *parents, leaf = dotted_key.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {dotted_key!r}: {key!r} is not a JSON object in this config")
    node[leaf] = value


def zero_stage(config: dict) -> int:
    """The ZeRO stage a config asks for (0 when it has no zero_optimization block)."""
    return get_dotted(config, "zero_optimization.stage", 0)


def tensor_parallel_size(config: dict) -> int:
    """DeepSpeed AutoTP's degree (tensor_parallel.autotp_size), 1 when unset or not a positive integer."""
    tp = get_dotted(config, "tensor_parallel.autotp_size", 1)
    return tp if isinstance(tp, int) and tp > 0 else 1


def offload_devices(config: dict) -> set:
    """Where zero_optimization's offload_optimizer / offload_param blocks put states ("cpu", "nvme")."""
    blocks = (get_dotted(config, f"zero_optimization.{b}") for b in ("offload_optimizer", "offload_param"))
    devices = (block.get("device") for block in blocks if isinstance(block, dict))
    return {device for device in devices if isinstance(device, str)} & {"cpu", "nvme"}  # a malformed value is no device


def optimizer_on_host(config: dict) -> bool:
    """The optimizer step runs on the host: offload_optimizer to cpu or nvme (DeepSpeed's CPU Adam), no ZenFlow
    (ZenFlow runs its own worker processes and its own gradient path)."""
    device = get_dotted(config, "zero_optimization.offload_optimizer.device")
    return device in ("cpu", "nvme") and not get_dotted(config, "zero_optimization.zenflow")


FP32_NAMES = ("fp32", "float32", "float", "torch.float32")  # DeepSpeed's DtypeEnum spellings of fp32


def accumulates_in_fp32(config: dict) -> bool:
    """The config sets data_types.grad_accum_dtype to fp32 (in any spelling DeepSpeed accepts)."""
    return str(get_dotted(config, "data_types.grad_accum_dtype", "")).lower() in FP32_NAMES


def half_precision(config: dict, trainer_flags: dict) -> str | None:
    """The run's 16-bit training dtype, "bf16" or "fp16", or None for fp32; "auto" when a switch set to "auto"
    waits for a Trainer flag (``trainer_flags``: TrainingArguments' bf16 / fp16) that is not given."""
    for key in ("bf16", "fp16"):
        enabled = get_dotted(config, f"{key}.enabled", False)
        if enabled == "auto":
            if key not in trainer_flags:
                return "auto"
            enabled = trainer_flags[key]
        if enabled is True:
            return key
    return None


def _number(value, default):
    try:
        return float(value)
    except (TypeError, ValueError):  # absent, or "auto" and other strings DeepSpeed would reject itself
        return default


def number_at(config: dict, key: str, default):
    """The number at the dotted ``key`` (DeepSpeed's "1e9" strings included), else ``default`` (absent, or "auto")."""
    return _number(get_dotted(config, key), default)


def optimizer_host_share(config: dict) -> float:
    """offload_optimizer.ratio: the share of ZeRO-3's optimizer sub-groups that step on the host (1.0, DeepSpeed's
    default, is all of them; the others keep their fp32 states on the GPU)."""
    return min(max(_number(get_dotted(config, "zero_optimization.offload_optimizer.ratio"), 1.0), 0.0), 1.0)


def params_on_host(config: dict) -> bool:
    """ZeRO-3 keeps the 16-bit parameter partitions off the GPU (offload_param to cpu or nvme)."""
    return get_dotted(config, "zero_optimization.offload_param.device") in ("cpu", "nvme")


def sub_group_size(config: dict, default: int) -> int:
    """zero_optimization.sub_group_size in elements (``default`` when the config leaves it out)."""
    return int(_number(get_dotted(config, "zero_optimization.sub_group_size"), default))
