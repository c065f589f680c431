"""The options of a ZeRO run, declared once: ZeroCallback(...), hf_zero.attach(trainer, ...) and
hf_zero.prepare(accelerator, ...) take them by these names, docs/callback.md#options lists them, and they are
checked here, all at once, before anything is built."""

import difflib
import inspect
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

from ..engine.fixes import step_chunk_problem
from ..errors import ConfigError
from ..long_context import LongContext
from ..engine.offload_threads import AUTO
from ..zero3.divergence import divergence_check_problem
from ..zero3.modalities import vision_in_step_problem
from ..zero3.block_leaves import leaves_problem
from ..zero3.moe import moe_leaves_problem
from .catalog import SKIP_IDS
from .pipeline import skip_problem

# door -> the call users make, for messages
DOOR_CALLS = {"trainer": "ZeroCallback", "accelerate": "hf_zero.prepare"}


def _option(default, *, doors=tuple(DOOR_CALLS), **door_defaults):
    """A field of ZeroOptions: its default (ZeroCallback's), the doors that take it, and a door's own default where
    it differs (``accelerate=False``)."""
    return field(default=default, metadata={"doors": doors, "defaults": door_defaults})


def _boolean(name, value) -> str | None:
    return None if isinstance(value, bool) else f"{name} must be true or false, got {value!r}."


def _threads(name, value) -> str | None:
    if value is None or value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return (f"{name} must be auto or a thread count (0 or None leaves torch's threads as they are), got {value!r}. "
            f"Fix: {name}={AUTO!r} (this process's share of the node's cores) or a number.")


def _long_context(name, value) -> str | None:
    try:
        LongContext.from_option(value)
    except ConfigError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class ZeroOptions:
    """What a user chooses for a ZeRO run (docs/callback.md#options says what each does). Build it with
    ``ZeroOptions.for_door(door, given)``: it refuses unknown names and bad values and fills the door's defaults."""

    log_memory: bool = _option(True, doors=("trainer",))  # per-rank memory in the Trainer's logs
    force_gather_on_save: bool = _option(True, doors=("trainer",))  # False: refuse a ZeRO-3 config that saves shards
    cast_adapters: bool = _option(True)  # a 16-bit base's LoRA adapters train in its dtype under ZeRO-3
    long_context: bool | dict | LongContext | None = _option(None, doors=("trainer",))  # True, or a dict of parts
    overlap_offload_copies: bool = _option(True)  # hf_zero.engine.fixes' offload fixes
    offload_threads: int | str | None = _option(AUTO)  # the CPU optimizer's threads: "auto", a number, None
    offload_step_chunk: int | None = _option(None)  # elements per chunk of the host step in the next forward
    offload_step_in_forward: bool = _option(True, accelerate=False)  # a loop may read weights between step and forward
    divergence_check: str = _option("whole_run")
    vision_in_step: str = _option("keep")
    moe_leaves: str = _option("auto")
    leaves: str | Sequence[str] = _option("auto")  # ZeRO-3 leaves: the repeated blocks, "off", or class names
    skip_checks: Sequence[str] = _option(())  # check ids to leave out (docs/run-checks.md)

    @classmethod
    def names(cls, door: str) -> list:
        return [f.name for f in fields(cls) if door in f.metadata["doors"]]

    @classmethod
    def default(cls, name: str, door: str):
        """The option's default on ``door``; a door that does not take it runs as the field's default."""
        option = cls.__dataclass_fields__[name]
        return option.metadata["defaults"].get(door, option.default)

    @classmethod
    def for_door(cls, door: str, given: dict) -> "ZeroOptions":
        """The options ``given`` to ``door`` ("trainer" or "accelerate"), the door's defaults for the rest. Raises
        TypeError for a name the door does not take, ConfigError listing every bad value."""
        refuse_unknown(door, given)
        problems = option_problems(given)
        if problems:
            raise ConfigError(problems)
        chosen = {f.name: given.get(f.name, cls.default(f.name, door)) for f in fields(cls)}
        chosen["long_context"] = LongContext.from_option(chosen["long_context"])
        chosen["skip_checks"] = tuple(sorted(chosen["skip_checks"]))
        if not isinstance(chosen["leaves"], str):
            chosen["leaves"] = tuple(chosen["leaves"])  # frozen: hashable like the rest
        return cls(**chosen)

    def as_dict(self) -> dict:
        """Plain values (what ZeroCallback keeps in a checkpoint and ``ZeroCallback(**...)`` takes back)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["long_context"] = asdict(self.long_context) if self.long_context else None
        values["skip_checks"] = list(self.skip_checks)
        values["leaves"] = self.leaves if isinstance(self.leaves, str) else list(self.leaves)
        return values

    @classmethod
    def signature(cls, door: str, leading: list) -> inspect.Signature:
        """The door's call signature: ``leading`` parameters, then its options as keywords with its defaults
        (what help() and editors show for ``**options``)."""
        options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=cls.default(name, door),
                                     annotation=cls.__dataclass_fields__[name].type) for name in cls.names(door)]
        return inspect.Signature(leading + options)


# value checks, by option; an option not named here takes any value
_VALUE_PROBLEMS = {
    "log_memory": _boolean, "force_gather_on_save": _boolean, "cast_adapters": _boolean,
    "overlap_offload_copies": _boolean, "offload_step_in_forward": _boolean, "offload_threads": _threads,
    "long_context": _long_context,
    "offload_step_chunk": lambda _, value: step_chunk_problem(value),
    "divergence_check": lambda _, value: divergence_check_problem(value),
    "vision_in_step": lambda _, value: vision_in_step_problem(value),
    "moe_leaves": lambda _, value: moe_leaves_problem(value),
    "leaves": lambda _, value: leaves_problem(value),
    "skip_checks": lambda _, value: skip_problem(value, SKIP_IDS),
}


def refuse_unknown(door: str, given) -> None:
    """One TypeError naming every option ``door`` does not take, with the ones it does."""
    takes = ZeroOptions.names(door)
    wrong = [name for name in given if name not in takes]
    if not wrong:
        return
    call, other = DOOR_CALLS[door], {d: c for d, c in DOOR_CALLS.items() if d != door}
    said = []
    for name in wrong:
        elsewhere = [other[d] for d in other if name in ZeroOptions.names(d)]
        close = difflib.get_close_matches(name, takes, n=1)
        said.append(f"{name!r} (an option of {elsewhere[0]} only)" if elsewhere else
                    f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(f"{call}() got {'an unknown option' if len(wrong) == 1 else 'unknown options'} "
                    f"{', '.join(said)}. Its options: {', '.join(takes)} (hf_zero's docs, callback.md#options).")


def option_problems(given: dict) -> list:
    """Why each of the ``given`` option values cannot be used, [] when all can."""
    found = [_VALUE_PROBLEMS[name](name, value) for name, value in given.items() if name in _VALUE_PROBLEMS]
    return [problem for problem in found if problem]


def check_options(**given) -> None:
    """Raise ConfigError listing every bad value among ``given``."""
    problems = option_problems(given)
    if problems:
        raise ConfigError(problems)
