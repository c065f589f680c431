"""Presets (the DeepSpeed configs shipped in recipes/) and reading any config: a preset name, a JSON file, or a dict."""

import copy
import functools
from importlib import resources
from pathlib import Path

from ..errors import ConfigError
from .dotted import get_dotted, set_dotted
from .json_file import read_json_object


def _presets_dir() -> Path:
    # A source checkout's recipes/ sits beside the package: it wins, so that a checkout on sys.path reads its own
    # presets even where another copy of hf_zero is installed (an editable install maps hf_zero.recipes to its own)
    beside = Path(__file__).resolve().parents[2] / "recipes"
    # setup.cfg: a checkout, not site-packages (where another project may install a top-level "recipes" package)
    if (beside / "__init__.py").exists() and (beside.parent / "setup.cfg").exists():
        return beside
    return Path(str(resources.files("hf_zero.recipes")))


def _described() -> dict:
    """recipes/__init__.py's DESCRIPTIONS: the shipped presets' one-line descriptions, in the order they are listed."""
    try:
        from hf_zero.recipes import DESCRIPTIONS
    except ModuleNotFoundError:
        import ast

        source = (_presets_dir() / "__init__.py").read_text()
        DESCRIPTIONS = ast.literal_eval(source.split("DESCRIPTIONS = ", 1)[1])
    return dict(DESCRIPTIONS)


def preset_names() -> list:
    """Every DeepSpeed JSON in recipes/ is a preset: the described ones in DESCRIPTIONS' order, then the others by name."""
    found = sorted(path.stem for path in _presets_dir().glob("*.json"))
    described = [name for name in _described() if name in found]
    return described + [name for name in found if name not in described]


def describe_config(config: dict) -> str:
    """A one-line description of a DeepSpeed config from its keys (for a preset without a line in DESCRIPTIONS)."""
    from .dotted import offload_devices, zero_stage

    stage = zero_stage(config)
    if not stage:
        return "no ZeRO stage (zero_optimization.stage 0)"
    places = {block: get_dotted(config, f"zero_optimization.offload_{block}.device") for block in ("optimizer", "param")}
    offloaded = [f"{block} on {device}" for block, device in places.items() if device not in (None, "none")]
    return f"ZeRO-{stage}" + (f" ({', '.join(offloaded)})" if offload_devices(config) and offloaded else "")


def preset_problem(name: str) -> str | None:
    """Why the preset ``name`` cannot be used (its JSON unreadable, or DeepSpeed's parser rejects it), else None."""
    path = _presets_dir() / f"{name}.json"
    try:
        stat = path.stat()
    except OSError:
        return None  # not a preset: preset_path says so
    return _problem_of_file(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _problem_of_file(path: str, mtime_ns: int, size: int) -> str | None:
    # keyed by the file's time and size: a preset edited in place is parsed again
    from .validate import parser_findings

    try:
        config = read_json_object(Path(path), "DeepSpeed config")
    except ConfigError as e:
        return str(e)
    errors = [str(f) for f in parser_findings(config) if f.severity == "error"]
    return "; ".join(errors) or None


def preset_descriptions() -> dict:
    """Preset name -> one line on what it is for (from DESCRIPTIONS, else from its keys), in the order they are
    listed; a preset DeepSpeed cannot use is listed as broken, with the parser's message."""
    described, lines = _described(), {}
    for name in preset_names():
        problem = preset_problem(name)
        if problem:
            lines[name] = f"broken: {problem}"
        else:
            lines[name] = described.get(name) or describe_config(_read_json(_presets_dir() / f"{name}.json"))
    return lines


def _unknown_preset(name) -> ConfigError:
    names = ", ".join(preset_names())
    return ConfigError(f"unknown preset {name!r}; choose one of: {names} (or pass a path to a DeepSpeed JSON file)")


def preset_path(name: str) -> Path:
    """Path of a preset's DeepSpeed JSON, e.g. ``preset_path("zero3")``: any JSON in recipes/."""
    if name.endswith(".json"):
        name = name[: -len(".json")]
    if name not in preset_names():
        raise _unknown_preset(name)
    return _presets_dir() / f"{name}.json"


def _read_json(path: Path) -> dict:
    names = ", ".join(preset_names())
    return read_json_object(path, "DeepSpeed config", missing_hint=f"; pass a preset name ({names}) or an existing JSON file")


def accelerate_config_path(name: str) -> Path:
    """Path of a stored launch-only Accelerate YAML (``launch_config_names``: e.g. zero3_multinode). A preset has no
    stored YAML: ``accelerate_config_text(name)`` writes it from the preset's JSON."""
    if name not in launch_config_names():
        preset_path(name)  # an unknown name: the list of presets
        raise ConfigError(f"the preset {name!r} has no stored Accelerate YAML: it is written from its JSON. Fix: "
                          f"hf_zero.accelerate_config_text({name!r}), or hf-zero presets {name} --accelerate-config "
                          f"FILE; stored YAMLs: {', '.join(launch_config_names())}")
    return _presets_dir() / "accelerate" / f"{name}.yaml"


def launch_config_names() -> list:
    """The Accelerate YAMLs stored in recipes/accelerate/ (e.g. zero3_multinode): each launches a preset in another
    layout (several machines, sequence parallelism), by name. A YAML named like a preset is not one of them: the
    preset's YAML is always written from its JSON."""
    presets = set(preset_names())
    return sorted(p.stem for p in (_presets_dir() / "accelerate").glob("*.yaml") if p.stem not in presets)


def launch_config_description(name: str) -> str:
    """A launch-only YAML's one line: its header's first sentence (up to the first colon)."""
    first = next((line.lstrip("# ").strip() for line in accelerate_config_path(name).read_text().splitlines()
                  if line.startswith("#")), "")
    return "Accelerate config" + (f": {first.split(':')[0].rstrip('.')}" if first else "")


def preset_name_of(config: dict) -> str | None:
    """The preset whose JSON is exactly ``config`` (what its Accelerate YAML carries), or None."""
    return next((name for name in preset_names() if _read_json(preset_path(name)) == config), None)


def is_preset_name(value) -> bool:
    return isinstance(value, str) and value.removesuffix(".json") in preset_names() and not Path(value).exists()


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
            name = text.removesuffix(".json")
            problem = preset_problem(name)
            if problem:  # never half-used: a preset DeepSpeed rejects stops here, with the parser's message
                raise ConfigError(f"preset {name!r} ({preset_path(name)}) is broken: {problem}. Fix: correct or "
                                  "remove that JSON")
            loaded = _read_json(preset_path(name))
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
