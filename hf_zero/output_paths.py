"""Where a command may write: never onto, around or into what it reads.

A command that replaces its output folder deletes whatever that folder holds, so an output that is the input,
contains it or lies inside it destroys the input (``hf-zero export CKPT CKPT --overwrite`` once replaced the
checkpoint with its own export). Commands check their paths here before they read or write anything.
"""

import os
from pathlib import Path

from .errors import ConfigError

__all__ = ["refuse_overlaps"]


def _relation(output: Path, source: Path) -> str | None:
    # resolve(): a symlink or a relative spelling of the same folder is the same folder
    out, src = output.resolve(), source.resolve()
    if out == src or (out.exists() and src.exists() and os.path.samefile(out, src)):
        return "is the input"
    if out in src.parents:
        return "contains the input"
    if src in out.parents:
        return "lies inside the input"
    return None


def refuse_overlaps(outputs: dict, inputs: dict) -> None:
    """Raise ConfigError (the CLI: one message, exit 2) when an output is, contains or lies inside an input, or two
    outputs are the same file. ``outputs`` and ``inputs`` map what the user calls the path (a flag, an argument
    name) to the path; None entries are skipped."""
    outputs = {label: Path(p) for label, p in outputs.items() if p is not None}
    inputs = {label: Path(p) for label, p in inputs.items() if p is not None}
    problems = []
    for out_label, out in outputs.items():
        for in_label, src in inputs.items():
            relation = _relation(out, src)
            if relation:
                problems.append(f"{out_label} {out} {relation} ({in_label} {src}): writing it would overwrite or delete "
                                f"what this command reads. Fix: write to a path outside {src}")
    labels = list(outputs)
    for i, first in enumerate(labels):
        for second in labels[i + 1:]:
            if outputs[first].resolve() == outputs[second].resolve():
                problems.append(f"{first} and {second} name the same file ({outputs[first]}): the second would "
                                "overwrite the first. Fix: give each its own path")
    if problems:
        raise ConfigError(problems)
