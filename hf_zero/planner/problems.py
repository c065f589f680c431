"""Why a run cannot start: an offload layout's states over the node's memory, an NVMe partition over its buffer."""

from .host_memory import PROCESS_HOST_BYTES
from .layouts import layout_of_config, layout_problem
from .phases import Terms
from .settings import nvme_swap_of, run_of_config
from .shapes import GIB, RunShape


def nvme_buffer_problem(config: dict, largest_param: int, ranks: int) -> str | None:
    """Why DeepSpeed's NVMe parameter swapper would refuse this model, or None: every rank's partition of a parameter
    is swapped through one of offload_param.buffer_count buffers of buffer_size elements, and
    AsyncPartitionedParameterSwapper.get_buffer (DeepSpeed 0.19.8) asserts "More elements ... than buffer size" at
    zero.Init for a partition above it (a large vocabulary's embedding, a fused expert weight)."""
    block = (config.get("zero_optimization") or {}).get("offload_param")
    if not isinstance(block, dict) or block.get("device") != "nvme":
        return None
    buffer_size = nvme_swap_of(config).param_buffer_size
    partition = -(-largest_param // max(1, ranks))  # DeepSpeed pads each parameter to a multiple of the ranks
    if partition <= buffer_size:
        return None
    return (f"zero_optimization.offload_param.buffer_size is {buffer_size:,} elements, and this model's largest "
            f"parameter ({largest_param:,} elements) is {partition:,} per rank over {ranks} rank(s): DeepSpeed's NVMe "
            "parameter swapper refuses a partition larger than its buffer when zero.Init partitions the model. "
            f"Fix: set zero_optimization.offload_param.buffer_size to at least {partition:,} (each of its "
            "buffer_count buffers is pinned host memory), or run on more ranks.")


def host_memory_problem(config: dict, params: int, trained: int, ranks: int, local_ranks: int, half: int,
                        host_bytes: int) -> str | None:
    """Why an offload preset's model states and its processes cannot fit this node's memory (the planner's figure),
    or None. The figure is DeepSpeed's host buffers without gradient accumulation's extra ones, plus each process's
    own memory (PROCESS_HOST_BYTES); it is under every peak measured on one H200 (73.2 GiB against 73.4 for the
    largest zero2_offload model), so only a run that cannot fit is refused. A layout the planner does not model
    (layouts.layout_problem) has no figure: it is not refused here."""
    layout = None if layout_problem(config) else layout_of_config(config)
    if layout is None:
        return None
    # DeepSpeed's own buffers only: ZeroCallback's pinned update buffers are left out, and allocated only when the
    # host has room for them (engine_fixes)
    terms = Terms(run_of_config(RunShape(), config), params, trained, ranks, local_ranks, half, pinned_update_copy=False)
    states = layout.states_off_gpu(terms)[0]
    if not states:
        return None
    setup = layout.name
    host = states + PROCESS_HOST_BYTES * local_ranks
    if host <= host_bytes:
        return None
    # zero3_nvme's host bytes are its swap buffers: moving the states to NVMe is no longer a way out
    if setup == "zero3_nvme":
        held, fixes = "DeepSpeed's pinned NVMe swap buffers", "more nodes"
    else:
        held = "fp32 master weights, Adam states, gradients and DeepSpeed's pinned buffers"
        fixes = "zero3_nvme (the states on NVMe), more nodes"
    return (f"{setup} keeps {states / GIB:.1f} GiB of model states in host memory on this node, "
            f"{host / GIB:.1f} GiB with its {local_ranks} process(es) (hf-zero plan's figure: {held} of "
            f"{params / 1e9:.2f}B parameters over {ranks} rank(s), {local_ranks} on this node, and "
            f"{PROCESS_HOST_BYTES / GIB:g} GiB per process), and the node has {host_bytes / GIB:.1f} GiB. "
            f"Fix: {fixes}, or a smaller model (hf-zero plan MODEL --gpus N --cpu-mem GIB).")


