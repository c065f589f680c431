"""hf_zero's own rules for a DeepSpeed config: what DeepSpeed's parser accepts but a run gets wrong.

Each rule takes a CheckContext and returns Findings; ``fix_config`` applies the fixes that are
safe to make without asking (``hf-zero check --fix``).
"""

import copy
import os
from dataclasses import dataclass, field

from ..compat.deepspeed_api import ZENFLOW_ZERO3_CHECKED, zenflow_zero3_unchecked
from ..compat.releases import deepspeed_version
from .dotted import (accumulates_in_fp32, get_dotted, half_precision, optimizer_host_share, optimizer_on_host,
                     params_on_host, tensor_parallel_size)
from .findings import TRAINER_AUTO_KEYS, Finding, auto_paths
from .live import LEAF_THRESHOLD, drop_gpu_only_settings, gather_weights_on_save, leaf_threshold

DEEPSPEED_REUSE_DEFAULT = 1_000_000_000  # stage3_max_reuse_distance when a config leaves it out (DeepSpeed 0.19.8)
# zero_optimization keys that only one side of the stage-3 divide reads
_STAGE3_ONLY = ("offload_param", "sub_group_size", "zero_hpz_partition_size", "zero_quantized_weights",
                "zero_quantized_nontrainable_weights", "mics_shard_size")
# (not reduce_scatter: stage 3 reads it too; false all-reduces each contiguous bucket in place, DeepSpeed 0.19.8
# stage3.py __reduce_and_partition_ipg_grads)
_STAGE12_ONLY = ("allgather_partitions", "allgather_bucket_size", "round_robin_gradients")


@dataclass
class CheckContext:
    config: dict
    on_cpu: bool = False
    world_size: int = 1
    trainer_fills_auto: bool = True
    model_config: dict = field(default_factory=dict)
    trainer_args: dict = field(default_factory=dict)
    sequence_parallel: int = 1
    deepspeed_version: str | None = None  # None: the installed one (tests pass others)

    @property
    def data_parallel_size(self) -> int:
        """The ranks that split the batch: the world divided by sequence and tensor parallelism (DeepSpeed's own
        batch assertion counts these). Under the Trainer, sequence parallelism does not divide it: the Trainer fills
        and matches train_batch_size over the whole world, zero.Init checks it so, and Accelerate re-derives the
        engine's value over world / sp_size when it builds the engine (an int over world / sp_size fails at
        zero.Init: "Check batch related parameters", measured with transformers 5.24 and DeepSpeed 0.19.8)."""
        sp = 1 if self.trainer_fills_auto else self.sequence_parallel
        return max(1, self.world_size // (sp * tensor_parallel_size(self.config)))

    @property
    def zero(self) -> dict:
        zero = self.config.get("zero_optimization")
        return zero if isinstance(zero, dict) else {}


def _auto(context):
    autos = list(auto_paths(context.config))
    found = [Finding("auto-unfilled", "error", f'"{p}": "auto" is not a key the Trainer fills.', "give it a value.")
             for p in autos if p not in TRAINER_AUTO_KEYS and not p.startswith(_ZENFLOW + ".")]
    if autos and not context.trainer_fills_auto:
        shown = ", ".join(autos[:4]) + ("..." if len(autos) > 4 else "")
        found.append(Finding("auto-outside-trainer", "error",
                             f'"auto" values ({shown}) only work under the HF Trainer/Accelerate; raw DeepSpeed drops them.',
                             'use the config through TrainingArguments(deepspeed=...), or replace "auto" with values.'))
    return found


def _batch(context):
    config = context.config
    if not any(k in config for k in ("train_batch_size", "train_micro_batch_size_per_gpu")):
        return [Finding("batch-size-missing", "error", "the config sets no batch size; DeepSpeed refuses to start.",
                        'add "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto" '
                        'and "train_batch_size": "auto" so the Trainer\'s batch size is used.')]
    found = []
    train, micro, accumulation = (config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                            "gradient_accumulation_steps"))
    data_parallel = context.data_parallel_size
    if all(isinstance(v, int) for v in (train, micro, accumulation)) and train != micro * accumulation * data_parallel:
        found.append(Finding("batch-arithmetic", "error",
                             f"train_batch_size {train} != micro batch {micro} x gradient accumulation {accumulation} "
                             f"x data-parallel size {data_parallel}"
                             + (f" (world {context.world_size} / sequence and tensor parallelism)." if data_parallel != context.world_size else "."),
                             'set the three batch keys to "auto" under the Trainer, or make them multiply out.'))
    args = context.trainer_args
    for key, arg in (("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
                     ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        if isinstance(config.get(key), int) and arg in args and args[arg] != config[key]:
            found.append(Finding("trainer-mismatch", "error", f"{key} is {config[key]} but the Trainer's {arg} is {args[arg]}; "
                                 "the Trainer refuses to start.", f'set {key} to "auto".'))
    return found


def _precision(context):
    found = []
    fp16, bf16 = get_dotted(context.config, "fp16.enabled"), get_dotted(context.config, "bf16.enabled")
    fp16_on = fp16 is True or (fp16 == "auto" and context.trainer_args.get("fp16"))
    if context.on_cpu and fp16_on:
        found.append(Finding("fp16-on-cpu", "error", "fp16 is enabled, but DeepSpeed's CPU accelerator does not support fp16.",
                             'set "fp16": {"enabled": "auto"} (or false) and train in bf16 (--bf16) or fp32.'))
    if fp16 is True and bf16 is True:
        found.append(Finding("fp16-and-bf16", "error", "fp16 and bf16 are both enabled.", "enable one of them."))
    model_dtype = context.model_config.get("dtype") or context.model_config.get("torch_dtype")
    if fp16_on and model_dtype == "bfloat16":
        found.append(Finding("fp16-for-bf16-model", "warning",
                             "fp16 training of a model saved in bfloat16: its weights and activations can overflow fp16's range.",
                             "train in bf16 (--bf16) on hardware that has it."))
    return found


def _stage_keys(context):
    zero, stage = context.zero, context.zero.get("stage", 0)
    found = []
    if stage in (0, 1, 2):
        misplaced = [k for k in zero if k.startswith("stage3_") or k in _STAGE3_ONLY]
        if misplaced:
            found.append(Finding("stage3-key-in-stage12", "warning",
                                 f"stage {stage} ignores the stage-3 keys {', '.join(misplaced)}.",
                                 "remove them, or set stage 3 if that was meant."))
    elif stage == 3:
        misplaced = [k for k in zero if k in _STAGE12_ONLY]
        if misplaced:
            found.append(Finding("stage12-key-in-stage3", "warning",
                                 f"stage 3 ignores {', '.join(misplaced)} (stage 1/2 settings).",
                                 "remove them; stage 3 uses reduce_bucket_size and stage3_prefetch_bucket_size."))
    return found


def _offload(context):
    found = []
    for block in ("offload_param", "offload_optimizer"):
        offload = context.zero.get(block)
        if not isinstance(offload, dict) or offload.get("device") != "nvme":
            continue
        path = offload.get("nvme_path")
        if not path:
            found.append(Finding("nvme-path-missing", "error", f"zero_optimization.{block} offloads to NVMe but has no nvme_path.",
                                 "pass nvme_path=... (hf_zero.TrainingArguments / load_config) or "
                                 "`hf-zero presets zero3_nvme --nvme-path DIR --out ds.json`."))
        elif not isinstance(path, str) or not (os.path.isdir(path) and os.access(path, os.W_OK)):  # an int would be a file descriptor
            found.append(Finding("nvme-path-unusable", "error",
                                 f"zero_optimization.{block}.nvme_path {path!r} is not a writable folder.",
                                 "create it on a fast local disk, or point nvme_path at one."))
    param = context.zero.get("offload_param")
    reuse = context.zero.get("stage3_max_reuse_distance", DEEPSPEED_REUSE_DEFAULT)
    if isinstance(param, dict) and param.get("device") == "nvme" and context.zero.get("stage") == 3 and reuse != 0:
        # open on DeepSpeed's tracker under that message; reproduced on CPU by tests/multiproc/test_nvme_swap.py
        shown = f"{reuse:,}" if isinstance(reuse, (int, float)) else repr(reuse)
        found.append(Finding("nvme-param-reuse", "warning",
                             f"offload_param goes to NVMe with stage3_max_reuse_distance {shown}: each parameter "
                             "kept for reuse holds one of offload_param.buffer_count swap buffers, and once they are "
                             "all held DeepSpeed stops with \"Not enough buffers 0 for swapping 1\" (any model over "
                             "offload_param.max_in_cpu elements whose layers hold more parameters than buffers).",
                             "set zero_optimization.stage3_max_reuse_distance to 0, as the zero3_nvme preset does."))
    return found


def _offload_accumulation(context):
    """ZeRO-2 offload accumulating 16-bit gradients on the host (DeepSpeed's default)."""
    if context.zero.get("stage") != 2 or not optimizer_on_host(context.config) or accumulates_in_fp32(context.config):
        return []
    accumulation = context.config.get("gradient_accumulation_steps")
    if accumulation == "auto":
        accumulation = context.trainer_args.get("gradient_accumulation_steps")
    if not isinstance(accumulation, int) or accumulation <= 1 \
            or half_precision(context.config, context.trainer_args) not in ("bf16", "fp16"):
        return []
    return [Finding("offload-16bit-accumulation", "warning",
                    f"ZeRO-2 offloads the optimizer and accumulates {accumulation} micro-batches in 16 bits: DeepSpeed "
                    "copies each micro-batch's 16-bit gradients to the host, brings the running sum back to the GPU "
                    "for the next one and keeps it in 16 bits, which is slower than accumulating in fp32 on the GPU "
                    "(measured: hf_zero's docs, offload.md).",
                    'set "data_types": {"grad_accum_dtype": "fp32"}, as the zero2_offload preset does: the sum '
                    "stays on the GPU in fp32 (4 bytes per parameter / data-parallel ranks of GPU memory) and goes "
                    "to the host once per optimizer step.", key="data_types.grad_accum_dtype")]


def _partial_offload(context):
    """ZeRO-3 with part of the optimizer on the GPU (offload_optimizer.ratio below 1) and the parameters on the host."""
    ratio = optimizer_host_share(context.config)
    if context.zero.get("stage") != 3 or not optimizer_on_host(context.config) or ratio >= 1 \
            or not params_on_host(context.config):
        return []
    return [Finding("partial-offload-params-on-host", "warning",
                    f"offload_optimizer.ratio {ratio:g} keeps part of the optimizer on the GPU while offload_param keeps "
                    "the parameters on the host, which runs slower than offloading the whole optimizer (measured: "
                    "hf_zero's docs, offload.md).",
                    "remove zero_optimization.offload_param so the 16-bit parameters stay on the GPU (2 bytes per "
                    "parameter / data-parallel ranks; faster than the zero3_offload preset), or set the ratio to 1.",
                    key="zero_optimization.offload_param")]


def _saves(context):
    if context.zero.get("stage") == 3 and not context.zero.get("stage3_gather_16bit_weights_on_model_save", False):
        return [Finding("zero3-no-gather", "warning",
                        "stage 3 with stage3_gather_16bit_weights_on_model_save off: save_model writes only ZeRO shards, "
                        "which from_pretrained cannot load.",
                        'set "stage3_gather_16bit_weights_on_model_save": true (ZeroCallback turns it on for you).')]
    return []


def _leaf_modules(context):
    if context.on_cpu and context.zero.get("stage") == 3 and leaf_threshold(context.config) is not None:
        return [Finding("leaf-modules-on-cpu", "warning",
                        f"zero_optimization.{LEAF_THRESHOLD} > 0 on CPU: DeepSpeed's leaf-module path calls "
                        "record_stream, which CPU tensors lack (RuntimeError: unknown parameter type at the first "
                        "optimizer step).",
                        f"nothing under hf_zero.TrainingArguments or ZeroCallback, which set it to 0 on CPU; a plain "
                        f"Trainer run needs {LEAF_THRESHOLD} set to 0 (hf-zero check --fix does it).",
                        key=f"zero_optimization.{LEAF_THRESHOLD}")]
    return []


def _deepcompile(context):
    if context.zero.get("stage") == 3 and get_dotted(context.config, "compile.deepcompile") is True:
        return [Finding("deepcompile-graph-breaks", "warning",
                        "compile.deepcompile with ZeRO-3 turns ZeRO-3's gather hooks off and gathers parameters only "
                        "inside compiled graphs: a layer that runs eagerly after a graph break sees its empty shard. "
                        "On 2x H200 with transformers 5.17 and DeepSpeed 0.19.8, a Llama model failed at the first "
                        "forward with RuntimeError: 'weight' must be 2-D (its embedding ran after a graph break; "
                        "DeepSpeed issue #7942).",
                        "remove compile.deepcompile (the zero3 preset is tuned without it), or first run one step "
                        "with TORCH_LOGS=graph_breaks and make sure the model's forward has no graph break.",
                        key="compile.deepcompile")]
    return []


def _sequence_parallel_size_key(context):
    sp = context.config.get("sequence_parallel_size")
    if not (context.trainer_fills_auto and context.zero.get("stage") == 3 and isinstance(sp, int) and sp > 1):
        return []
    return [Finding("sequence-parallel-size-under-trainer", "error",
                    f'"sequence_parallel_size": {sp} makes zero.Init count the batch over world / {sp} ranks, but the '
                    "Trainer fills and matches train_batch_size over the whole world: loading the model under ZeRO-3 "
                    "fails with AssertionError: Check batch related parameters.",
                    'remove the key; under the Trainer the sequence-parallel size comes from '
                    'TrainingArguments(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=N)) '
                    "or the Accelerate config's parallelism_config block.", key="sequence_parallel_size")]


_ZENFLOW = "zero_optimization.zenflow"
_ZENFLOW_SCHEDULE = ("select_strategy", "select_interval", "update_interval")


def _zenflow(context):
    """ZenFlow (DeepSpeed 0.19.8, runtime/zenflow/engine.py configure_zenflow) under the Trainer: its "auto"
    schedule needs the engine's own dataloader (the Trainer keeps it, so "auto" selection never reselects) and
    the Trainer's fill stops on the "auto" strings; and ZenFlow replaces the engine's gradient accumulation
    with its update_interval, so the optimizer steps on a cadence the Trainer does not count."""
    block = get_dotted(context.config, _ZENFLOW)
    if not isinstance(block, dict):
        return []
    args_accumulation = context.trainer_args.get("gradient_accumulation_steps")
    config_accumulation = context.config.get("gradient_accumulation_steps")
    accumulation = args_accumulation if isinstance(args_accumulation, int) else (
        config_accumulation if isinstance(config_accumulation, int) else None)
    interval = accumulation or "N (the run's gradient_accumulation_steps)"
    explicit = (f'"select_strategy": "step", "select_interval": {interval}, "update_interval": {interval}')
    found = []
    written = [key for key in _ZENFLOW_SCHEDULE if block.get(key) == "auto"]
    left_out = [key for key in _ZENFLOW_SCHEDULE if key not in block]
    if written and context.trainer_fills_auto:
        found.append(Finding("zenflow-auto", "error",
                             f"zenflow.{', zenflow.'.join(written)} {'is' if len(written) == 1 else 'are'} \"auto\": "
                             "the Trainer's fill of the config stops on it (\"not found in kwargs\").",
                             f"write the schedule out in zero_optimization.zenflow: {explicit}."))
    if left_out:
        found.append(Finding("zenflow-schedule-left-out", "warning",
                             f"zenflow.{', zenflow.'.join(left_out)} left out: DeepSpeed then selects epoch-wise "
                             "from the engine's own dataloader (under the Trainer it has none, so the important "
                             "columns are never reselected) and adapts the update interval, which replaces the "
                             "run's gradient accumulation.",
                             f"write the schedule out in zero_optimization.zenflow: {explicit}."))
    update = block.get("update_interval")
    if isinstance(update, int) and accumulation is not None and update != accumulation:
        found.append(Finding("zenflow-accumulation", "warning",
                             f"zenflow.update_interval is {update} and the run accumulates {accumulation} "
                             "micro-batches: ZenFlow sets the engine's gradient accumulation to its update_interval, "
                             "so the optimizer steps every "
                             f"{update} micro-batches while the Trainer counts (and schedules the learning rate) "
                             f"every {accumulation}.",
                             f"set zenflow.update_interval to {accumulation}, or gradient_accumulation_steps to "
                             f"{update}."))
    if context.zero.get("stage") == 3:
        found.append(_zenflow_zero3(context.deepspeed_version))
    return found


def _zenflow_zero3(version: str | None) -> Finding:
    """ZenFlow's stage-3 optimizer transposes every matrix in place when the engine starts and its fetch hooks
    transpose each gathered one back. A model built under zero.Init (what the Trainer does for any ZeRO-3 config)
    is partitioned already, so the first transposition never happens and the forward reads a transposed
    embedding; a model the engine partitions itself trains, but save_16bit_model writes every matrix transposed."""
    problem = ("ZenFlow under ZeRO-3 does not train correctly: under the Trainer (zero.Init) the first forward "
               "reads a transposed embedding (IndexError on CPU, a CUDA device-side assert on GPUs), and without "
               "zero.Init the 16-bit save writes every weight matrix transposed")
    fix = "use ZenFlow with stage 2 (zero2_offload), or leave the zenflow block out."
    deepspeed = deepspeed_version(version)
    if not zenflow_zero3_unchecked(version):
        return Finding("zenflow-zero3", "error", f"{problem} (DeepSpeed {deepspeed or 'unknown'}).", fix)
    return Finding("zenflow-zero3", "warning",
                   f"{problem} in DeepSpeed {ZENFLOW_ZERO3_CHECKED}; DeepSpeed {deepspeed} is newer and unchecked: "
                   "run benchmarks/cpu/zenflow_zero3/repro.py before trusting a save.", fix)


RULES = (_auto, _batch, _precision, _stage_keys, _offload, _saves, _leaf_modules, _deepcompile,
         _sequence_parallel_size_key, _zenflow, _offload_accumulation, _partial_offload)


def config_findings(context: CheckContext) -> list:
    return [finding for rule in RULES for finding in rule(context)]


def fix_config(config: dict, findings) -> dict:
    """A corrected copy: ignored/unknown keys dropped, misplaced stage keys dropped, batch and fp16
    keys handed to the Trainer ("auto"), 16-bit gathering on for stage 3. Other findings stay."""
    fixed = copy.deepcopy(config)
    zero = fixed.get("zero_optimization") if isinstance(fixed.get("zero_optimization"), dict) else {}
    codes = {f.code for f in findings}
    for finding in findings:
        if finding.code == "unknown-key" and finding.key:
            parent, _, leaf = finding.key.rpartition(".")
            node = get_dotted(fixed, parent) if parent else fixed
            if isinstance(node, dict):
                node.pop(leaf, None)
    if codes & {"stage3-key-in-stage12", "stage12-key-in-stage3"}:
        doomed = _STAGE12_ONLY if zero.get("stage") == 3 else tuple(k for k in zero if k.startswith("stage3_") or k in _STAGE3_ONLY)
        for key in doomed:
            zero.pop(key, None)
    if codes & {"batch-arithmetic", "batch-size-missing", "trainer-mismatch"}:
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            fixed[key] = "auto"
    if codes & {"fp16-on-cpu", "fp16-and-bf16"} and isinstance(fixed.get("fp16"), dict):
        fixed["fp16"]["enabled"] = "auto"
    if "leaf-modules-on-cpu" in codes:
        drop_gpu_only_settings(fixed)
    if "sequence-parallel-size-under-trainer" in codes:
        fixed.pop("sequence_parallel_size", None)
    if "nvme-param-reuse" in codes:
        zero["stage3_max_reuse_distance"] = 0
    if "zero3-no-gather" in codes:
        gather_weights_on_save(fixed)
    return fixed
