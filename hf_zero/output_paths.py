"""Where a command may write: never onto, around or into what it reads, and only where a file can be created.

A command that replaces its output folder deletes whatever that folder holds, so an output that is the input,
contains it or lies inside it destroys the input (``hf-zero export CKPT CKPT --overwrite`` once replaced the
checkpoint with its own export). Commands check their paths here before they read or write anything.
"""

import os
from pathlib import Path

from .errors import ConfigError

__all__ = ["refuse_overlaps", "refuse_unwritable"]


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


def _unwritable(label: str, path: Path, file_name: str) -> str | None:
    if path.is_dir():
        return f"{label} {path} is a folder. Fix: name a file in it, e.g. {path / file_name}"
    # the nearest part of the path that exists: a file there means no folder can be made under it
    existing = next((p for p in (path.parent, *path.parent.parents) if p.exists()), path.parent)
    if not existing.is_dir():
        return f"{label} {path}: {existing} is a file, not a folder. Fix: name a path whose folders exist"
    if existing != path.parent:
        return (f"{label} {path}: the folder {path.parent} does not exist. Fix: create it first "
                f"(mkdir -p {path.parent}), or name a file in an existing folder")
    if not os.access(existing, os.W_OK):
        return f"{label} {path}: this user may not write in {existing}. Fix: name a file in a folder you may write to"
    return None


def refuse_unwritable(outputs: dict) -> None:
    """Raise ConfigError (the CLI: one message, exit 2) for each output file that cannot be created: a folder in its
    place, a missing folder, a file where a folder should be, a folder this user may not write in. Checked before a
    command writes anything, so one bad path never leaves the others written. ``outputs`` maps a flag to (its path, a
    file name to suggest when the path is a folder); None paths are skipped."""
    problems = [_unwritable(label, Path(path), file_name)
                for label, (path, file_name) in outputs.items() if path is not None]
    if any(problems):
        raise ConfigError([p for p in problems if p])
