"""Fixes for a built DeepSpeed engine: steps DeepSpeed computes correctly but at a cost it need not pay.
Shared by ZeroCallback (the Trainer) and hf_zero.prepare (a user's Accelerate loop)."""

import torch
from packaging.version import Version

from .versions import deepspeed_version

# The releases whose ZeRO-1/2 step() this fix was read against and tested on: an invalid gradient norm
# marks the step as an overflow (see offload_overflow_syncs_removed)
OFFLOAD_OVERFLOW_FIX_RELEASES = (Version("0.19.8"), Version("0.20"))


def offload_overflow_syncs_removed(engine, version: str | None = None) -> str | None:
    """Under ZeRO-1/2 with the optimizer offloaded, stop DeepSpeed testing each gradient for inf/NaN on the host;
    returns a note when it did, None when the engine does not need it.

    DeepSpeed 0.19.8's offload path (stage_1_and_2.py, ``update_offload_overflow_tracker``) reads
    ``bool(has_inf_or_nan(grad))`` for every parameter as its gradient leaves the GPU: one host-device
    synchronization per parameter, queued behind the copies to the host already on that stream, and the training
    thread launches nothing while it waits (one H200, 1.35B, 4,096 tokens per step: 4,928 tokens/s with the test,
    5,429 without; at 65,536 tokens the two were within noise). The flag it sets is redundant:
    with offload DeepSpeed always computes the global gradient norm (``compute_grad_norm``), an inf or NaN in any
    gradient makes that norm invalid, and step() then treats the step as an overflow (skips it, lowers the fp16
    loss scale) exactly as the flag would have. Only the flag's test goes; every step takes the same branch."""
    optimizer = getattr(engine, "optimizer", None)  # the engine's ZeRO optimizer
    if not (getattr(optimizer, "cpu_offload", False) and hasattr(optimizer, "update_offload_overflow_tracker")):
        return None
    if getattr(optimizer, "zenflow", False) or not getattr(optimizer, "compute_grad_norm", False):
        return None  # ZenFlow has its own step; without the norm the flag is the only overflow test
    if not _read_against(OFFLOAD_OVERFLOW_FIX_RELEASES, version):
        return None
    optimizer.update_offload_overflow_tracker = _no_host_test
    return ("ZeRO offload: DeepSpeed's per-parameter inf/NaN test of each gradient (a host synchronization per "
            "parameter, each waiting for the gradient copies before it) is left out; the global gradient norm "
            "catches the same overflows.")


def _read_against(releases: tuple, version: str | None) -> bool:
    """Whether the installed DeepSpeed (or ``version``) is one of the releases (low <= v < high) a fix was read
    against: outside them its internals may differ, and the fix stays out."""
    installed = deepspeed_version(version)
    low, high = releases
    return installed is not None and low <= installed < high


def _no_host_test(grad) -> None:
    """Takes the place of DeepSpeedZeroOptimizer.update_offload_overflow_tracker: the norm check covers it."""
    return None


# The releases whose ZeRO-3 step() (stage3.py, _reassign_or_swap_out_partitioned_parameters) this fix was read against
# and tested on
PINNED_UPDATE_COPY_RELEASES = (Version("0.19.8"), Version("0.20"))


def offload_fixes_applied(engine) -> list[str]:
    """Every fix of this module that the engine needs, applied; a note for each (to log at info level)."""
    notes = (offload_overflow_syncs_removed(engine), zero3_updates_copied_through_pinned_memory(engine))
    return [note for note in notes if note]


def zero3_updates_copied_through_pinned_memory(engine, version: str | None = None,
                                               available_bytes: int | None = None) -> str | None:
    """Under ZeRO-3 with the optimizer offloaded and the 16-bit parameters on the GPU (no ``offload_param``, or
    ``offload_optimizer.ratio`` below 1), copy each updated sub-group to the GPU through a pinned 16-bit buffer;
    returns a note when it did, None when the engine does not need it.

    DeepSpeed 0.19.8 writes the CPU Adam's fp32 result straight into the GPU's 16-bit partition
    (``fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)``): torch converts into a
    pageable temporary and copies from it synchronously, so the training thread waits on a slow copy before it starts
    the next sub-group's step (one H200, 1.35B at ratio 0.3: 137 ms of a 4,096-token step for 0.8 GiB). Its ZeRO-1/2
    path already stages through a pinned 16-bit buffer; this does the same for ZeRO-3: the rounding happens on the
    host as before (the same bits), the copy runs while the CPU steps the next sub-group, and the step waits for the
    copies once, after its last host sub-group. Left alone when ``offload_optimizer.pin_memory`` is false (no pinned
    memory asked for), and when the buffers (2 bytes a host-stepped parameter) would take more than half of the
    host memory still available (``available_bytes``, psutil's figure by default): DeepSpeed's copy needs none."""
    optimizer = getattr(engine, "optimizer", None)
    if not _plain_zero3_offload(optimizer) or not getattr(optimizer, "offload_optimizer_pin_memory", False):
        return None
    sub_groups = host_updated_sub_groups(optimizer)
    if not sub_groups or not _read_against(PINNED_UPDATE_COPY_RELEASES, version):
        return None
    halves = optimizer.fp16_partitioned_groups_flat
    staging = sum(halves[i].numel() * halves[i].element_size() for i in sub_groups)
    if available_bytes is None:
        import psutil

        available_bytes = psutil.virtual_memory().available
    if 2 * staging > available_bytes:
        return None
    copy_updates_through_pinned_memory(optimizer, sub_groups)
    return (f"ZeRO-3 offload: the {len(sub_groups)} sub-group(s) stepped on the host reach the GPU through pinned "
            f"16-bit buffers ({staging / 2**30:.2f} GiB of pinned host memory) instead of DeepSpeed's synchronous "
            "copy from pageable memory.")


def _plain_zero3_offload(optimizer) -> bool:
    """DeepSpeed's own ZeRO-3 optimizer with offload_optimizer, not ZenFlow or SuperOffload (their steps differ)."""
    if not getattr(optimizer, "offload_optimizer", False) or getattr(optimizer, "zenflow", False):
        return False
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3  # an engine exists: DeepSpeed is loaded

    method = "_reassign_or_swap_out_partitioned_parameters"
    return isinstance(optimizer, DeepSpeedZeroOptimizer_Stage3) and \
        getattr(type(optimizer), method) is getattr(DeepSpeedZeroOptimizer_Stage3, method)


def host_updated_sub_groups(optimizer) -> list[int]:
    """The sub-groups whose fp32 master is stepped in host memory while their 16-bit partition lives elsewhere (the
    GPU), in 16 bits; sub-groups swapped to NVMe are left to DeepSpeed."""
    return [i for i, (half, master) in enumerate(zip(optimizer.fp16_partitioned_groups_flat,
                                                    optimizer.fp32_partitioned_groups_flat))
            if half is not None and half.device.type != "cpu" and master.device.type == "cpu"
            and half.dtype != master.dtype and not optimizer._swappable_optimizer_subgroup(i)]


def copy_updates_through_pinned_memory(optimizer, sub_groups: list[int]) -> None:
    """Replaces the optimizer's ``_reassign_or_swap_out_partitioned_parameters`` for ``sub_groups``: round the
    updated fp32 master into a pinned 16-bit buffer kept per sub-group, copy it to the 16-bit partition without
    blocking, and synchronize after the last of them, so the parameters are in place when step() returns, as with
    DeepSpeed's copy. Other sub-groups keep DeepSpeed's own path."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    original = optimizer._reassign_or_swap_out_partitioned_parameters
    staging = {i: accelerator.pin_memory(torch.empty(optimizer.fp16_partitioned_groups_flat[i].shape,
                                                     dtype=optimizer.fp16_partitioned_groups_flat[i].dtype))
               for i in sub_groups}
    last = max(sub_groups)
    in_flight = set()

    def reassign(sub_group_id):
        buffer = staging.get(sub_group_id)
        if buffer is None:
            return original(sub_group_id)
        if sub_group_id in in_flight:  # its previous copy may still be reading the buffer (a step cut short)
            accelerator.synchronize()
            in_flight.clear()
        buffer.copy_(optimizer.fp32_partitioned_groups_flat[sub_group_id].data)
        optimizer.fp16_partitioned_groups_flat[sub_group_id].data.copy_(buffer, non_blocking=True)
        in_flight.add(sub_group_id)
        if sub_group_id == last:
            accelerator.synchronize()
            in_flight.clear()
        optimizer._unflatten_partitioned_parameters(sub_group_id)

    optimizer._reassign_or_swap_out_partitioned_parameters = reassign
