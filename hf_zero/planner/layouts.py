"""The layouts the planner models, in one table keyed by what a DeepSpeed config says: its ZeRO stage and where its
offload_optimizer and offload_param blocks put the states. A config of another combination is refused."""

from dataclasses import dataclass
from typing import Callable

from ..config.dotted import get_dotted, zero_stage
from ..errors import ConfigError
from .phases import (nothing_off_gpu, plain_phases, zero2_offload_phases, zero2_offload_states, zero3_nvme_phases,
                     zero3_nvme_states, zero3_offload_phases, zero3_offload_states, zero3_phases, zero12_phases)

NONE, CPU, NVME = "none", "cpu", "nvme"  # offload devices; "none" also where the block is absent


@dataclass(frozen=True)
class Layout:
    """Where a setup keeps the model states, and how the planner counts them."""

    name: str  # the planner's name, and the preset in recipes/ whose JSON sets what a run leaves unset
    stage: int | None  # the ZeRO stage; None: no DeepSpeed (the plain Trainer, DDP on more than one GPU)
    # 0 is the fastest: the plan takes the fastest layout that fits. Least sharding first, offload only when nothing
    # on the GPUs fits. Measured on 2x H200, 1.35B (benchmarks/2xH200): zero3 30k tokens/s, zero3_offload 7.5k (its
    # Adam step runs on the CPU, as zero2_offload's does)
    speed_rank: int
    gpu_phases: Callable  # phases.Terms -> {phase of the step: {component: bytes per GPU}}
    states_off_gpu: Callable  # phases.Terms -> (host bytes, NVMe bytes) per node of the model states
    offloads_optimizer: bool = False

    @property
    def preset(self) -> str | None:
        return None if self.stage is None else self.name


DDP = Layout("ddp", None, 0, plain_phases, nothing_off_gpu)
ZERO1 = Layout("zero1", 1, 1, zero12_phases, nothing_off_gpu)
ZERO2 = Layout("zero2", 2, 2, zero12_phases, nothing_off_gpu)
ZERO2_OFFLOAD = Layout("zero2_offload", 2, 4, zero2_offload_phases, zero2_offload_states, offloads_optimizer=True)
ZERO3 = Layout("zero3", 3, 3, zero3_phases, nothing_off_gpu)
ZERO3_OFFLOAD = Layout("zero3_offload", 3, 5, zero3_offload_phases, zero3_offload_states, offloads_optimizer=True)
ZERO3_NVME = Layout("zero3_nvme", 3, 6, zero3_nvme_phases, zero3_nvme_states, offloads_optimizer=True)

# (zero_optimization.stage, offload_optimizer.device, offload_param.device) -> the layout; None: no DeepSpeed config.
# DeepSpeed reads offload_param at stage 3 only, so below it the key's parameter device is always "none".
LAYOUTS = {
    None: DDP,
    (1, NONE, NONE): ZERO1,
    (2, NONE, NONE): ZERO2,
    (2, CPU, NONE): ZERO2_OFFLOAD,
    (3, NONE, NONE): ZERO3,
    (3, CPU, CPU): ZERO3_OFFLOAD,
    (3, CPU, NONE): ZERO3_OFFLOAD,  # the 16-bit parameters stay on the GPUs (RunShape.params_on_host False)
    (3, NVME, NVME): ZERO3_NVME,
}
_BY_NAME = {layout.name: layout for layout in LAYOUTS.values()}
SETUPS = tuple(_BY_NAME)  # the layouts' names, in the table's order
PREFERENCE = tuple(sorted(SETUPS, key=lambda name: _BY_NAME[name].speed_rank))  # the fastest first


def layout_named(setup) -> Layout:
    """The layout of this name (a Layout passes through)."""
    if isinstance(setup, Layout):
        return setup
    if setup not in _BY_NAME:
        raise ValueError(f"unknown setup {setup!r}; the planner's layouts are: {', '.join(SETUPS)}")
    return _BY_NAME[setup]


def _device(config: dict, block: str) -> str:
    device = get_dotted(config, f"zero_optimization.{block}.device")
    return device if device in (CPU, NVME) else NONE  # absent, "none", or a value DeepSpeed's parser rejects


def layout_key(config: dict | None) -> tuple | None:
    """The table's key for a DeepSpeed config (None for no config): its stage and its offload devices."""
    if config is None:
        return None
    stage = zero_stage(config)
    return stage, _device(config, "offload_optimizer"), _device(config, "offload_param") if stage == 3 else NONE


def describe(key: tuple | None) -> str:
    """A table key in words, e.g. "ZeRO-1 with offload_optimizer on cpu"."""
    if key is None:
        return "DDP (no DeepSpeed config)"
    stage, optimizer, params = key
    places = [f"offload_{block} on {device}" for block, device in (("optimizer", optimizer), ("param", params))
              if device != NONE]
    return f"ZeRO-{stage}" + (f" with {' and '.join(places)}" if places else "")


def layout_problem(config: dict | None) -> str | None:
    """Why the planner cannot plan this DeepSpeed config's layout (a combination its table does not model), or None;
    a config without a ZeRO stage has no layout to plan, and no problem here."""
    key = layout_key(config)
    if key in LAYOUTS or not key[0]:
        return None
    modeled = ", ".join(f"{describe(k)} ({layout.name})" for k, layout in LAYOUTS.items() if k is not None)
    return (f"{describe(key)} is a layout hf-zero plan does not model, so it cannot say what that config needs (it "
            f"models {modeled}). Fix: give the config one of those layouts, or plan without it.")


def layout_of_config(config: dict | None, source: str | None = None) -> Layout | None:
    """The layout of a DeepSpeed config (DDP for None), or None when the config has no ZeRO stage; a layout the table
    does not model is refused with a ConfigError (``source`` names the config in its message)."""
    problem = layout_problem(config)
    if problem:
        raise ConfigError(problem, source=source)
    key = layout_key(config)
    return LAYOUTS[key] if key is None or key[0] else None


def setup_of_config(config: dict) -> str | None:
    """The planner's name for a DeepSpeed config's layout (zero1 ... zero3_nvme); None without ZeRO."""
    layout = layout_of_config(config)
    return None if layout is None else layout.name
