"""Run DeepSpeed's own config parser over a config, and report what it rejects or silently ignores."""

from collections.abc import KeysView

from ..compat.deepspeed_api import config_parser
from .findings import Finding


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


def schema_findings(filled: dict) -> list:
    """Run DeepSpeed's own config parser; turn what it rejects or ignores into findings.

    A block DeepSpeed rejects is dropped and the parse repeated, so one bad block does not
    hide the top-level keys DeepSpeed would ignore.
    """
    import pydantic

    DeepSpeedConfig = config_parser()

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
        if key not in seen and key not in _READ_BESIDE_THE_PARSE:
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


# Top-level keys DeepSpeedConfig reads only with a process group up (here it parses without one): DeepSpeed
# 0.19.8 runtime/config.py divides zero.Init's world size by sequence_parallel_size when no mpu is given.
_READ_BESIDE_THE_PARSE = {"sequence_parallel_size"}

_IGNORED_KEY_HINTS = {
    "gradient_checkpointing": "remove it and pass gradient checkpointing to the Trainer "
    "(TrainingArguments(activation_checkpointing=True), gradient_checkpointing=True before transformers 5.23); DeepSpeed's "
    "activation_checkpointing block only drives DeepSpeed's own checkpointing API, not HF models.",
}
