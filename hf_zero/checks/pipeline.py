"""The check pipeline both front doors run: ZeroCallback (the Trainer) and hf_zero.prepare (a user's Accelerate loop).

An entry is one function of a RunContext with an id, the moment it needs, a severity, a kind and a documented way to
turn it off. Its kind says what it does: a "check" returns lines, each a problem (at the entry's severity) or a Finding
with its own, and may fix what it finds (the live config the engine is built from, the model before the engine wraps
it) and say so; a "fix" changes the run where it needs it and finds nothing (at most it says what it changed); a
"guard" installs a watch that stops the run later, when it sees its problem. Every entry of a moment runs, and every error is collected, before the door
raises them together (one ConfigError listing all).
"""

import logging
from dataclasses import dataclass
from typing import Callable

from ..errors import ConfigError

logger = logging.getLogger("hf_zero")

# The moments a run passes, in order, and what each has.
MOMENTS = ("arguments", "config", "model", "engine", "save")
MOMENT_MEANING = {
    "arguments": "the Trainer's TrainingArguments with hf_zero's launch glue, before any process group exists",
    "config": "the live DeepSpeed config, before the model is touched",
    "model": "the model and the launch, before the DeepSpeed engine exists",
    "engine": "the built DeepSpeed engine, before the first step",
    "save": "a saved folder, before it replaces anything",
}
SEVERITIES = ("error", "warning", "info")
KINDS = ("check", "fix", "guard")


@dataclass(frozen=True)
class Check:
    """One entry of the list: ``run(context)`` returns its lines ([] when quiet; a fix's only say what it changed)."""

    id: str
    moment: str | tuple  # the moment it runs at, or the moments (the config linter: arguments, then config)
    severity: str  # "error" refuses the run; "warning" is said at WARNING; "info" is logged on rank 0
    run: Callable
    summary: str  # what it checks or fixes, one line for docs/run-checks.md
    off: str = ""  # the option that turns it off where one exists; every check also goes with skip_checks=[id]
    gate: bool = False  # its errors stop the moment before later checks read what it refused
    kind: str = "check"  # "check", "fix" (changes the run, finds nothing) or "guard" (a watch that stops it later)
    parts: tuple = ()  # the codes its lines carry, each skippable alone as "<id>/<code>" (the config findings)

    def __post_init__(self):
        if not set(self.moments) <= set(MOMENTS) or self.severity not in SEVERITIES or self.kind not in KINDS:
            raise ValueError(f"check {self.id}: moment {self.moment!r}, severity {self.severity!r}, kind {self.kind!r}")

    @property
    def moments(self) -> tuple:
        return self.moment if isinstance(self.moment, tuple) else (self.moment,)


@dataclass(frozen=True)
class Line:
    """A line a check says at a severity of its own (a check that refuses one case and fixes another)."""

    severity: str
    message: str

    def __str__(self):
        return self.message


def warning(message: str) -> Line:
    return Line("warning", message)


def severity_of(line, check: Check) -> str:
    return getattr(line, "severity", check.severity)


def id_of(line, check: Check) -> str:
    """The id a line answers to: its check's, or "<check id>/<code>" for a line with a code of its own (a Finding)."""
    code = getattr(line, "code", None)
    return f"{check.id}/{code}" if code in check.parts else check.id


def skip_ids(checks) -> tuple:
    """Every id skip_checks takes: each check's, and each of its parts' ("deepspeed-config/fp16-on-cpu")."""
    return tuple(c.id for c in checks) + tuple(f"{c.id}/{part}" for c in checks for part in c.parts)


def skip_problem(skip, known) -> str | None:
    """Why ``skip`` (ids given to skip_checks) cannot be used, or None."""
    if isinstance(skip, str):
        return (f"skip_checks={skip!r} is one string; it takes a list of check ids. Fix: skip_checks=[{skip!r}]")
    if not isinstance(skip, (list, tuple, set, frozenset)) or not all(isinstance(i, str) for i in skip):
        return f"skip_checks takes a list of check ids, got {skip!r}. Fix: skip_checks=['host-memory'], for example"
    unknown = sorted(set(skip) - set(known))
    if unknown:
        parts = sorted({i.partition("/")[0] for i in known if "/" in i})
        one = f"; one line of {', '.join(parts)} is <id>/<code>, its code as hf-zero check prints it" if parts else ""
        return (f"skip_checks names {unknown}, which are not check ids. Fix: use ids from hf_zero's docs, "
                f"run-checks.md: {', '.join(sorted(i for i in known if '/' not in i))}{one}.")
    return None


def run_moment(checks, moment: str, context) -> list:
    """Run every check of ``moment`` on ``context`` (skipping the ids in ``context.skip``, and the lines whose own id is
    there); say the warnings and notes
    through ``context.say``; return the error lines (the door raises them; the save moment's go to its own error)."""
    errors = []
    context.moment = moment
    for check in (c for c in checks if moment in c.moments):
        if check.id in context.skip:
            context.ran.append((moment, check.id, "skipped"))
            continue
        lines = [line for line in check.run(context) or [] if id_of(line, check) not in context.skip]
        context.ran.append((moment, check.id, ("fired" if lines else "quiet") if check.kind == "check" else "ran"))
        for line in lines:
            severity = severity_of(line, check)
            if severity == "error":
                errors.append(f"{line} [check {id_of(line, check)}]")
            else:
                context.say(str(line), severity)
        if check.gate and errors:
            break
    return errors


def raise_errors(errors: list) -> None:
    if errors:
        raise ConfigError(errors)
