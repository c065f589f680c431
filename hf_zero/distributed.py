"""Process-group glue, once, so scripts run the same under python, torchrun, deepspeed and accelerate.

On a CPU machine DeepSpeed needs gloo, use_cpu=True in TrainingArguments, and (without a
launcher) the RANK/WORLD_SIZE variables a launcher would set; on GPUs the same calls pick NCCL.
"""

import gc
import os
import socket
import warnings

# Every variable torchrun / the deepspeed launcher / accelerate launch set for a worker; a process that must not
# join the run (a clean merge, a reload) starts without them
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
# What DeepSpeed reads to join a process group without mpi4py
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def name_cpu_accelerator() -> None:
    """On a machine without CUDA, tell DeepSpeed it runs on the CPU (DS_ACCELERATOR=cpu) before it is imported,
    so it does not warn "Setting accelerator to CPU" on every command. A value the user set is kept."""
    if "DS_ACCELERATOR" not in os.environ and not has_gpu():
        os.environ["DS_ACCELERATOR"] = "cpu"


def gpu_count() -> int:
    """CUDA devices this process sees. Creates no CUDA context: a parent must not hold GPU memory its workers measure."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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
    if all(v in os.environ for v in _RANK_VARS):
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def launcher_free_env() -> dict:
    """This process's environment without the launcher's (and Accelerate's) variables, for a child that runs alone."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("ACCELERATE_")}


def accelerate_launched_deepspeed() -> bool:
    """Whether ``accelerate launch`` started this process with a DeepSpeed config (ACCELERATE_USE_DEEPSPEED)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes")


def is_distributed() -> bool:
    """Whether a torch.distributed process group is running in this process."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(timeout_minutes: int | None = None) -> None:
    """Start the process group DeepSpeed will use (gloo on CPU, NCCL on GPU), if not started.

    Under ZeRO-3 with a launcher this must happen before TrainingArguments exists, else the
    Trainer computes the batch size for world size 1 (``8 != 4 * 1 * 1``).
    """
    if is_distributed():
        return
    # DeepSpeed 0.19 calls these on every step; torch's rename warning would flood the logs
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")
    ensure_single_process_env()
    from .compat.op_builds import prepare_op_builds

    prepare_op_builds()  # on CPU the process group builds DeepSpeed's shm_comm op
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
    if is_distributed():
        import torch.distributed as dist

        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def barrier() -> None:
    if is_distributed():
        import torch.distributed as dist

        dist.barrier()


def from_rank0(value):
    """Rank 0's ``value`` on every rank, after a barrier (so no rank reads what rank 0 is still writing);
    ``value`` itself without a process group. Lets every rank raise together instead of some waiting forever."""
    if not is_distributed():
        return value
    import torch.distributed as dist

    dist.barrier()
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# How long hf_zero.shutdown() waits for the last rank: long enough for rank 0 to finish writing a large model's
# save (the other ranks arrive as soon as the gather is done), short of the 30 minutes NCCL would wait
SHUTDOWN_ARRIVAL_TIMEOUT_S = 600


def simulated_ranks() -> bool:
    """Whether the process group is torch's fake one (the benchmark harness --simulate-ranks): this process plays rank 0 and
    the other ranks do not exist, so there is no one to wait for or compare with."""
    import torch.distributed as dist

    return dist.get_backend() == "fake"


def host_group(timeout_s: float):
    """A gloo group over every rank whose collectives give up after ``timeout_s``: for hf_zero's own host-side
    exchanges and waits, which read no GPU tensor, add no GPU synchronization and work beside NCCL (which has no
    monitored barrier). Its creation is a collective of every rank."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


# what -> how many times this process waited for it: every rank counts the same waits, so their arrival keys match
_ARRIVALS = {}
# How often a waiting rank looks for the others' arrival in the store
ARRIVAL_POLL_S = 0.05


def wait_for_every_rank(what: str, timeout_s: float, fix: str) -> None:
    """A barrier that gives up after ``timeout_s`` on every rank and names the ranks that did not arrive. Each rank
    marks its arrival in the process group's store and polls for the others' marks. No collective is left pending
    when it gives up (a pending gloo collective holds the process at exit until its group's timeout), and every rank
    waits the same ``timeout_s`` (in torch's monitored barrier, ranks other than 0 wait for the group's timeout).
    Raises RanksDivergedError on every rank that gives up."""
    import time

    import torch.distributed as dist

    from .compat.hf_api import default_store
    from .errors import RanksDivergedError

    if simulated_ranks():
        return
    _ARRIVALS[what] = _ARRIVALS.get(what, 0) + 1
    keys = [f"hf_zero/arrivals/{what}/{_ARRIVALS[what]}/{rank}" for rank in range(dist.get_world_size())]
    store = default_store()
    store.set(keys[dist.get_rank()], "1")
    deadline = time.monotonic() + timeout_s
    # one line: a rank probe (zero3.rank_probe) sees this rank at one point while it waits
    while not store.check(keys) and time.monotonic() < deadline: time.sleep(ARRIVAL_POLL_S)  # noqa: E701
    missing = [str(rank) for rank, key in enumerate(keys) if not store.check([key])]
    if missing:
        raise RanksDivergedError(f"{what} waits for every rank, but not all of them arrived within {timeout_s:g} s "
                                 f"(rank {', '.join(missing)} did not). Fix: {fix}")


def shutdown(arrival_timeout_s: float = SHUTDOWN_ARRIVAL_TIMEOUT_S) -> None:
    """Wait for every rank, then tear the group down: ranks that exit while rank 0 still saves
    made ZeRO-3 runs die with 'terminate called without an active exception'. A rank that never comes (stuck in a
    collective the others left, such as a ZeRO-3 fetch inside a generate that ended earlier elsewhere) stops the
    run after ``arrival_timeout_s`` with the ranks named, instead of a silent wait."""
    if is_distributed():
        import torch.distributed as dist

        wait_for_every_rank("hf_zero.shutdown()", arrival_timeout_s,
                            "every rank must reach it; a rank still inside a collective the others skipped (under "
                            "ZeRO-3, a forward or generate that ran on some ranks only) never does.")
        dist.destroy_process_group()
        # Gloo work objects that still hold tensors are freed now, with the interpreter whole: freed
        # during its teardown they can still abort a finished rank the same way (rarely; seen in tests)
        gc.collect()
