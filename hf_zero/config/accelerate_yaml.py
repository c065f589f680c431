"""The Accelerate YAMLs that launch the presets: each carries its preset's DeepSpeed config inline, as JSON text.

Accelerate passes ``deepspeed_config_file`` on to its HfDeepSpeedConfig, which takes a path, JSON text or base64 JSON.
A path in a YAML is read relative to the directory ``accelerate launch`` runs in, so a YAML that names its JSON works
only from one directory and never from a pip-installed hf_zero; JSON text works from anywhere. The JSON in recipes/
stays the preset: the YAMLs are written from it (``inline_deepspeed_config``) and a test proves every shipped YAML
carries exactly its JSON.
"""

import json
import os
import re
from pathlib import Path

from ..errors import ConfigError

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
