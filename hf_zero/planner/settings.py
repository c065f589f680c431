"""What a DeepSpeed config's keys set for the planner: its buffers, its placement of ZeRO-3's states, its NVMe swap
buffers. The presets are read the same way: their numbers come from their JSON in recipes/."""

import functools
from dataclasses import replace

from ..config.dotted import (accumulates_in_fp32, get_dotted, number_at, optimizer_host_share, params_on_host,
                             sub_group_size)
from .deepspeed_defaults import MAX_LIVE_PARAMETERS, REDUCE_BUCKET_SIZE, SUB_GROUP_SIZE, NvmeSwap
from .shapes import RunShape

# RunShape's fields that a DeepSpeed config sets (run_of_config)
CONFIG_FIELDS = ("bucket", "overlap_comm", "max_live", "fp32_accumulation", "optimizer_host_share", "params_on_host",
                 "sub_group", "config_optimizer", "nvme_swap")


def run_of_config(run: RunShape, config: dict) -> RunShape:
    """``run`` with what a DeepSpeed config's keys set (DeepSpeed's defaults where it leaves them out or says "auto"):
    the reduce bucket, overlap_comm, stage3_max_live_parameters, ZeRO-3's placement (offload_optimizer.ratio,
    offload_param, sub_group_size), the accumulation dtype of an offloaded optimizer, whether the config names an
    optimizer, and ZeRO-Infinity's swap buffers."""
    zero = lambda key, default: int(number_at(config, f"zero_optimization.{key}", default))
    overlap = get_dotted(config, "zero_optimization.overlap_comm")
    return replace(run, **zero3_placement_of(config), bucket=zero("reduce_bucket_size", REDUCE_BUCKET_SIZE),
                   max_live=zero("stage3_max_live_parameters", MAX_LIVE_PARAMETERS),
                   # DeepSpeed 0.19.8 turns overlap_comm on by default for stage 3 only, where the planner does not
                   # count it; unset on ZeRO-1/2 it is off
                   overlap_comm=bool(overlap) if isinstance(overlap, bool) else False,
                   fp32_accumulation=accumulates_in_fp32(config), config_optimizer="optimizer" in config,
                   nvme_swap=nvme_swap_of(config))


def zero3_placement_of(config: dict) -> dict:
    """RunShape's ZeRO-3 placement fields as a DeepSpeed config sets them (offload_optimizer.ratio, offload_param,
    sub_group_size)."""
    return dict(optimizer_host_share=optimizer_host_share(config), params_on_host=params_on_host(config),
                sub_group=sub_group_size(config, SUB_GROUP_SIZE))


def nvme_swap_of(config: dict) -> NvmeSwap:
    """ZeRO-Infinity's swap buffer settings as a DeepSpeed config sets them."""
    default = NvmeSwap()
    count = lambda key, value: int(number_at(config, f"zero_optimization.{key}", value))
    return NvmeSwap(param_buffers=count("offload_param.buffer_count", default.param_buffers),
                    param_buffer_size=count("offload_param.buffer_size", default.param_buffer_size),
                    max_in_cpu=count("offload_param.max_in_cpu", default.max_in_cpu),
                    optimizer_buffers=count("offload_optimizer.buffer_count", default.optimizer_buffers))


def settled(run: RunShape, preset: str | None) -> RunShape:
    """``run`` with every setting a config gives: each one it leaves None as the preset ``preset`` sets it (its JSON
    in recipes/, read as run_of_config reads any config); unchanged without a preset (the plain Trainer's)."""
    missing = [name for name in CONFIG_FIELDS if getattr(run, name) is None]
    if not missing or preset is None:
        return run
    keyed = run_of_config(run, preset_config(preset))
    return replace(run, **{name: getattr(keyed, name) for name in missing})


def preset_config(name: str) -> dict:
    """The preset's DeepSpeed config, read again when its JSON changes (not to be modified: it is shared)."""
    from ..config.presets import preset_path

    path = preset_path(name)
    stat = path.stat()
    return _read_preset(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _read_preset(path: str, mtime_ns: int, size: int) -> dict:
    from ..config.presets import load_config

    return load_config(path)


def preset_configs() -> dict:
    """What the plan compares by default: "ddp" (None: no DeepSpeed config) and every preset in recipes/ that DeepSpeed
    can use, shipped or dropped in, by name, each its DeepSpeed config."""
    from ..config.presets import load_config, preset_names, preset_problem

    return {"ddp": None, **{name: load_config(name) for name in preset_names() if not preset_problem(name)}}
