"""Process-group glue, once, so scripts run the same under python, torchrun, deepspeed and accelerate.

On a CPU machine DeepSpeed needs gloo, use_cpu=True in TrainingArguments, and (without a
launcher) the RANK/WORLD_SIZE variables a launcher would set; on GPUs the same calls pick NCCL.
"""

import gc
import os
import socket
import warnings

_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def gpu_memory_bytes() -> int | None:
    """Total memory of this process's GPU; None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_single_process_env() -> None:
    """Without a launcher, DeepSpeed looks for mpi4py; give it the variables of a 1-process launch."""
    if all(v in os.environ for v in _LAUNCHER_VARS):
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(timeout_minutes: int | None = None) -> None:
    """Start the process group DeepSpeed will use (gloo on CPU, NCCL on GPU), if not started.

    Under ZeRO-3 with a launcher this must happen before TrainingArguments exists, else the
    Trainer computes the batch size for world size 1 (``8 != 4 * 1 * 1``).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    # DeepSpeed 0.19 calls these on every step; torch's rename warning would flood the logs
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")
    ensure_single_process_env()
    import deepspeed

    kwargs = {}
    if timeout_minutes is not None:
        from datetime import timedelta

        kwargs["timeout"] = timedelta(minutes=timeout_minutes)
    if has_gpu():
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        deepspeed.init_distributed(dist_backend="nccl", **kwargs)
    else:
        deepspeed.init_distributed(dist_backend="gloo", **kwargs)


def is_main_process() -> bool:
    """Rank 0, from the process group if there is one, else from the launcher's RANK."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """Wait for every rank, then tear the group down: ranks that exit while rank 0 still saves
    made ZeRO-3 runs die with 'terminate called without an active exception'."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        # Gloo work objects that still hold tensors are freed now, with the interpreter whole: freed
        # during its teardown they can still abort a finished rank the same way (rarely; seen in tests)
        gc.collect()
