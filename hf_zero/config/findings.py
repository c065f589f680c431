"""What a config check reports (Finding), and the "auto" values the HF Trainer / Accelerate fill in."""

import copy
from dataclasses import dataclass

from .dotted import set_dotted

# Keys the HF Trainer / Accelerate fill when they are "auto", with a stand-in value used only
# to run DeepSpeed's own parser over the rest of the config.
TRAINER_AUTO_KEYS = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "train_batch_size": None,  # micro x accumulation x world size, filled below
    "gradient_clipping": 1.0,
    "optimizer.params.lr": 1e-3,
    "optimizer.params.betas": [0.9, 0.999],
    "optimizer.params.eps": 1e-8,
    "optimizer.params.weight_decay": 0.0,
    "scheduler.params.warmup_min_lr": 0.0,
    "scheduler.params.warmup_max_lr": 1e-3,
    "scheduler.params.warmup_num_steps": 0,
    "scheduler.params.total_num_steps": 1,
    "fp16.enabled": False,
    "bf16.enabled": False,
    "amp.enabled": False,
    "amp.opt_level": "O1",
    "zero_optimization.reduce_bucket_size": 500_000_000,
    "zero_optimization.stage3_prefetch_bucket_size": 500_000_000,
    "zero_optimization.stage3_param_persistence_threshold": 1_000_000,
}


# Every code a config finding carries (schema.py, rules.py, environment.py): what hf-zero check prints, and under
# hf_zero.checks the finding's own id, deepspeed-config/<code>, for skip_checks (docs/run-checks.md)
FINDING_CODES = (
    "unknown-key", "invalid-value", "invalid-config",  # DeepSpeed's own parser
    "auto-unfilled", "auto-outside-trainer", "batch-size-missing", "batch-arithmetic", "trainer-mismatch",
    "fp16-on-cpu", "fp16-and-bf16", "fp16-for-bf16-model", "stage3-key-in-stage12", "stage12-key-in-stage3",
    "nvme-path-missing", "nvme-path-unusable", "nvme-param-reuse", "offload-16bit-accumulation",
    "partial-offload-params-on-host", "zero3-no-gather", "leaf-modules-on-cpu", "deepcompile-graph-breaks",
    "sequence-parallel-size-under-trainer", "zenflow-auto", "zenflow-schedule-left-out", "zenflow-accumulation",
    "zenflow-zero3",  # hf_zero's rules
    "nccl-timeout", "cuda-arch-suffix", "no-compiler", "untested-release", "omp-threads",  # the environment
)


@dataclass
class Finding:
    """One problem in a config: a stable code, how bad it is, what is wrong, and the fix."""

    code: str
    severity: str  # "error" stops a run; "warning" is logged
    message: str
    fix: str
    key: str | None = None  # the dotted config key it is about, where there is one

    def __str__(self):
        return f"{self.message} Fix: {self.fix}"


def auto_paths(node, prefix=""):
    """The dotted keys whose value is "auto"."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from auto_paths(value, f"{prefix}{key}.")
    elif node == "auto":
        yield prefix[:-1]


def fill_auto(config: dict, *, world_size: int | None = None, dtype: str | None = None) -> dict:
    """A copy with the Trainer's "auto" keys replaced by stand-ins (unknown "auto" keys are left).

    ``dtype`` ("bf16" / "fp16") decides the mixed-precision blocks, so zero.Init creates the
    parameters in the dtype training will use. Without ``world_size`` an "auto"
    train_batch_size is dropped and DeepSpeed derives it for the world it sees.
    """
    filled = copy.deepcopy(config)
    for path in list(auto_paths(filled)):
        if path in TRAINER_AUTO_KEYS and path != "train_batch_size":
            value = TRAINER_AUTO_KEYS[path]
            if path in ("bf16.enabled", "fp16.enabled"):
                value = dtype == path.split(".")[0]
            set_dotted(filled, path, value)
    if filled.get("train_batch_size") == "auto" and world_size is None:
        del filled["train_batch_size"]
    elif filled.get("train_batch_size") == "auto":
        micro = filled.get("train_micro_batch_size_per_gpu", 1)
        accumulation = filled.get("gradient_accumulation_steps", 1)
        filled["train_batch_size"] = micro * accumulation * world_size
    return filled
