"""Checks of the process environment a DeepSpeed run starts in: variables, compiler, threads."""

import os
import re
import shutil

from ..compat.releases import failed_with, untested_releases
from .dotted import offload_devices
from .findings import Finding


def _needs_op_build(config: dict) -> bool:
    """DeepSpeed JIT-compiles an op for its optimizer block and for CPU/NVMe offload (cpu_adam, async_io)."""
    return "optimizer" in config or bool(offload_devices(config))


def environment_findings(context) -> list:
    env, found = os.environ, []
    if "NCCL_TIMEOUT" in env:
        found.append(Finding("nccl-timeout", "warning", "NCCL_TIMEOUT is set, but it is not an NCCL variable: nothing reads it.",
                             "set the timeout with TrainingArguments(ddp_timeout=seconds), "
                             "deepspeed.init_distributed(timeout=...) or DEEPSPEED_TIMEOUT (minutes)."))
    arch = env.get("TORCH_CUDA_ARCH_LIST", "")
    suffixed = [a for a in re.split(r"[;\s]+", arch) if re.fullmatch(r"\d+\.\d+[a-z]+(\+PTX)?", a)]
    if suffixed and _needs_op_build(context.config):
        found.append(Finding("cuda-arch-suffix", "error",
                             f"TORCH_CUDA_ARCH_LIST={arch!r} has {suffixed[0]!r}: DeepSpeed's op builder crashes on it "
                             "(invalid literal for int() with base 10).",
                             f"export TORCH_CUDA_ARCH_LIST={suffixed[0].rstrip('abcdefghijklmnopqrstuvwxyz+PTX')} before the run."))
    if _needs_op_build(context.config):
        missing = [tool for tool in ("ninja", env.get("CXX", "c++")) if shutil.which(tool) is None]
        if missing:
            found.append(Finding("no-compiler", "error",
                                 f"DeepSpeed compiles its optimizer/offload ops at the first step, but {', '.join(missing)} "
                                 "is not on PATH.", "install a C++ compiler and ninja (pip install ninja)."))
    for package, installed, newest in untested_releases():
        failed = failed_with(package, installed)
        known = f" hf_zero's tests failed on {package} {failed} (docs/versions.md)." if failed else ""
        found.append(Finding("untested-release", "warning",
                             f"{package} {installed} is newer than the newest release hf_zero was tested on ({newest}): "
                             "its engine fixes for DeepSpeed internals stay out, and its checks were not run against it."
                             + known,
                             f"pip install '{package}=={newest}' for the tested stack, or go on and report what differs."))
    local = int(env.get("LOCAL_WORLD_SIZE", context.world_size))
    if context.on_cpu and local > 1 and "OMP_NUM_THREADS" not in env:
        found.append(Finding("omp-threads", "warning",
                             f"{local} processes share this CPU node and OMP_NUM_THREADS is unset: they oversubscribe the cores.",
                             f"export OMP_NUM_THREADS=<cores / {local}> (torchrun sets 1)."))
    return found
