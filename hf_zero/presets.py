"""Find and read DeepSpeed configs: a preset name, a JSON file, or a dict."""

import copy
import json
from importlib import resources
from pathlib import Path

from .errors import ConfigError


def _recipes_dir() -> Path:
    try:
        return Path(str(resources.files("hf_zero.recipes")))
    except ModuleNotFoundError:
        # A source checkout on sys.path but not pip-installed: recipes/ sits beside the package
        return Path(__file__).resolve().parent.parent / "recipes"


def preset_descriptions() -> dict:
    """Preset name -> one line on what it is for, in the order they are listed."""
    try:
        from hf_zero.recipes import DESCRIPTIONS
    except ModuleNotFoundError:
        import ast

        source = (_recipes_dir() / "__init__.py").read_text()
        DESCRIPTIONS = ast.literal_eval(source.split("DESCRIPTIONS = ", 1)[1])
    return dict(DESCRIPTIONS)


def _unknown_preset(name) -> ConfigError:
    names = ", ".join(preset_descriptions())
    return ConfigError(f"unknown preset {name!r}; choose one of: {names} (or pass a path to a DeepSpeed JSON file)")


def recipe_path(name: str) -> Path:
    """Path of a shipped DeepSpeed preset, e.g. ``recipe_path("zero3")``."""
    if name.endswith(".json"):
        name = name[: -len(".json")]
    if name not in preset_descriptions():
        raise _unknown_preset(name)
    return _recipes_dir() / f"{name}.json"


def accelerate_config_path(name: str) -> Path:
    """Path of the Accelerate YAML that launches a preset (its JSON path is relative to the checkout)."""
    recipe_path(name)
    return _recipes_dir() / "accelerate" / f"{name}.yaml"


def is_preset_name(value) -> bool:
    return isinstance(value, str) and value.removesuffix(".json") in preset_descriptions() and not Path(value).exists()


def _read_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such file {str(path)!r}; pass a preset name ({', '.join(preset_descriptions())}) or an existing JSON file") from None
    except IsADirectoryError:
        raise ConfigError(f"{str(path)!r} is a directory; pass a DeepSpeed JSON file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{str(path)!r} is not UTF-8 text; a DeepSpeed config is a JSON file") from None
    except OSError as e:
        raise ConfigError(f"cannot read {str(path)!r}: {e.strerror}") from None
    config = parse_json(text, repr(str(path)))
    if not isinstance(config, dict):
        kind = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(config), "null")
        raise ConfigError(f"{str(path)!r} holds a JSON {kind}, not an object; a DeepSpeed config is a JSON object {{...}}")
    return config


_MAX_DEPTH = 32  # a DeepSpeed config nests 3-4 levels; deeper input would only exhaust recursion later


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number (JSON has no NaN or Infinity); give a finite value")


def _depth(node, limit) -> int:
    """Nesting depth of parsed JSON, iteratively (deep input must not overflow the stack here either)."""
    deepest, todo = 0, [(node, 1)]
    while todo:
        value, level = todo.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            todo.extend((v, level + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def parse_json(text: str, where: str):
    """json.loads for user files, every failure a ConfigError naming ``where``.

    Beyond syntax errors: NaN/Infinity (Python's json accepts them, JSON and DeepSpeed's intent
    do not), integers too long for Python to convert, and nesting deep enough to exhaust recursion.
    """
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(f"invalid JSON in {where} at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ConfigError(f"invalid JSON in {where}: nested too deeply") from None
    except ValueError as e:  # NaN/Infinity, or an integer beyond Python's digit limit
        raise ConfigError(f"invalid JSON in {where}: {e}") from None
    if _depth(value, _MAX_DEPTH) > _MAX_DEPTH:
        raise ConfigError(f"{where} nests more than {_MAX_DEPTH} levels deep; a DeepSpeed config has a few")
    return value


def set_dotted(config: dict, dotted_key: str, value) -> None:
    """config["a"]["b"] = value for "a.b", creating the inner dicts."""
    *parents, leaf = dotted_key.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {dotted_key!r}: {key!r} is not a JSON object in this config")
    node[leaf] = value


def get_dotted(config: dict, dotted_key: str, default=None):
    node = config
    for key in dotted_key.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def offload_devices(config: dict) -> set:
    """Where zero_optimization's offload_optimizer / offload_param blocks put states ("cpu", "nvme")."""
    blocks = (get_dotted(config, f"zero_optimization.{b}") for b in ("offload_optimizer", "offload_param"))
    return {block.get("device") for block in blocks if isinstance(block, dict)} & {"cpu", "nvme"}


def load_config(config, *, nvme_path=None, overrides=None) -> dict:
    """A DeepSpeed config as a fresh dict, from a preset name, a JSON path or a dict.

    ``nvme_path`` fills the NVMe folder of the offload blocks that have none (zero3_nvme ships
    without one: a hard-coded /local/nvme would point at a disk most machines lack).
    ``overrides`` maps dotted keys to values, e.g. {"zero_optimization.stage": 2}.
    """
    if isinstance(config, dict):
        loaded = copy.deepcopy(config)
    elif isinstance(config, (str, Path)):
        text = str(config)
        if is_preset_name(text):
            loaded = _read_json(recipe_path(text))
        elif not text.endswith(".json") and not Path(text).exists() and "/" not in text:
            raise _unknown_preset(text)
        else:
            loaded = _read_json(Path(text))
    else:
        raise TypeError(f"a DeepSpeed config is a preset name, a path or a dict, not {type(config).__name__}")
    if nvme_path is not None:
        for block in ("offload_param", "offload_optimizer"):
            offload = get_dotted(loaded, f"zero_optimization.{block}")
            if isinstance(offload, dict) and offload.get("device") == "nvme" and not offload.get("nvme_path"):
                offload["nvme_path"] = str(nvme_path)
    for key, value in (overrides or {}).items():
        set_dotted(loaded, key, value)
    return loaded
