"""The planner's copy of DeepSpeed's defaults (the values a config that leaves a key out gets) is the installed
DeepSpeed's own: read from its config models, so a release that changes one turns this red instead of the plans."""

from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig

from hf_zero.planner import deepspeed_defaults as planned


def test_the_planners_zero_defaults_are_deepspeeds():
    zero = DeepSpeedZeroConfig()
    assert (planned.REDUCE_BUCKET_SIZE, planned.MAX_LIVE_PARAMETERS, planned.SUB_GROUP_SIZE) == (
        zero.reduce_bucket_size, zero.max_live_parameters, zero.sub_group_size)


def test_the_planners_nvme_swap_defaults_are_deepspeeds():
    param, optimizer = DeepSpeedZeroOffloadParamConfig(), DeepSpeedZeroOffloadOptimizerConfig()
    swap = planned.NvmeSwap()
    assert (swap.param_buffers, swap.param_buffer_size, swap.max_in_cpu, swap.optimizer_buffers) == (
        param.buffer_count, param.buffer_size, param.max_in_cpu, optimizer.buffer_count)
