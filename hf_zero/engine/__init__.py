"""The built DeepSpeed engine, shared by both doors (ZeroCallback and hf_zero.prepare): what it must be (checks), the
fixes applied to it (fixes), the offload step run in chunks or in the next forward (offload_step), and the CPU
optimizer's threads (offload_threads)."""

# Nothing public at this level: the one public name, hf_zero.finish_offload_step, comes from engine.fixes through
# hf_zero/__init__; the doors import the modules by name
__all__ = []
