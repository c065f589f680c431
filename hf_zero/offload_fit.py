"""Whether an offload run fits this node, for a model in hand: its model states in host memory and its largest
parameter in zero3_nvme's swap buffer (hf_zero.planner's figures). Both doors and ``hf-zero check --model`` ask it
(hf_zero.checks' host-memory and nvme-buffer-too-small)."""

import os

from .zero3.partitions import full_numel


def host_memory_problem_of(config: dict, model, ranks: int, half: int, host_bytes: int | None = None) -> str | None:
    """An offload preset whose model states alone exceed this node's memory (hf_zero.planner's figure), or None.
    ``ranks``: the run's world size; ``half``: bytes of the run's 16-bit (or fp32) weights."""
    import psutil

    from .planner import host_memory_problem

    params = sum(full_numel(p) for p in model.parameters())
    trained = sum(full_numel(p) for p in model.parameters() if p.requires_grad)
    ranks = max(1, ranks or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", ranks))
    return host_memory_problem(config, params, trained, ranks, local, half,
                               psutil.virtual_memory().total if host_bytes is None else host_bytes)


def nvme_buffer_problem_of(config: dict, model, ranks: int) -> str | None:
    """A parameter whose share on each of ``ranks`` is larger than zero3_nvme's swap buffer (DeepSpeed's swapper
    refuses it when it partitions the model), or None."""
    from .planner import nvme_buffer_problem

    largest = max((full_numel(p) for p in model.parameters()), default=0)
    return nvme_buffer_problem(config, largest, max(1, ranks or 1))
