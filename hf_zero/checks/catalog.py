"""Every check hf_zero runs on a ZeRO run, in the order it runs them, for both front doors.

Adding a check: write its function here (it reads a RunContext and returns lines, [] when quiet), add one Check line
to CHECKS, and give it a test where it fires and one where it stays quiet (tests/checks/test_catalog.py names both
for every id); docs/run-checks.md lists it.
"""

import os

from ..batch_counts import UNEVEN_FIX, compare_across_ranks
from ..errors import ConfigError
from ..batch_padding import padding_advice
from ..checkpoints.folders import training_state_problems
from ..checkpoints.saved_models import saved_model_problems
from ..compat.hf_api import checkpointing_on, set_checkpointing_kwargs, turn_on_checkpointing
from ..config.dotted import offload_devices
from ..config.findings import FINDING_CODES
from ..compat.deepspeed_api import param_coordinator, set_leaf
from ..zero3.leaf_threshold import threshold_leaves
from ..config.live import GATHER_ON_SAVE, drop_gpu_only_settings, gather_weights_on_save, leaf_threshold, no_leaf_modules
from ..config.validate import validate_config
from ..distributed import gpu_memory_bytes
from ..engine.checks import engine_problems, layout_problems, training_alone
from ..engine.fixes import leaf_release_after_compute, offload_fixes_applied
from ..long_context import enable_long_context, long_context_problems
from ..offload_fit import host_memory_problem_of, nvme_buffer_problem_of
from ..engine.offload_threads import threads_for_offload
from ..sequence_parallel import (attention_head_counts, check_batches_of, check_loader_batches,
                                 loss_over_sequence_shards, sequence_parallel_problems)
from ..zero3.divergence import watch_fetch_order
from ..zero3.generation import keep_generation_in_step
from ..zero3.leaves import leaf_inputs_require_grad, leaves_on_ranks, returns_model_output, trains, watch_leaf_outputs
from ..zero3.modalities import keep_vision_in_step
from ..zero3.block_leaves import make_block_leaves
from ..zero3.moe import make_moe_leaves
from ..zero3.partitions import full_numel, is_zero3_param
from ..zero3.peft_fixes import adapters_to_training_dtype, no_leaf_modules_with_frozen_weights, zero2_advice
from ..zero3.recompute import default_checkpointing_kwargs, recompute_problems
from .pipeline import Check, Line, skip_ids, warning


# ---- arguments: the Trainer's TrainingArguments, before any process group (hf_zero's launch glue) ---------------
FP16_ON_CPU = ("fp16 was requested, but DeepSpeed on the CPU does not support fp16. "
               "Fix: use --bf16 (or no mixed precision) on CPU machines.")


def fp16_arguments_on_cpu(run) -> list:
    """TrainingArguments(fp16=True) on a machine without a GPU: DeepSpeed's CPU accelerator has no fp16."""
    return [FP16_ON_CPU] if run.on_cpu and getattr(run.args, "fp16", False) else []


# ---- config: the launch and the live DeepSpeed config ------------------------------------------------------------
def world_size_matches(run) -> list:
    """The door sized the run for the launched world (else each rank would train alone, or DeepSpeed asserts)."""
    if run.declared_world == run.launched:
        return []
    return [training_alone(run.declared_world, run.launched, "the Trainer" if run.door == "trainer" else "the Accelerator")]


def deepspeed_config(run) -> list:
    """DeepSpeed's own parser and hf_zero's rules (hf_zero.validate_config), with this process's environment. Under
    the Trainer it runs twice: on the arguments, before any process group, the config's errors alone (its warnings
    are said once, when the callback attaches); then on the live config."""
    if run.moment == "arguments":
        return [f for f in validate_config(run.config, on_cpu=run.on_cpu, world_size=run.launched)
                if f.severity == "error"]
    sp, _ = run.sp_tp
    return [f for f in validate_config(run.config, on_cpu=run.on_cpu, world_size=run.launched, environment=True,
                                       sequence_parallel=sp)
            if f.code != "zero3-no-gather"]  # save-gathers-weights turns it on


def gpu_only_settings(run) -> list:
    """On a CPU machine, the settings that work only on GPUs go (a config's leaf-module threshold)."""
    return drop_gpu_only_settings(run.config) if run.on_cpu else []


def save_gathers_weights(run) -> list:
    """Under ZeRO-3, saves gather 16-bit weights, so every saved model reloads with from_pretrained."""
    if not run.options.force_gather_on_save:
        if run.stage == 3 and not run.config["zero_optimization"].get(GATHER_ON_SAVE, False):
            return [f"stage 3 with {GATHER_ON_SAVE} off: every saved model would be ZeRO shards that from_pretrained "
                    "cannot load. Fix: set it to true in the config."]
        return []
    note = gather_weights_on_save(run.config)
    return [warning(note)] if note else []


# ---- model: before the engine exists ----------------------------------------------------------------------------
def long_context(run) -> list:
    """ZeroCallback(long_context=...): the model can run the parts asked for (hf_zero.long_context)."""
    parts = run.options.long_context
    return long_context_problems(run.model, parts) if parts is not None and run.model is not None else []


def long_context_parts(run) -> list:
    """ZeroCallback(long_context=...): the parts go on the model; offloading what checkpointing saves needs
    checkpointing on, so it is turned on (said)."""
    parts = run.options.long_context
    if parts is None or run.model is None:
        return []
    parts = enable_long_context(run.model, parts, checked=False)  # long-context judged it (or was skipped)
    if parts.offload_activations and run.args is not None and not checkpointing_on(run.args):
        turn_on_checkpointing(run.args)
        return [warning("long_context turned gradient checkpointing on: offload_activations moves the checkpointed "
                        "layer inputs to host memory.")]
    return []


def optimizer_type(run) -> list:
    """In a loop whose DeepSpeed config has an optimizer block, the optimizer passed is a DummyOptim or a torch
    Adam/AdamW (whose hyperparameters then configure DeepSpeed's AdamW); Accelerate refuses any other."""
    import torch

    if "optimizer" not in run.config:
        return []
    others = [o for o in run.optimizers if isinstance(o, torch.optim.Optimizer)
              and not isinstance(o, (torch.optim.Adam, torch.optim.AdamW))]
    return [f"the DeepSpeed config has an optimizer block (DeepSpeed's AdamW) and the loop passes "
            f"{type(o).__name__}. Fix: pass accelerate.utils.DummyOptim(model.parameters(), lr=...), or remove the "
            "config's optimizer block to train with your own optimizer." for o in others]


def parallel_layout(run) -> list:
    """Sequence/tensor-parallel degrees the world, the model's heads and its attention can be split into."""
    sp, tp = run.sp_tp
    heads, kv_heads = attention_head_counts(run.model)
    return (layout_problems(run.launched, sp, tp, heads, kv_heads)
            + sequence_parallel_problems(run.model, run.parallelism, run.launched, sp, on_cpu=run.on_cpu))


def sequence_parallel_batches(run) -> list:
    """Under Ulysses, every training batch splits into sp_size shards and carries position_ids (its collate wrapped)."""
    sp, _ = run.sp_tp
    if sp > 1:
        if run.trainer is not None:
            check_batches_of(run.trainer, sp)
        for loader in run.loaders:
            check_loader_batches(loader, sp)
    return []


def host_memory(run) -> list:
    """With states offloaded, the model states the planner counts fit this node's memory."""
    if not offload_devices(run.config):
        return []
    problem = host_memory_problem_of(run.config, run.model, run.declared_world, half=2 if run.half_dtype else 4,
                                     host_bytes=run.host_bytes)
    return [problem] if problem else []


def nvme_buffer(run) -> list:
    """With parameters offloaded to NVMe, one rank's share of the model's largest parameter fits a swap buffer
    (DeepSpeed's swapper refuses a larger one when it partitions the model)."""
    problem = nvme_buffer_problem_of(run.config, run.model, run.declared_world)
    return [problem] if problem else []


def offload_threads(run) -> list:
    """With the optimizer on the host, torch's CPU threads (DeepSpeed's CPU Adam runs on them) get this process's
    share of the node's cores where a launcher left one."""
    note = threads_for_offload(run.config, run.options.offload_threads)
    return [note] if note else []


def single_process(run) -> list:
    """ZeRO without offload on one process shards nothing."""
    if run.launched != 1 or not run.stage or offload_devices(run.config):
        return []
    return [f"ZeRO-{run.stage} on a single process shards nothing: the whole model, its gradients and Adam states stay "
            "on this device, and DeepSpeed's bookkeeping only slows each step (measured: hf_zero's docs, "
            "performance.md). Fix: train without a DeepSpeed config, launch more processes, or use "
            "an offload preset (zero2_offload, zero3_offload) when the model does not fit."]


def _frozen(run) -> list:
    return [p for p in run.model.parameters() if not p.requires_grad] if run.stage == 3 else []


def frozen_weights_leaves(run) -> list:
    """Under ZeRO-3 with frozen weights (LoRA) on a DeepSpeed the leaf-inputs fix does not cover, no leaf modules."""
    note = no_leaf_modules_with_frozen_weights(run.model, run.config) if _frozen(run) else None
    return [note] if note else []


def model_leaves(run) -> list:
    """Under ZeRO-3, a leaf-module threshold that would make a leaf of a model returning a ModelOutput (the whole model
    below DeepSpeed's 1e9-parameter cap, a vision tower) is replaced by the threshold's other leaves, set one by one,
    with the rule carried on inside that model: its weights would never train as a leaf (hf_zero.zero3.leaves)."""
    threshold = leaf_threshold(run.config)
    if run.stage != 3 or threshold is None:
        return []

    def model_output(module):
        return returns_model_output(module) and trains(module)

    models = [(name or "the whole model", type(module).__name__)
              for name, module in threshold_leaves(run.model, threshold, full_numel) if model_output(module)]
    if not models:
        return []
    kept = threshold_leaves(run.model, threshold, full_numel, eligible=lambda module: not model_output(module))
    for _, module in kept:
        set_leaf(module)
    named = ", ".join(f"{name} ({kind})" for name, kind in models)
    note = no_leaf_modules(run.config, because=(
        f"it would make a ZeRO-3 leaf of {named}, which returns a ModelOutput; DeepSpeed reduces a leaf's gradients in "
        "a module backward hook that torch calls only for a Tensor or a tuple output, so those weights would never "
        f"train (hf_zero's docs, presets.md). The {len(kept)} modules the threshold picks below it instead "
        f"({_examples(kept)}) are made leaves one by one"))
    return [note] if note else []


def _examples(leaves, shown=2) -> str:
    names = [name for name, _ in leaves[:shown]] + (["..."] if len(leaves) > shown else [])
    return ", ".join(names) if names else "none"


def adapter_dtype(run) -> list:
    """Under ZeRO-3, a 16-bit frozen base's fp32 adapters train in its dtype, as ZeRO-1/2 train them."""
    dtype = run.half_dtype
    if not _frozen(run) or dtype is None or not run.options.cast_adapters:
        return []
    note = adapters_to_training_dtype(run.model, dtype)
    return [note] if note else []


def lora_fits_zero2(run) -> list:
    """LoRA under ZeRO-3 whose base fits each GPU under ZeRO-2, which is faster for adapters."""
    frozen = _frozen(run)
    advice = zero2_advice(sum(full_numel(p) for p in frozen), gpu_memory_bytes()) if frozen else None
    return [advice] if advice else []


def compile_blocks(run) -> list:
    """Under ZeRO-3 with torch.compile, each repeated block's forward compiles and DeepSpeed's hooks stay eager."""
    if run.stage != 3 or run.accelerator is None:
        return []
    from ..zero3.compile import take_over_zero3_compile  # imports DeepSpeed and Accelerate: only for ZeRO-3 runs

    note = take_over_zero3_compile(run.accelerator, run.model, run.config)
    return [note] if note else []


def block_leaves(run) -> list:
    """Under ZeRO-3, the model's repeated blocks (decoder layers) become leaves, each gathered with one all-gather;
    a leaves= class the model does not have stops the run."""
    try:
        note = make_block_leaves(run.model, run.config, run.options.leaves)
    except ConfigError as e:
        return [Line("error", str(e))]
    return [note] if note else []


def moe_leaves(run) -> list:
    """Under ZeRO-3, mixture-of-experts blocks whose ranks can route to different experts become leaves (it says
    what it made itself, once, on rank 0)."""
    make_moe_leaves(run.model, run.config, run.options.moe_leaves)
    return []


def built_whole(run) -> list:
    """A ZeRO-3 model built whole on every rank (not by zero.Init) costs its full size in host memory per rank."""
    if run.stage != 3 or any(is_zero3_param(p) for p in run.model.parameters()):
        return []
    params = list(run.model.parameters())
    n = sum(p.numel() for p in params)
    size = sum(p.numel() * p.element_size() for p in params)
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    load = ("create TrainingArguments(deepspeed=...) before from_pretrained, or load with "
            "hf_zero.from_pretrained(cls, path, config)" if run.door == "trainer" else
            "build the Accelerator (hf_zero.accelerator()) before from_pretrained, or load with "
            "hf_zero.from_pretrained(cls, path, config)")
    return [f"the model ({n / 1e6:.1f}M parameters) was built whole on every rank before ZeRO-3 partitioned it: "
            f"{size * ranks / 1024**3:.2f} GiB of host memory on this node at load. Fix: {load}."]


def checkpointing_kwargs(run) -> list:
    """Gradient checkpointing without kwargs from the user gets one choice across transformers releases (whose
    defaults differ): non-reentrant, reentrant only where the non-reentrant recompute fails. Both train ZeRO-3 to the
    same bits on DeepSpeed 0.19.8 (tests/multiproc/test_reentrant_checkpointing.py). A loop's model was turned on
    with its kwargs already."""
    if run.args is not None and run.checkpointing and run.checkpointing_kwargs is None:
        set_checkpointing_kwargs(run.args, default_checkpointing_kwargs(run.model, run.args))
    return []


def peft_recompute(run) -> list:
    """Non-reentrant checkpointing of a frozen base under ZeRO-3 fails in DeepSpeed before 0.19.3."""
    if not run.checkpointing:
        return []
    return recompute_problems(run.model, run.config, run.checkpointing_kwargs or {}, in_loop=run.args is None)


def batch_padding(run) -> list:
    """On GPUs, a padding collator pads to a multiple of 64 (aligned widths train more tokens per second)."""
    advice = padding_advice(run.collator, not run.on_cpu)
    return [advice] if advice else []


# ---- engine: what prepare built ---------------------------------------------------------------------------------
def engine_drives(run) -> list:
    """DeepSpeed drives the model, on the launched world, and ZeRO-3 partitioned it."""
    sp, tp = run.sp_tp
    return engine_problems(run.engine, run.model, run.stage, run.launched, sp=sp, tp=tp)


def sequence_parallel_loss(run) -> list:
    """Under Ulysses in an Accelerate loop, the model's loss is the loss over every shard of the sequence, as the
    Trainer computes it (the Trainer computes its own)."""
    sp, _ = run.sp_tp
    if sp <= 1 or run.trainer is not None:
        return []
    note = loss_over_sequence_shards(run.engine, run.accelerator)
    return [note] if note else []


def cache_off_while_checkpointing(run) -> list:
    """With checkpointing, the model's use_cache goes off (a KV cache is useless there and warns every step)."""
    config = getattr(run.model, "config", None)
    if run.checkpointing and getattr(config, "use_cache", None):
        config.use_cache = False
    return []


def offload_step_fixes(run) -> list:
    """hf_zero.engine.fixes on the engine: the offload step's host work, copies and overflow test."""
    if not run.options.overlap_offload_copies:
        run.kept["engine_fixes"] = []
        return []
    in_forward = run.options.offload_step_in_forward and not run.compiled  # compile would trace its hooks
    notes = offload_fixes_applied(run.engine, in_forward, run.options.offload_step_chunk)
    run.kept["engine_fixes"] = notes
    return notes


def leaf_release(run) -> list:
    """Under ZeRO-3, leaf modules release their gathered weights only after the GPU has used them (DeepSpeed's fast
    leaf path, on with any granularity threshold, does not wait: several ranks then train differently from DDP)."""
    note = leaf_release_after_compute(run.engine) if run.stage == 3 else None
    return [note] if note else []


def leaf_inputs(run) -> list:
    """Under ZeRO-3, a trainable leaf whose inputs need no gradient (after frozen weights: LoRA) is given one, so
    DeepSpeed reduces its gradients after its backward instead of before it."""
    note = leaf_inputs_require_grad(getattr(run.engine, "module", run.engine)) if run.stage == 3 else None
    return [note] if note else []


def leaf_ranks(run) -> list:
    """Under ZeRO-3 on several GPU ranks, leaf modules still on DeepSpeed's fast leaf path (WARNING) or of classes the
    two-rank gate has not proven (INFO) are named; nothing is refused."""
    if run.stage != 3:
        return []
    coordinator = param_coordinator(run.engine)  # after leaf-release: still fast only where its fix did not apply
    fast_release = bool(getattr(coordinator, "fast_sharding_for_leaf_module", False))
    found = leaves_on_ranks(getattr(run.engine, "module", run.engine), run.launched, not run.on_cpu, fast_release)
    return [Line(*found)] if found else []


def leaf_outputs(run) -> list:
    """Under ZeRO-3, each trainable leaf module's first output is a Tensor or a tuple, or the run stops naming it
    (a leaf returning a ModelOutput would never train)."""
    if run.stage == 3:
        run.kept["leaf_outputs"] = watch_leaf_outputs(getattr(run.engine, "module", run.engine))
    return []


def even_batches(run) -> list:
    """On several ranks, the data loaders prepared with the model yield as many batches on every rank (a loop over
    more batches on one rank waits forever in its extra step). Nothing is refused: a loop that stops every rank after
    the same number of steps runs correctly; a stop later names the uneven batches as its cause."""
    found = compare_across_ranks(run.loaders)
    run.kept["uneven_batches"] = found
    return [f"{found}: the ranks with more batches would wait forever in their extra steps. {UNEVEN_FIX}"] \
        if found else []


def divergence_watch(run) -> list:
    """Under ZeRO-3 on several ranks, every rank gathers the same module, checked before each gather (ranks that
    diverge stop with the modules named instead of hanging)."""
    watch = watch_fetch_order(run.engine, run.options.divergence_check)
    if watch is not None and run.kept.get("uneven_batches"):
        watch.cause = f"The likely cause: {run.kept['uneven_batches']}. {UNEVEN_FIX}"
    run.kept["fetch_watch"] = watch
    return []


def generation_in_step(run) -> list:
    """Under ZeRO-3 on several ranks, generate() passes synced_gpus=True (ranks that finish early keep gathering)."""
    keep_generation_in_step(run.engine)
    return []


def vision_in_step(run) -> list:
    """Under ZeRO-3 on several ranks, ranks without images run a vision-language model's vision tower on a dummy."""
    run.kept["vision_in_step"] = keep_vision_in_step(run.engine, run.options.vision_in_step)
    return []


# ---- save: a written folder, before it replaces anything ---------------------------------------------------------
def checkpoint_complete(run) -> list:
    """A Trainer checkpoint holds its training state (trainer_state.json, the optimizer's shards)."""
    return training_state_problems(run.folder) if run.checkpoint else []


def saved_model_reloads(run) -> list:
    """The saved model reloads with from_pretrained: weights present, no zero-size tensors, shapes match."""
    return saved_model_problems(run.folder, run.model)


CHECKS = (
    Check("fp16-arguments-on-cpu", "arguments", "error", fp16_arguments_on_cpu,
          "TrainingArguments(fp16=True) on a machine without a GPU"),
    Check("world-size", "config", "error", world_size_matches, "the door's world size is the launched one", gate=True),
    Check("gpu-only-settings", "config", "warning", gpu_only_settings, "on CPU, drops settings that work only on GPUs"),
    Check("deepspeed-config", ("arguments", "config"), "error", deepspeed_config,
          "DeepSpeed's parser and hf_zero's config rules",
          gate=True, parts=FINDING_CODES),
    Check("save-gathers-weights", "config", "error", save_gathers_weights,
          "ZeRO-3 saves gather 16-bit weights (turned on and said; refused when forcing is off)",
          off="force_gather_on_save=False refuses instead of turning it on"),
    Check("long-context", "model", "error", long_context, "the model can run the long_context parts asked for",
          gate=True),
    Check("long-context-parts", "model", "warning", long_context_parts,
          "long_context's parts go on the model; checkpointing is turned on for offload_activations",
          off="long_context=None (the default)", kind="fix"),
    Check("optimizer-type", "model", "error", optimizer_type,
          "a loop's optimizer is a DummyOptim or an Adam/AdamW where the config names DeepSpeed's"),
    Check("parallel-layout", "model", "error", parallel_layout, "sequence/tensor-parallel sizes fit the world and model"),
    Check("sequence-parallel-batches", "model", "error", sequence_parallel_batches,
          "Ulysses batches split into sp_size shards and carry position_ids", kind="guard"),
    Check("host-memory", "model", "error", host_memory, "offloaded model states fit the node's memory (the planner)"),
    Check("nvme-buffer-too-small", "model", "error", nvme_buffer,
          "one rank's share of the largest parameter fits an NVMe swap buffer"),
    Check("offload-threads", "model", "warning", offload_threads, "the CPU optimizer gets this process's cores",
          off="offload_threads=None"),
    Check("single-process", "model", "warning", single_process, "ZeRO without offload on one process shards nothing"),
    Check("frozen-weights-leaves", "model", "warning", frozen_weights_leaves,
          "ZeRO-3 with frozen weights on a DeepSpeed the leaf-inputs fix does not cover: no leaf modules"),
    Check("model-leaves", "model", "warning", model_leaves,
          "ZeRO-3: a threshold leaf that returns a ModelOutput (the whole model, a vision tower) is left out; the "
          "threshold's other leaves are set one by one"),
    Check("adapter-dtype", "model", "warning", adapter_dtype, "ZeRO-3 LoRA adapters train in the base's 16-bit dtype",
          off="cast_adapters=False"),
    Check("lora-fits-zero2", "model", "warning", lora_fits_zero2, "LoRA whose base fits ZeRO-2 is advised to use it"),
    Check("compile-blocks", "model", "warning", compile_blocks,
          "ZeRO-3 with torch.compile compiles block forwards, hooks stay eager"),
    Check("block-leaves", "model", "info", block_leaves,
          "ZeRO-3: the model's repeated blocks become leaves, each gathered with one all-gather", off='leaves="off"'),
    Check("moe-leaves", "model", "info", moe_leaves, "ZeRO-3 MoE blocks become leaves", off='moe_leaves="off"',
          kind="fix"),
    Check("built-whole", "model", "warning", built_whole, "a ZeRO-3 model not built by zero.Init is reported"),
    Check("checkpointing-kwargs", "model", "info", checkpointing_kwargs,
          "checkpointing without kwargs gets non-reentrant (reentrant where that fails)", kind="fix"),
    Check("peft-recompute", "model", "error", peft_recompute,
          "non-reentrant checkpointing of a frozen base under ZeRO-3 on DeepSpeed < 0.19.3"),
    Check("batch-padding", "model", "warning", batch_padding, "on GPUs, padding collators pad to a multiple of 64"),
    Check("engine-drives", "engine", "error", engine_drives,
          "DeepSpeed drives the model on the launched world; ZeRO-3 partitioned it", gate=True),
    Check("sequence-parallel-loss", "engine", "warning", sequence_parallel_loss,
          "under Ulysses in a loop, the model's loss covers every shard of the sequence"),
    Check("cache-off-while-checkpointing", "engine", "info", cache_off_while_checkpointing,
          "use_cache off while checkpointing", kind="fix"),
    Check("offload-step-fixes", "engine", "info", offload_step_fixes,
          "offload's host step overlaps the GPU; pinned copies; no per-gradient host test",
          off="overlap_offload_copies=False; offload_step_in_forward"),
    Check("leaf-release", "engine", "info", leaf_release,
          "ZeRO-3 leaf modules release their weights after the GPU has used them (exact on several ranks)"),
    Check("leaf-inputs", "engine", "info", leaf_inputs,
          "ZeRO-3 leaf modules reduce their gradients after their backward, also after frozen weights (LoRA)"),
    Check("leaf-ranks", "engine", "warning", leaf_ranks,
          "ZeRO-3 leaf modules on several GPU ranks on DeepSpeed's fast leaf path, or unproven by the two-rank "
          "exactness gate, are named"),
    Check("leaf-outputs", "engine", "error", leaf_outputs,
          "ZeRO-3 leaf modules return a Tensor or a tuple at their first forward, or the run stops naming them",
          kind="guard"),
    Check("even-batches", "engine", "warning", even_batches,
          "the data loaders prepared with the model yield as many batches on every rank"),
    Check("divergence-watch", "engine", "error", divergence_watch,
          "ZeRO-3 ranks gather the same modules, or stop naming them", off='divergence_check="off"',
          kind="guard"),
    Check("generation-in-step", "engine", "info", generation_in_step, "ZeRO-3 generate() keeps ranks in step",
          kind="fix"),
    Check("vision-in-step", "engine", "error", vision_in_step,
          "ZeRO-3 ranks without images run the vision tower on a dummy", off='vision_in_step="off"', kind="fix"),
    Check("checkpoint-complete", "save", "error", checkpoint_complete, "a Trainer checkpoint holds its training state"),
    Check("saved-model-reloads", "save", "error", saved_model_reloads,
          "the saved folder reloads with from_pretrained", off='force_gather_on_save keeps ZeRO-3 saves whole'),
)

CHECK_IDS = tuple(c.id for c in CHECKS)
SKIP_IDS = skip_ids(CHECKS)  # the check ids and their parts' (deepspeed-config/<code>)
PLANNED = tuple(c for c in CHECKS if c.id in ("host-memory", "nvme-buffer-too-small"))  # hf-zero check --model's
LONG_CONTEXT = tuple(c for c in CHECKS if c.id.startswith("long-context"))  # all a run without DeepSpeed gets
