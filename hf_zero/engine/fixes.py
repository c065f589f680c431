"""Fixes for a built DeepSpeed engine: steps DeepSpeed computes correctly but at a cost it need not pay.
Shared by ZeroCallback (the Trainer) and hf_zero.prepare (a user's Accelerate loop)."""

import torch

from ..compat.deepspeed_api import (cpu_adam_class, engine_fix_applies, has_offload_overflow_tracker, is_leaf,
                                   param_coordinator, zero_optimizer_classes)


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
    if not (getattr(optimizer, "cpu_offload", False) and has_offload_overflow_tracker(optimizer)):
        return None
    if getattr(optimizer, "zenflow", False) or not getattr(optimizer, "compute_grad_norm", False):
        return None  # ZenFlow has its own step; without the norm the flag is the only overflow test
    if not engine_fix_applies("offload-overflow-test", version):
        return None
    optimizer.update_offload_overflow_tracker = _no_host_test
    return ("ZeRO offload: DeepSpeed's per-parameter inf/NaN test of each gradient (a host synchronization per "
            "parameter, each waiting for the gradient copies before it) is left out; the global gradient norm "
            "catches the same overflows.")


def leaf_release_after_compute(engine, version: str | None = None) -> str | None:
    """Under ZeRO-3 with leaf modules and a ``stage3_module_granularity_threshold`` above 0, release each leaf's
    gathered weights the way every other module's are released; returns a note when it did, None when the engine does
    not need it.

    Any threshold above 0 switches DeepSpeed's parameter coordinator to a "fast" path for leaf modules
    (``fast_sharding_for_leaf_module``): it gathers a leaf's weights on its all-gather stream, and at the leaf's release
    drops them without ``record_stream``, where every other module's release records the compute stream first. The
    caching allocator then hands that memory to the next all-gather (the next module's prefetch, on the all-gather
    stream) while the compute stream may still be reading the weights: kernels can read the next module's weights
    instead. CPU tensors have no streams, so CPU ranks never see it. The ordinary path keeps the leaf's single
    all-gather per module; only the early reuse of its memory goes (read in DeepSpeed 0.18.0 and 0.19.8; measured on
    two ranks sharing one GPU in benchmarks/1xH200/two_ranks: with the fast path the 1.35B model's losses leave
    ZeRO-3's after two steps, with this fix they stay with them)."""
    coordinator = param_coordinator(engine)
    if coordinator is None or not getattr(coordinator, "fast_sharding_for_leaf_module", False):
        return None
    module = getattr(engine, "module", engine)
    if not any(is_leaf(m) for m in module.modules()):
        return None
    if not engine_fix_applies("leaf-release-after-compute", version):
        return None
    coordinator.fast_sharding_for_leaf_module = False
    return ("ZeRO-3 leaf modules: their gathered weights are released after the GPU's use of them is recorded, as "
            "every other module's are (DeepSpeed's fast leaf path, switched on by stage3_module_granularity_threshold, "
            "lets the next all-gather overwrite them while kernels still read them).")


def _no_host_test(grad) -> None:
    """Takes the place of DeepSpeedZeroOptimizer.update_offload_overflow_tracker: the norm check covers it."""
    return None


def offload_fixes_applied(engine, step_in_forward: bool = False, step_chunk: int | None = None) -> list[str]:
    """Every fix of this module that the engine needs, applied; a note for each (to log at info level).
    ``step_in_forward``: on one GPU, finish ZeRO-1/2's offload step in the next forward, in chunks of ``step_chunk``
    elements (OFFLOAD_STEP_CHUNK by default); the caller then calls ``finish_offload_step`` where the weights must be
    final without a forward or a state_dict in between (ZeroCallback: at the end of training)."""
    notes = (offload_overflow_syncs_removed(engine), zero3_updates_copied_through_pinned_memory(engine),
             zero2_offload_step_in_next_forward(engine, chunk=step_chunk or OFFLOAD_STEP_CHUNK)
             if step_in_forward else None)
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
    if not sub_groups or not engine_fix_applies("pinned-update-copy", version):
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
    _, DeepSpeedZeroOptimizer_Stage3 = zero_optimizer_classes()  # an engine exists: DeepSpeed is loaded
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


# Elements per chunk of the offload step run in the forward: a multiple of every SIMD block DeepSpeed's Adam kernel
# rounds to (so each element takes the same code path as in one whole call); fine enough that a layer of a 1B model
# spans a dozen chunks, coarse enough that the few operations each chunk launches stay a small share of its time
OFFLOAD_STEP_CHUNK = 1 << 22
STEP_CHUNK_MULTIPLE = 4096


def step_chunk_problem(chunk) -> str | None:
    """Why ``chunk`` cannot be the offload step's chunk (None when it can, or is None for the default): a positive
    number of elements, a multiple of 4,096 (so chunk boundaries fall on the Adam kernel's SIMD blocks)."""
    if chunk is None or (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0
                         and chunk % STEP_CHUNK_MULTIPLE == 0):
        return None
    return (f"offload_step_chunk must be a positive number of elements, a multiple of {STEP_CHUNK_MULTIPLE:,}, got "
            f"{chunk!r}. Fix: offload_step_chunk={OFFLOAD_STEP_CHUNK}, or offload_step_in_forward=False to keep "
            "DeepSpeed's step.")


def zero2_offload_step_in_next_forward(engine, version: str | None = None,
                                       chunk: int = OFFLOAD_STEP_CHUNK) -> str | None:
    """On one GPU, under ZeRO-1/2 with the optimizer offloaded to pinned host memory, finish the host's part of each
    optimizer step in the next forward, chunk by chunk, each chunk just before the layer whose weights it holds;
    returns a note when it did, None when the engine does not need it.

    DeepSpeed 0.19.8 runs the whole host step inside step() after the backward (the gradient's unscale and clip,
    CPU Adam over the fp32 partition, the rounding into a pinned 16-bit buffer, its copy to the GPU), and the GPU
    waits for all of it before the next forward starts (about 0.5 s for 1.35B parameters on a 16-core host). Here
    step() computes the norm and the clip as before and leaves the update to the next forward: a pre-hook on each
    module with trained parameters steps the chunks holding them, rounds them and starts their copy to the GPU, then
    the module runs, so the host steps layer k+1 while the GPU computes layer k (offload_step.StepFinishedInForward).
    Every element goes through the same operations with the same operands as in DeepSpeed's step (the same bits: the
    clip factor is DeepSpeed's own, the Adam kernel is called on slices whose boundaries fall on its SIMD blocks, the
    learning rate is the step's own). The weights and the optimizer's state are final when that forward ends, or
    earlier when anything asks for a ``state_dict``, steps or saves; ``finish_offload_step(engine)`` finishes on
    demand. The first step, which creates Adam's state, stays DeepSpeed's. Left alone on more than one rank (step()
    gathers the updated partitions at once)."""
    optimizer = getattr(engine, "optimizer", None)
    if not _plain_zero2_offload(optimizer) or not engine_fix_applies("offload-step-in-forward", version):
        return None
    from .offload_step import step_offloaded_groups_in_chunks

    module = getattr(engine, "module", None)
    if module is None or any(count != 1 for count in optimizer.partition_count):  # ranks sharing each group
        return None
    optimizer.hf_zero_step_in_forward = step_offloaded_groups_in_chunks(optimizer, chunk, module)
    return ("ZeRO offload on one GPU: the host's optimizer step (unscale, CPU Adam, rounding to 16 bits, the copy to "
            f"the GPU) runs in the next forward, in chunks of {chunk:,} elements, each just before the layer that "
            "needs it.")


def finish_offload_step(engine) -> None:
    """Finish an optimizer step that zero2_offload_step_in_next_forward left to the next forward (nothing if none):
    the weights and the optimizer's state are then final. ``engine`` may be the DeepSpeed engine or a Trainer."""
    engine = getattr(engine, "model_wrapped", engine)
    later = getattr(getattr(engine, "optimizer", None), "hf_zero_step_in_forward", None)
    if later is not None:
        later.finish()


def _plain_zero2_offload(optimizer) -> bool:
    """DeepSpeed's own ZeRO-1/2 optimizer stepping DeepSpeedCPUAdam over fp32 partitions in pinned host memory, whose
    16-bit partitions are on an accelerator; not ZenFlow, not torch autocast's grad scaler (their steps differ)."""
    if not (getattr(optimizer, "cpu_offload", False) and getattr(optimizer, "cpu_offload_pin_memory", False)):
        return False
    if getattr(optimizer, "zenflow", False) or getattr(optimizer, "torch_autocast_gradscaler", None) is not None:
        return False
    DeepSpeedCPUAdam, (DeepSpeedZeroOptimizer, _) = cpu_adam_class(), zero_optimizer_classes()

    if not isinstance(optimizer, DeepSpeedZeroOptimizer) or type(optimizer.optimizer) is not DeepSpeedCPUAdam:
        return False
    if any(getattr(type(optimizer), name) is not getattr(DeepSpeedZeroOptimizer, name)
           for name in ("step", "_optimizer_step", "unscale_and_clip_grads")):
        return False
    groups = optimizer.optimizer.param_groups
    return len(groups) == len(optimizer.single_partition_of_fp32_groups) and all(
        group["params"] == [master] and master.dtype == torch.float32
        for group, master in zip(groups, optimizer.single_partition_of_fp32_groups)
    ) and _sixteen_bit_partitions_on_accelerator(optimizer)


def _sixteen_bit_partitions_on_accelerator(optimizer) -> bool:
    """Whether the 16-bit partitions live on an accelerator: on a CPU-only run the host step has no GPU work to hide
    behind, and DeepSpeed's step stays."""
    return all(partitions[0].device.type != "cpu" for partitions in optimizer.parallel_partitioned_bit16_groups)
