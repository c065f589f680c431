"""hf_zero's exceptions: one base class, so a caller can catch everything hf_zero refuses with one clause.

    HfZeroError
    ├── ConfigError            a DeepSpeed/Trainer configuration that would fail or silently misbehave
    ├── CheckpointError        a checkpoint or saved folder that is incomplete, will not reload, or cannot be written
    │   └── UnsafeCheckpointError  a checkpoint pickle that would run code when loaded
    └── RanksDivergedError     ranks of one run that did not reach the same point (one waits, another never comes)

Each carries every problem found (``.problems``), each a line saying what is wrong and how to fix it,
so a user fixes them all in one go instead of one per run. The CLI prints the message and exits 2.
"""


class HfZeroError(Exception):
    """Something hf_zero refuses, with every problem it found."""

    def __init__(self, problems, *, source=None):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        if len(self.problems) == 1:
            message = head + self.problems[0]
        else:
            message = head + f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class ConfigError(HfZeroError, ValueError):
    """A DeepSpeed/Trainer configuration (or a command-line value) that would fail, or silently misbehave."""


class CheckpointError(HfZeroError, ValueError):
    """A checkpoint, saved model or adapter folder that is incomplete, will not reload, or cannot be written."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint whose pickles import something outside the allow-list: loading it could run code."""


class RanksDivergedError(HfZeroError, RuntimeError):
    """Ranks of one run that did not reach the same point in time: raised instead of waiting without end."""
