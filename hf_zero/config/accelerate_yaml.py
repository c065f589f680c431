"""The Accelerate YAMLs that launch the presets: each carries its preset's DeepSpeed config inline, as JSON text.

Accelerate passes ``deepspeed_config_file`` on to its HfDeepSpeedConfig, which takes a path, JSON text or base64 JSON.
A path in a YAML is read relative to the directory ``accelerate launch`` runs in, so a YAML that names its JSON works
only from one directory and never from a pip-installed hf_zero; JSON text works from anywhere.

A preset is its JSON alone: its YAML is written from it on request (``accelerate_config_text``, ``hf-zero presets NAME
--accelerate-config FILE``), so the two cannot drift. Only the launch-only YAMLs in recipes/accelerate/ (another
layout of a preset: several machines, sequence parallelism) are stored; a test proves each carries exactly its JSON.
"""

import json
import os
import re
from pathlib import Path

from ..errors import ConfigError
from .dotted import zero_stage

# One machine, 2 processes (accelerate launch --num_processes N overrides it), DeepSpeed with the config inline.
# zero3_init_flag: Accelerate's from_pretrained partitions a ZeRO-3 model while loading (zero.Init).
_PRESET_LAYOUT = """\
# The {name} preset's Accelerate config, written from recipes/{name}.json by
#   hf-zero presets {name} --accelerate-config FILE
# and launched with: accelerate launch --config_file FILE train.py ...
# deepspeed_config_file holds that JSON inline (Accelerate reads JSON text there as it reads a path), so this file
# works from any directory.
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_config_file: {name}.json
  zero3_init_flag: {zero3_init}
machine_rank: 0
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
main_training_function: main
"""

# the deepspeed_config_file line with its value: a path, or a single-quoted JSON text spread over several lines
_VALUE = re.compile(r"^(?P<indent>[ \t]*)deepspeed_config_file:[ \t]*(?:'\{.*?\}'|[^\n]*)$", re.MULTILINE | re.DOTALL)


def inline_deepspeed_config(yaml_text: str, config: dict) -> str:
    """``yaml_text`` (an Accelerate YAML) with its ``deepspeed_config_file`` holding ``config`` as JSON text.

    The JSON is a YAML single-quoted scalar over several indented lines: YAML folds the line breaks into spaces, so
    Accelerate gets one line of JSON (an environment variable its launchers pass on as it is)."""
    match = _VALUE.search(yaml_text)
    if match is None:
        raise ConfigError("the Accelerate config has no deepspeed_config_file line. "
                          "Fix: start from a shipped one (hf_zero.accelerate_config_path(name)).")
    indent = match.group("indent")
    lines = json.dumps(config, indent=2).replace("'", "''").splitlines()
    value = "\n".join([lines[0]] + [f"{indent}  {line}" for line in lines[1:]])
    return yaml_text[: match.start()] + f"{indent}deepspeed_config_file: '{value}'" + yaml_text[match.end():]


def yaml_deepspeed_config(path) -> dict | str:
    """The DeepSpeed config an Accelerate YAML launches: its inline JSON as a dict, or the path it names."""
    import yaml

    value = (yaml.safe_load(Path(path).read_text()).get("deepspeed_config") or {}).get("deepspeed_config_file")
    return launched_deepspeed_config(value) if value else value


def launched_deepspeed_config(value: str) -> dict | str:
    """What Accelerate makes of a ``deepspeed_config_file`` value (ACCELERATE_DEEPSPEED_CONFIG_FILE under
    ``accelerate launch``): an existing path stays a path (messages name the file); JSON or base64 JSON text becomes
    the dict Accelerate reads from it; anything else stays as it is, for load_config to name the missing file."""
    if os.path.exists(value):  # os.path: a long JSON text is a file name too long for Path.exists
        return value
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    try:
        return HfDeepSpeedConfig(value).config
    except ValueError:
        return value


def preset_accelerate_yaml(name: str, config: dict) -> str:
    """The Accelerate YAML that launches the preset ``name`` with ``config`` (its JSON, resolved) inline."""
    zero3_init = "true" if zero_stage(config) == 3 else "false"
    return inline_deepspeed_config(_PRESET_LAYOUT.format(name=name, zero3_init=zero3_init), config)


def accelerate_config_text(name: str, *, nvme_path=None) -> str:
    """The Accelerate YAML that launches ``name`` with its DeepSpeed config inline: a preset's written from its JSON,
    a launch-only config's (``hf-zero presets`` lists them) from its stored YAML. ``nvme_path`` fills the NVMe folder,
    as ``load_config`` does. What ``hf-zero presets NAME --accelerate-config FILE`` writes."""
    from .presets import accelerate_config_path, launch_config_names, load_config, preset_path

    if name.removesuffix(".yaml") in launch_config_names():
        path = accelerate_config_path(name.removesuffix(".yaml"))
        return inline_deepspeed_config(path.read_text(), load_config(yaml_deepspeed_config(path), nvme_path=nvme_path))
    name = preset_path(name).stem  # an unknown name stops here, naming the presets
    return preset_accelerate_yaml(name, load_config(name, nvme_path=nvme_path))
