"""Presets (the DeepSpeed configs shipped in recipes/) and reading any config: a preset name, a JSON file, or a dict."""

import copy
from importlib import resources
from pathlib import Path

from ..errors import ConfigError
from .dotted import get_dotted, set_dotted
from .json_file import read_json_object


def _presets_dir() -> Path:
    # A source checkout's recipes/ sits beside the package: it wins, so that a checkout on sys.path reads its own
    # presets even where another copy of hf_zero is installed (an editable install maps hf_zero.recipes to its own)
    beside = Path(__file__).resolve().parents[2] / "recipes"
    if (beside / "__init__.py").exists():
        return beside
    return Path(str(resources.files("hf_zero.recipes")))


def preset_descriptions() -> dict:
    """Preset name -> one line on what it is for, in the order they are listed."""
    try:
        from hf_zero.recipes import DESCRIPTIONS
    except ModuleNotFoundError:
        import ast

        source = (_presets_dir() / "__init__.py").read_text()
        DESCRIPTIONS = ast.literal_eval(source.split("DESCRIPTIONS = ", 1)[1])
    return dict(DESCRIPTIONS)


def _unknown_preset(name) -> ConfigError:
    names = ", ".join(preset_descriptions())
    return ConfigError(f"unknown preset {name!r}; choose one of: {names} (or pass a path to a DeepSpeed JSON file)")


def preset_path(name: str) -> Path:
    """Path of a shipped DeepSpeed preset, e.g. ``preset_path("zero3")``."""
    if name.endswith(".json"):
        name = name[: -len(".json")]
    if name not in preset_descriptions():
        raise _unknown_preset(name)
    return _presets_dir() / f"{name}.json"


def _read_json(path: Path) -> dict:
    names = ", ".join(preset_descriptions())
    return read_json_object(path, "DeepSpeed config", missing_hint=f"; pass a preset name ({names}) or an existing JSON file")


def accelerate_config_path(name: str) -> Path:
    """Path of the Accelerate YAML that launches a preset (it carries the preset's JSON inline)."""
    preset_path(name)
    return _presets_dir() / "accelerate" / f"{name}.yaml"


def preset_name_of(config: dict) -> str | None:
    """The shipped preset whose JSON is exactly ``config`` (what a shipped Accelerate YAML carries), or None."""
    return next((name for name in preset_descriptions() if _read_json(preset_path(name)) == config), None)


def is_preset_name(value) -> bool:
    return isinstance(value, str) and value.removesuffix(".json") in preset_descriptions() and not Path(value).exists()


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
            loaded = _read_json(preset_path(text))
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
