"""Threads for DeepSpeed's CPU optimizer step.

torchrun sets OMP_NUM_THREADS=1 in every process when it starts more than one per node (so does ``accelerate
launch`` with 2+ processes, which starts them through torchrun), unless OMP_NUM_THREADS is set. DeepSpeed's CPU Adam
(zero2_offload, zero3_offload, zero3_nvme) runs one OpenMP loop over the optimizer's whole partition, in the
training thread, with the OpenMP runtime torch loaded, so it then runs on one core while the GPU waits.
"""

import os

from ..config.dotted import optimizer_on_host

AUTO = "auto"


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and numactl narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def local_processes() -> int:
    """Processes of this run on this node (the launchers' LOCAL_WORLD_SIZE; 1 without a launcher)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def threads_for_offload(config: dict, wanted=AUTO, *, cores: int | None = None, local: int | None = None) -> str | None:
    """Give the CPU optimizer step its share of the node's cores: raise torch's thread count (which DeepSpeed's CPU
    Adam runs on) to ``wanted`` (AUTO: usable cores / local processes). Returns a note when it changed it.

    Only raises, never lowers: a user who asked for more threads keeps them. None (or 0) for ``wanted`` leaves it."""
    if not wanted or not optimizer_on_host(config):
        return None
    import torch

    if wanted == AUTO:
        wanted = max(1, (cores or usable_cores()) // (local or local_processes()))
    have = torch.get_num_threads()
    if int(wanted) <= have:
        return None
    torch.set_num_threads(int(wanted))
    return (f"the optimizer is offloaded and this process had {have} CPU thread(s) (OMP_NUM_THREADS="
            f"{os.environ.get('OMP_NUM_THREADS', 'unset')}: torchrun and accelerate launch set 1 for more than one "
            f"process per node), so DeepSpeed's CPU Adam would run on {have} core(s): raised to "
            f"{int(wanted)} (this process's share of the node's cores). To choose: "
            "offload_threads=N (ZeroCallback, hf_zero.attach or hf_zero.prepare) to raise it to N instead, or None "
            "to leave it.")
