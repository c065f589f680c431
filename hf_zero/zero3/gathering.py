"""Gathering ZeRO-3 partitions into whole tensors (collectives: every rank enters)."""

import contextlib

from .partitions import is_zero3_param


@contextlib.contextmanager
def gathered_params(params, modifier_rank=None):
    """Full parameters inside the block under ZeRO-3 (a collective: every rank enters); a no-op otherwise."""
    params = list(params)
    if not any(is_zero3_param(p) for p in params):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank):
        yield


def gathered_state_dict(model) -> dict:
    """Every parameter and buffer, full and on the CPU, cloned while gathered (collective under ZeRO-3).

    One parameter is whole at a time: the GPU never holds the whole model, and ZeRO-Infinity's NVMe swapper,
    which lends each gathered parameter one of its ``buffer_count`` buffers, is never asked for more than one."""
    state = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        with gathered_params([tensor]):
            state[name] = tensor.detach().to("cpu", copy=True)
    return state
