"""The built DeepSpeed engine, shared by both doors (ZeroCallback and hf_zero.prepare): what it must be (checks), the
fixes applied to it (fixes), the offload step run in chunks or in the next forward (offload_step), and the CPU
optimizer's threads (offload_threads)."""
