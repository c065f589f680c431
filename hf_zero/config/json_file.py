"""Reading the JSON files users hand to hf_zero (DeepSpeed configs, TrainingArguments, model configs).

Every failure is a ConfigError naming the file: beyond syntax errors, NaN/Infinity (Python's json
accepts them, JSON and DeepSpeed's intent do not), integers too long for Python to convert, and
nesting deep enough to exhaust recursion.
"""

import json
from pathlib import Path

from ..errors import ConfigError

_MAX_DEPTH = 32  # a DeepSpeed config nests 3-4 levels; deeper input would only exhaust recursion later
_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


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
    """json.loads for user input, every failure a ConfigError naming ``where``."""
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


def read_json_object(path, what: str, *, missing_hint: str = "") -> dict:
    """The JSON object in file ``path``; ``what`` names the file in messages ("--args", "DeepSpeed config")."""
    path = Path(path)
    where = f"{what} {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist (no such file){missing_hint}") from None
    except IsADirectoryError:
        raise ConfigError(f"{where} is a directory, not a JSON file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text; a JSON file is") from None
    except OSError as e:
        raise ConfigError(f"cannot read {where}: {e.strerror}") from None
    value = parse_json(text, where)
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "null")
        raise ConfigError(f"{where} holds a JSON {kind}, not an object {{...}}")
    return value
