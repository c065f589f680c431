"""ZeRO-3's partitioned parameters: loading a model partitioned (zero.Init), telling partitions apart, gathering them."""

from .gathering import gathered_params, gathered_state_dict
from .loading import from_pretrained, release_zero3_config, zero3_init, zero3_init_paused
from .partitions import full_numel, full_shapes, is_partitioned, is_zero3_param

__all__ = [
    "from_pretrained",
    "full_numel",
    "full_shapes",
    "gathered_params",
    "gathered_state_dict",
    "is_partitioned",
    "is_zero3_param",
    "release_zero3_config",
    "zero3_init",
    "zero3_init_paused",
]
