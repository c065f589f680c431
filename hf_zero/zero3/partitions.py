"""Telling ZeRO-3 partitions from whole parameters, and their full sizes."""


def is_zero3_param(param) -> bool:
    """Whether zero.Init (or the engine) made this parameter a ZeRO-3 partition: its local data is a shard."""
    return hasattr(param, "ds_id")


def is_partitioned(model) -> bool:
    """True when every parameter is a ZeRO-3 partition (zero.Init ran)."""
    params = list(model.parameters())
    return bool(params) and all(is_zero3_param(p) for p in params)


def full_numel(param) -> int:
    """Elements of the whole parameter (a partition's numel() is its shard's, 0 on most ranks)."""
    return getattr(param, "ds_numel", param.numel())


def full_shape(param) -> tuple:
    """Shape of the whole parameter (a ZeRO-3 partition's local shape is empty)."""
    return tuple(getattr(param, "ds_shape", param.shape))


def full_shapes(model) -> dict:
    """Parameter name -> full shape, also for ZeRO-3 partitions."""
    return {name: full_shape(p) for name, p in model.named_parameters()}
