"""What a built DeepSpeed engine must be for a run to be what its config asked for: shared by ZeroCallback
(the Trainer) and hf_zero.prepare (a user's Accelerate loop)."""

import os

from ..config.dotted import tensor_parallel_size
from ..zero3.partitions import is_partitioned


def parallel_sizes(config: dict, parallelism_config=None) -> tuple:
    """(sequence-parallel, tensor-parallel) degrees of a run: Accelerate's ParallelismConfig(sp_backend="deepspeed",
    sp_size=N) for DeepSpeed's Ulysses, the config's tensor_parallel.autotp_size for AutoTP. Data parallelism is
    what is left: world / (sp x tp)."""
    sp = 1
    if parallelism_config is not None and getattr(parallelism_config, "sp_backend", None) == "deepspeed":
        sp = getattr(parallelism_config, "sp_size", None) or 1
    return int(sp), tensor_parallel_size(config)


def layout_problems(launched: int, sp: int = 1, tp: int = 1, attention_heads: int | None = None,
                    kv_heads: int | None = None) -> list:
    """Sequence/tensor-parallel degrees the launched world (and the model) cannot be split into."""
    problems = []
    if launched % (sp * tp):
        problems.append(f"{launched} processes cannot be split into groups of sequence parallel {sp} x tensor parallel "
                        f"{tp}. Fix: launch a multiple of {sp * tp} processes, or pick sizes that divide {launched}.")
    if sp > 1 and attention_heads and attention_heads % sp:
        problems.append(f"sequence parallel size {sp} does not divide the model's {attention_heads} attention heads "
                        "(Ulysses gives each rank whole heads). Fix: an sp_size that divides the head count.")
    if sp > 1 and kv_heads and kv_heads % sp and sp % kv_heads:
        # DeepSpeed splits the key/value heads over the SP ranks, or repeats them when there are fewer than sp
        problems.append(f"sequence parallel size {sp} and the model's {kv_heads} key/value heads do not divide one "
                        "another (Ulysses splits the key/value heads over the ranks, or repeats each on sp / heads "
                        "ranks). Fix: an sp_size that divides the key/value head count or is a multiple of it.")
    return problems


def data_parallel_problems(seen: int, launched: int, sp: int = 1, tp: int = 1) -> list:
    """The engine's data-parallel size against the launched world divided by sequence and tensor parallelism."""
    expected = launched // (sp * tp)
    if seen == expected:
        return []
    if sp * tp == 1:
        return [training_alone(seen, launched, "the DeepSpeed engine")]
    return [f"the DeepSpeed engine trains on a data-parallel world size of {seen}, but {launched} processes with "
            f"sequence parallel {sp} x tensor parallel {tp} make {expected}: the ranks would not train together as "
            "configured. Fix: on a CPU machine pass use_cpu=True (hf_zero.TrainingArguments does it)."]


def sequence_parallel_engine_problems(engine, launched: int, sp: int) -> list:
    """A Ulysses engine (built with the SP groups Accelerate hands DeepSpeed as its mpu) has no data-parallel size of
    its own (dp_world_size is None in DeepSpeed 0.19.8): ZeRO shards over its sequence-data-parallel group, which
    spans every rank, and the SP degree is its sequence_parallel_size."""
    seen_sp = getattr(engine, "sequence_parallel_size", 1)
    seen_zero = getattr(engine, "seq_dp_world_size", None)
    if seen_sp == sp and seen_zero == launched:
        return []
    return [f"the DeepSpeed engine runs sequence parallel {seen_sp} over a ZeRO group of {seen_zero} ranks, but "
            f"{launched} processes with sp_size {sp} should make sequence parallel {sp} over all {launched}: the ranks "
            "would not train together as configured. Fix: on a CPU machine pass use_cpu=True (hf_zero.TrainingArguments "
            "does it), and pass the ParallelismConfig to TrainingArguments(parallelism_config=...)."]


def training_alone(seen: int, launched: int, who: str) -> str:
    return (f"{who} trains on a data-parallel world size of {seen}, but {launched} processes were launched: "
            "the ranks would not train together. Fix: on a CPU machine pass use_cpu=True to TrainingArguments and "
            "start the process group before them (hf_zero.init_distributed()); hf_zero.TrainingArguments does both, "
            "and hf_zero.zero_arguments(YourArgumentsClass) gives any arguments class (TRL's SFTConfig, ...) the same; "
            "in your own Accelerate loop, build the Accelerator with hf_zero.accelerator().")


def engine_problems(engine, model, stage, launched: int, *, sp: int = 1, tp: int = 1) -> list:
    """Why ``engine`` (what wraps the model after prepare) is not the DeepSpeed run the config describes; []."""
    from deepspeed import DeepSpeedEngine

    if not isinstance(engine, DeepSpeedEngine):
        cpu_hint = (" ACCELERATE_USE_CPU is set, which swaps DeepSpeed for plain DDP on CPU: unset it and pass "
                    "use_cpu=True (hf_zero.TrainingArguments does)." if os.environ.get("ACCELERATE_USE_CPU") else "")
        return [f"a DeepSpeed config is set, but the model is driven by {type(engine).__name__}, "
                f"not a DeepSpeedEngine.{cpu_hint}"]
    if sp > 1:
        problems = sequence_parallel_engine_problems(engine, launched, sp)
    else:
        problems = data_parallel_problems(engine.dp_world_size, launched, sp, tp)
    if stage == 3 and not is_partitioned(model):
        problems.append("stage 3 is configured but the parameters are not partitioned (zero.Init did not run).")
    return problems
