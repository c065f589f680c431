"""What a built DeepSpeed engine must be for a run to be what its config asked for: shared by ZeroCallback
(the Trainer) and hf_zero.prepare (a user's Accelerate loop)."""

import os

from .zero3.partitions import is_partitioned


def training_alone(seen: int, launched: int, who: str) -> str:
    return (f"{who} trains on a data-parallel world size of {seen}, but {launched} processes were launched: "
            "the ranks would not train together. Fix: on a CPU machine pass use_cpu=True to TrainingArguments and "
            "start the process group before them (hf_zero.init_distributed()); hf_zero.TrainingArguments does both, "
            "and hf_zero.zero_arguments(YourArgumentsClass) gives any arguments class (TRL's SFTConfig, ...) the same; "
            "in your own Accelerate loop, build the Accelerator with hf_zero.accelerator().")


def engine_problems(engine, model, stage, launched: int) -> list:
    """Why ``engine`` (what wraps the model after prepare) is not the DeepSpeed run the config describes; []."""
    from deepspeed import DeepSpeedEngine

    if not isinstance(engine, DeepSpeedEngine):
        cpu_hint = (" ACCELERATE_USE_CPU is set, which swaps DeepSpeed for plain DDP on CPU: unset it and pass "
                    "use_cpu=True (hf_zero.TrainingArguments does)." if os.environ.get("ACCELERATE_USE_CPU") else "")
        return [f"a DeepSpeed config is set, but the model is driven by {type(engine).__name__}, "
                f"not a DeepSpeedEngine.{cpu_hint}"]
    problems = []
    if engine.dp_world_size != launched:
        problems.append(training_alone(engine.dp_world_size, launched, "the DeepSpeed engine"))
    if stage == 3 and not is_partitioned(model):
        problems.append("stage 3 is configured but the parameters are not partitioned (zero.Init did not run).")
    return problems
