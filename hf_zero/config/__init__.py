"""Reading and checking DeepSpeed configs: presets, dotted keys, DeepSpeed's own parser, hf_zero's rules,
the environment, and the one module (live) that changes a run's config."""

from .accelerate_yaml import accelerate_config_text
from .dotted import get_dotted, offload_devices, set_dotted, zero_stage
from .findings import TRAINER_AUTO_KEYS, Finding, fill_auto
from .json_file import parse_json, read_json_object
from .live import deepspeed_config_of
from .presets import accelerate_config_path, is_preset_name, load_config, preset_descriptions, preset_names, preset_path
from .rules import fix_config
from .validate import check_config, validate_config

__all__ = [
    "accelerate_config_path",
    "accelerate_config_text",
    "check_config",
    "deepspeed_config_of",
    "fill_auto",
    "Finding",
    "fix_config",
    "get_dotted",
    "is_preset_name",
    "load_config",
    "offload_devices",
    "parse_json",
    "preset_descriptions",
    "preset_names",
    "preset_path",
    "read_json_object",
    "set_dotted",
    "TRAINER_AUTO_KEYS",
    "validate_config",
    "zero_stage",
]
