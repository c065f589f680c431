"""Fixes for a built DeepSpeed engine: steps DeepSpeed computes correctly but at a cost it need not pay.
Shared by ZeroCallback (the Trainer) and hf_zero.prepare (a user's Accelerate loop)."""

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
    installed = deepspeed_version(version)
    low, high = OFFLOAD_OVERFLOW_FIX_RELEASES
    if installed is None or not low <= installed < high:
        return None
    optimizer.update_offload_overflow_tracker = _no_host_test
    return ("ZeRO offload: DeepSpeed's per-parameter inf/NaN test of each gradient (a host synchronization per "
            "parameter, each waiting for the gradient copies before it) is left out; the global gradient norm "
            "catches the same overflows.")


def _no_host_test(grad) -> None:
    """Takes the place of DeepSpeedZeroOptimizer.update_offload_overflow_tracker: the norm check covers it."""
    return None
