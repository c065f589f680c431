"""DeepSpeed's values for the zero_optimization keys a config leaves out (its runtime/zero/config.py and
offload_config.py, the same in every supported release), so that a config is planned with what DeepSpeed allocates
for it. Kept here rather than read from DeepSpeed, so that planning imports no DeepSpeed; a test holds them equal to
the installed release's."""

from dataclasses import dataclass

REDUCE_BUCKET_SIZE = 500_000_000  # reduce_bucket_size, elements
MAX_LIVE_PARAMETERS = 1_000_000_000  # stage3_max_live_parameters
SUB_GROUP_SIZE = 1_000_000_000  # sub_group_size: ZeRO-3 steps the optimizer one sub-group at a time


@dataclass(frozen=True)
class NvmeSwap:
    """ZeRO-Infinity's swap buffers (offload_param and offload_optimizer on NVMe); DeepSpeed's defaults."""

    param_buffers: int = 5  # offload_param.buffer_count
    param_buffer_size: int = 100_000_000  # offload_param.buffer_size, elements
    max_in_cpu: int = 1_000_000_000  # offload_param.max_in_cpu: 16-bit parameters kept in host memory
    optimizer_buffers: int = 4  # offload_optimizer.buffer_count
