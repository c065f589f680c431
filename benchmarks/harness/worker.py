"""One benchmark setup in one launch: ``torchrun --nproc_per_node N -m benchmarks.harness.worker --spec spec.json``.

Builds the model from its config (under zero.Init for stage 3: TrainingArguments first, so the
Trainer's own HF DeepSpeed config partitions it), trains on random tokens with the HF Trainer in bf16,
times every step, gathers peak memory from all ranks and, for stage 3, times the 16-bit save and checks
the saved weights bitwise against the engine's. Rank 0 writes the result JSON the spec names.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback

import hf_zero
from benchmarks.harness import exactness
from benchmarks.harness.host_peaks import HostPeakSampler
from hf_zero.compat.hf_api import checkpointing_arg_name
from hf_zero.model_configs import build_config
from benchmarks.harness.peak_memory import PeakMemoryRecorder
from benchmarks.harness.profile import StepProfiler
from hf_zero.zero3.loading import zero3_init_paused
from hf_zero.config.dotted import get_dotted, offload_devices
from hf_zero.distributed import barrier, has_gpu, is_distributed

GIB = 1024**3
# transformers 5.23 renamed gradient_checkpointing (kept as an alias); 5.17 only has the old name
CHECKPOINTING_ARG = checkpointing_arg_name(transformers.TrainingArguments)


class RandomTokens(torch.utils.data.Dataset):
    """``length`` samples cycling over a small pool of random sequences: no data loading cost, little memory.
    With ``min_seq``, each pooled sequence is cut to a length drawn from min_seq..seq (fixed per pool entry,
    so every launch and rank sees the same lengths)."""

    def __init__(self, vocab: int, seq: int, length: int, pool: int = 64, min_seq: int | None = None):
        self.ids = torch.randint(0, vocab, (pool, seq), generator=torch.Generator().manual_seed(0))
        self.lengths = (torch.randint(min_seq, seq + 1, (pool,), generator=torch.Generator().manual_seed(1)).tolist()
                        if min_seq else [seq] * pool)
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        ids = self.ids[i % len(self.ids)][:self.lengths[i % len(self.ids)]]
        return {"input_ids": ids, "labels": ids.clone()}


class PadToLongest:
    """Pads each batch to its longest sample (rounded up to ``multiple``), as DataCollatorWithPadding pads a
    tokenized dataset, so compiled code sees a new sequence length from batch to batch. Records each batch's
    sample lengths and width, in order: the dataloader runs it in the main process."""

    def __init__(self, multiple: int | None = None):
        self.multiple = multiple
        self.sample_lengths, self.widths = [], []  # one entry per batch built

    def __call__(self, samples: list) -> dict:
        from torch.nn.utils.rnn import pad_sequence

        ids = [s["input_ids"] for s in samples]
        longest = max(len(t) for t in ids)
        width = -(-longest // self.multiple) * self.multiple if self.multiple else longest
        input_ids = pad_sequence(ids, batch_first=True, padding_value=0)
        labels = pad_sequence([s["labels"] for s in samples], batch_first=True, padding_value=-100)
        mask = pad_sequence([torch.ones_like(t) for t in ids], batch_first=True, padding_value=0)
        extra = width - longest
        if extra:
            input_ids, labels, mask = (torch.nn.functional.pad(t, (0, extra), value=v)
                                       for t, v in ((input_ids, 0), (labels, -100), (mask, 0)))
        self.sample_lengths.append([len(t) for t in ids])
        self.widths.append(width)
        return {"input_ids": input_ids, "labels": labels, "attention_mask": mask}


class StepTimer(TrainerCallback):
    """Wall time between consecutive optimizer-step ends (so data loading and logging count), and the
    memory peak of training alone: the peak counter is reset once the engine and model are built."""

    def __init__(self, started: float | None = None):
        self.times, self.init_peak = [], {}
        self._last = None
        self._started = started  # set: each step's time goes to the setup's log as it ends (offload steps take minutes)

    def _now(self):
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # kernels are asynchronous: time what ran, not what was queued
        return time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.init_peak = _memory()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self._last = self._now()
        if self._started is not None:
            self._progress(state, f"model and engine ready after {self._last - self._started:.1f} s")

    def on_step_end(self, args, state, control, **kwargs):
        now = self._now()
        self.times.append(now - self._last)
        self._last = now
        self._progress(state, f"step {state.global_step}/{state.max_steps}: {self.times[-1]:.2f} s")

    def _progress(self, state, line: str) -> None:
        if self._started is not None and state.is_world_process_zero:
            print(f"bench: {line}", file=sys.stderr, flush=True)


class PhaseLabel(TrainerCallback):
    """Tells the host sampler when training starts: the rises before it are the model's and the engine's start."""

    def __init__(self, sampler: HostPeakSampler):
        self.sampler = sampler

    def on_train_begin(self, args, state, control, **kwargs):
        self.sampler.phase = "train"


def _host_memory() -> dict:
    """The host side of this process: peak resident memory (libraries included; ru_maxrss is KiB on Linux) and, on a
    GPU machine, the peak of torch's pinned-memory pool, where CPU offload keeps what it copies to and from the GPU."""
    host = {"host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2}
    if torch.cuda.is_available() and hasattr(torch.cuda, "host_memory_stats"):
        stats = torch.cuda.host_memory_stats()
        host["host_peak_pinned_gib"] = stats.get("allocated_bytes.peak", stats.get("allocated_bytes.all.peak", 0)) / GIB
    return host


def _memory() -> dict:
    host = _host_memory()
    if torch.cuda.is_available():
        return {"alloc_gib": torch.cuda.max_memory_allocated() / GIB, "reserved_gib": torch.cuda.max_memory_reserved() / GIB,
                **host}
    return {"rss_gib": host["host_peak_rss_gib"], **host}


def _all_ranks(obj) -> list:
    import torch.distributed as dist

    if not is_distributed():
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def _batch_tokens(collator: PadToLongest, spec: dict, accumulation: int) -> dict:
    """This rank's timed batches: the collator ran in step order (the dataloader may build one batch ahead), and each
    optimizer step took ``accumulation`` of them."""
    timed = slice(spec["warmup"] * accumulation, spec["steps"] * accumulation)
    lengths, widths = collator.sample_lengths[timed], collator.widths[timed]
    return {"real": [sum(batch) for batch in lengths], "padded": [w * len(batch) for w, batch in zip(widths, lengths)],
            "widths": widths, "lengths": [n for batch in lengths for n in batch]}


def _padding_stats(batches: list, real: int) -> dict:
    """What the timed variable-length batches of all ranks were: mean sample length, padding, widths."""
    lengths = [n for rank in batches for n in rank["lengths"]]
    padded = sum(sum(rank["padded"]) for rank in batches)
    return {"mean_sample_tokens": statistics.mean(lengths), "padding_share": 1 - real / padded,
            "batch_widths": sorted({w for rank in batches for w in rank["widths"]})}


def _compiled_graphs() -> int:
    """Graphs dynamo compiled in this process (0 without torch.compile): one per block class and shape regime
    when compilation settles, more when it recompiles."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def leaf_classes(model) -> dict:
    """{class name: count} of the modules DeepSpeed gathers whole as ZeRO-3 leaves (MoE blocks hf_zero made leaves,
    the threshold's, DeepSpeed's own list): which leaf path a row measured."""
    from hf_zero.compat.deepspeed_api import is_leaf

    counts = {}
    for module in model.modules():
        if is_leaf(module):
            counts[type(module).__name__] = counts.get(type(module).__name__, 0) + 1
    return counts


def engine_problem(kind: str, engine: str, world_size: int) -> str | None:
    """Why the model is not driven the way the setup says (a benchmark of the wrong thing), or None."""
    if kind == "deepspeed" and engine != "DeepSpeedEngine":
        return f"a DeepSpeed setup trained with {engine}, not a DeepSpeedEngine"
    if kind == "ddp" and world_size > 1 and engine != "DistributedDataParallel":
        return f"a DDP setup on {world_size} ranks trained with {engine}, not DistributedDataParallel"
    if kind == "fsdp" and "FSDP" not in engine and "FullyShardedDataParallel" not in engine:
        return f"an FSDP setup trained with {engine}, not FSDP"
    return None


def compare_weights(saved: dict, expected: dict) -> list:
    """Every difference between the reloaded file and the engine's gathered weights; [] when bitwise equal."""
    problems = [f"{name}: missing from the saved file" for name in expected if name not in saved]
    problems += [f"{name}: in the saved file but not in the model" for name in saved if name not in expected]
    for name in sorted(set(saved) & set(expected)):
        a, b = saved[name], expected[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            problems.append(f"{name}: saved {a.dtype} {tuple(a.shape)}, model {b.dtype} {tuple(b.shape)}")
        elif not torch.equal(a, b):
            problems.append(f"{name}: max abs diff {(a.float() - b.float()).abs().max().item():.3g}")
    return problems


def _load_saved(folder: Path) -> dict:
    """The weights ``from_pretrained`` gives back from ``folder``, under the model's own parameter names: the file's
    names can differ (transformers saves a fused experts module as one tensor per expert and converts on load)."""
    with zero3_init_paused():  # on rank 0 only: entering zero.Init here would wait for the other ranks
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype="auto", device_map="cpu")
    return model.state_dict()


def _save_and_check(trainer, folder: Path, keep: bool) -> dict:
    """Time ``save_model`` (gathers 16-bit weights under ZeRO-3) and check the file against the engine's weights."""
    barrier()
    start = time.perf_counter()
    trainer.save_model(str(folder))
    barrier()  # the save is done when every rank is done (rank 0 writes, the others gather)
    seconds = time.perf_counter() - start
    expected = hf_zero.gathered_state_dict(trainer.model)  # a collective: every rank enters
    result = None
    if trainer.is_world_process_zero():
        problems = hf_zero.saved_model_problems(folder, trainer.model)
        if not problems:
            problems = compare_weights(_load_saved(folder), expected)
        files = [p for p in folder.glob("*.safetensors")]
        result = {"seconds": seconds, "bytes": sum(p.stat().st_size for p in files), "tensors": len(expected),
                  "reload_equal": not problems, "problems": problems[:10]}
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)  # 2.7 GB per save at 1.35B; the check is what we keep
    barrier()
    return result


def total_steps(spec: dict) -> int:
    """The timed steps, then (when profiling) one profiler warm-up step and the profiled ones."""
    profiled = spec.get("profile_steps", 0)
    return spec["steps"] + (StepProfiler.extra_steps(profiled) if profiled else 0) + bool(spec.get("memory_snapshot"))


def nvme_folder(spec: dict) -> Path:
    """The NVMe swap folder of a setup that offloads to NVMe without naming one: in its work folder."""
    folder = Path(spec["workdir"]) / "nvme"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def folder_gib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**30


def nvme_folders(config) -> set:
    """The folders a resolved DeepSpeed config swaps to (the work folder's, the user's, or both)."""
    if not isinstance(config, dict):
        return set()
    blocks = (get_dotted(config, f"zero_optimization.{b}") for b in ("offload_param", "offload_optimizer"))
    return {Path(b["nvme_path"]) for b in blocks if isinstance(b, dict) and b.get("device") == "nvme" and b.get("nvme_path")}


class FolderPeak(TrainerCallback):
    """The largest size some folders reach together at the end of a step: DeepSpeed's NVMe swap files exist only
    while the engine does (it removes them at the end of training)."""

    def __init__(self, folders: set):
        self.folders, self.peak_gib = folders, 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self.peak_gib = max(self.peak_gib, sum(folder_gib(folder) for folder in self.folders))


def build_args(spec: dict, setup: dict):
    on_gpu = has_gpu()
    gc = setup["gradient_checkpointing"]
    kwargs = dict(
        output_dir=str(Path(spec["workdir"]) / "trainer"), per_device_train_batch_size=setup["micro_batch"],
        gradient_accumulation_steps=1, max_steps=total_steps(spec), learning_rate=1e-4,
        # one warm-up step: transformers 5.17 fills the HF-docs WarmupLR with 0 steps, which DeepSpeed 0.19.8 rejects
        # --exactness compares the loss of every step with DDP's; otherwise one mean over the run (no per-step sync)
        warmup_steps=1, lr_scheduler_type="constant_with_warmup",
        logging_steps=1 if spec.get("exactness") else spec["steps"],
        save_strategy="no", report_to=[], disable_tqdm=True, bf16=True, seed=0, dataloader_drop_last=True,
        **{CHECKPOINTING_ARG: gc},
    )
    if gc:  # non-reentrant everywhere, as ZeroCallback sets it for DeepSpeed: the same recompute for all setups
        kwargs[f"{CHECKPOINTING_ARG}_kwargs"] = {"use_reentrant": False}
    if not on_gpu:
        kwargs["use_cpu"] = True
    if setup["kind"] == "ddp":
        # the Trainer's default (True without checkpointing) adds a graph traversal per step that
        # PyTorch itself warns about; a tuned DDP baseline turns it off
        kwargs["ddp_find_unused_parameters"] = False
    if setup["kind"] == "deepspeed" and "nvme" in offload_devices(setup["deepspeed"]) and "nvme_path" not in setup["args"]:
        kwargs["nvme_path"] = str(nvme_folder(spec))  # only where the config names none (hf_zero.TrainingArguments)
    kwargs.update(setup["args"])
    if setup["kind"] == "deepspeed":
        return hf_zero.TrainingArguments(deepspeed=setup["deepspeed"], **kwargs)
    return transformers.TrainingArguments(**kwargs)


def build_model(spec: dict, setup: dict):
    config = build_config(spec["model"]["config"])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    stage = (setup["deepspeed"] or {}).get("zero_optimization", {}).get("stage")
    if stage == 3 or not has_gpu():
        # stage 3: the Trainer's HF DeepSpeed config is alive, so this runs under zero.Init (partitioned on the GPUs)
        return AutoModelForCausalLM.from_config(config)
    # fp32 weights straight on this rank's GPU (the Trainer would move them there anyway); bf16 is autocast
    # for DDP and FSDP, and DeepSpeed casts to bf16 itself
    with torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))):
        return AutoModelForCausalLM.from_config(config)


def initial_weights(spec: dict) -> dict:
    """--exactness: the weights every setup starts from, a CPU initialization with seed 0 (zero.Init and a GPU
    initialization draw their random numbers in other orders). Built before TrainingArguments: while the Trainer's
    DeepSpeed config is alive, from_config runs under zero.Init."""
    config = build_config(spec["model"]["config"])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cpu"):
        return AutoModelForCausalLM.from_config(config).state_dict()


def load_weights(model, weights: dict) -> None:
    """``weights`` into ``model``; under ZeRO-3 rank 0 writes them into the gathered parameters and DeepSpeed
    partitions them to every rank."""
    import deepspeed

    params = list(model.parameters())
    partitioned = any(hasattr(p, "ds_id") for p in params)
    rank0 = not is_distributed() or torch.distributed.get_rank() == 0
    with deepspeed.zero.GatheredParameters(params, modifier_rank=0, enabled=partitioned), torch.no_grad():
        if rank0 or not partitioned:
            for name, param in model.named_parameters():
                param.copy_(weights[name])


def apply_dynamo_settings(setup: dict) -> None:
    """The setup's ``dynamo.NAME`` settings, read when compiled code first runs (inside trainer.train())."""
    if not setup.get("dynamo"):
        return
    from torch._dynamo import config as dynamo_config  # binds no local "torch" (main uses the module's)

    for name, value in setup["dynamo"].items():
        setattr(dynamo_config, name, value)


def with_lora(model, setup: dict):
    """The model with the setup's LoRA adapter, if it has one."""
    if not setup.get("lora"):
        return model
    from peft import LoraConfig, get_peft_model

    # after zero.Init: the base stays partitioned, the adapter is created whole and partitioned by the engine
    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **setup["lora"]))


def adapter_dtypes(model) -> list | None:
    """The dtypes the engine trains a LoRA adapter in (a ZeRO-3 partition's own dtype); None without one."""
    if all(p.requires_grad for p in model.parameters()):
        return None
    return sorted({str(getattr(p, "ds_tensor", p).dtype) for p in model.parameters() if p.requires_grad})


def offload_forward_activations(trainer) -> None:
    """What each forward saves for backward (with checkpointing: each layer's input) goes to pinned host memory and
    comes back in backward: torch's save_on_cpu around the Trainer's loss computation. Backward, with its
    recomputed forwards, runs outside it."""
    compute_loss = trainer.compute_loss

    def compute_loss_offloaded(*args, **kwargs):
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return compute_loss(*args, **kwargs)

    trainer.compute_loss = compute_loss_offloaded


def share_gpus(ranks_per_gpu: int) -> None:
    """Several ranks on each GPU (--ranks-per-gpu): NCCL refuses two ranks on one device, gloo runs on CUDA tensors.
    Each rank takes its GPU's index as LOCAL_RANK, which Accelerate and DeepSpeed read to pick the device, and the
    gloo group starts before TrainingArguments, which otherwise starts NCCL for a GPU run."""
    import deepspeed

    gpu = int(os.environ.get("LOCAL_RANK", "0")) // ranks_per_gpu
    os.environ["LOCAL_RANK"] = str(gpu)
    torch.cuda.set_device(gpu)
    deepspeed.init_distributed(dist_backend="gloo")


class ExactnessCheck(TrainerCallback):
    """--exactness: the first step's gradients (taken once the engine exists) and, after training, the comparison with
    the sweep's DDP reference, or this run written as that reference."""

    def __init__(self, trainer, spec: dict):
        self.trainer, self.spec = trainer, spec["exactness"]
        self.gradients = exactness.FirstStepGradients()

    def on_train_begin(self, args, state, control, **kwargs):
        self.gradients.install(self.trainer)

    def result(self, losses: list) -> dict:
        """On rank 0, after training: what goes into the setup's row."""
        reference = Path(self.spec["gradients"])
        found = {"role": self.spec["role"], "reference": self.spec["reference_setup"]}
        if self.gradients.grads is None:
            return {**found, "gradients": {"compared": 0, "note": "no gradient was taken (no optimizer step ran)"}}
        if self.spec["role"] == "reference":
            exactness.save_reference(self.gradients.grads, reference)
            Path(self.spec["losses"]).write_text(json.dumps(losses))
            return {**found, "gradients": {"parameters": len(self.gradients.grads)}}
        if not reference.exists():
            return {**found, "gradients": {"compared": 0, "note": "no DDP reference in this sweep"}}
        found["gradients"] = exactness.compare(self.gradients.grads, exactness.load_reference(reference))
        loss_reference = Path(self.spec["losses"])
        if loss_reference.exists():
            found["loss_gap"] = exactness.loss_gap(losses, json.loads(loss_reference.read_text()))
            found["loss_reference"] = self.spec.get("loss_reference_setup")
        return found


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="JSON written by benchmarks.harness.run")
    opts = p.parse_args(argv)
    spec = json.loads(Path(opts.spec).read_text())
    setup = spec["setup"]
    if has_gpu() and spec.get("ranks_per_gpu", 1) > 1:
        share_gpus(spec["ranks_per_gpu"])
    elif has_gpu():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    started = time.perf_counter()
    # from launch on: the engine's start-up buffers are part of the host's peak
    host_peaks = HostPeakSampler().start() if spec.get("host_peaks") and os.environ.get("RANK", "0") == "0" else None
    apply_dynamo_settings(setup)
    weights = initial_weights(spec) if spec.get("exactness") else None
    args = build_args(spec, setup)
    model = build_model(spec, setup)
    if weights is not None:
        load_weights(model, weights)
        del weights
    if setup.get("weights") == "bf16":
        model.to(torch.bfloat16)  # computes as DeepSpeed's bf16 mode does; the optimizer then steps bf16 weights
    partitioned = hf_zero.is_partitioned(model)
    model = with_lora(model, setup)
    if setup.get("long_context"):
        hf_zero.enable_long_context(model, setup["long_context"])
    if setup["deepspeed"] and setup["deepspeed"]["zero_optimization"]["stage"] == 3 and not partitioned:
        raise RuntimeError("stage 3, but the model was not built under zero.Init")
    world = args.world_size
    accumulation = args.gradient_accumulation_steps
    variable = setup.get("data") or {}
    # enough samples for every micro-batch of every optimizer step: one epoch, whatever the accumulation
    data = RandomTokens(model.config.vocab_size, spec["seq"],
                        total_steps(spec) * setup["micro_batch"] * accumulation * world, min_seq=variable.get("min_seq"))
    collator = PadToLongest(variable.get("pad_to_multiple_of")) if variable else None
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator)
    if setup.get("activation_offload"):
        offload_forward_activations(trainer)
    callback = hf_zero.attach(trainer, log_memory=False, **setup.get("callback", {})) if setup["kind"] == "deepspeed" else None
    timer = StepTimer(started)
    trainer.add_callback(timer)
    exact = ExactnessCheck(trainer, spec) if spec.get("exactness") else None
    if exact is not None:
        trainer.add_callback(exact)
    folders = nvme_folders(args.deepspeed) if setup["kind"] == "deepspeed" else set()
    nvme = FolderPeak(folders) if folders else None
    if nvme is not None:
        trainer.add_callback(nvme)
    profiler = None
    if spec.get("profile_steps") and args.process_index == 0:
        # after the timer, so its synchronize ends each profiled step's GPU work inside the step
        profiler = StepProfiler(spec["trace"], spec["python_trace"], after=spec["steps"], active=spec["profile_steps"])
        trainer.add_callback(profiler)
    recorder = None
    if spec.get("memory_snapshot") and args.process_index == 0:
        recorder = PeakMemoryRecorder(step=total_steps(spec) - 1)  # the last step, after any profiled ones
        trainer.add_callback(recorder)
    if host_peaks is not None:
        trainer.add_callback(PhaseLabel(host_peaks))
    model_ready = time.perf_counter() - started
    trainer.train()
    if host_peaks is not None:
        host_peaks.phase = "save"

    engine = type(trainer.model_wrapped).__name__
    problem = engine_problem(setup["kind"], engine, world)
    if problem:
        raise RuntimeError(problem)
    per_rank = _all_ranks({"train": _memory(), "init": timer.init_peak})
    save = None
    if spec["save"]:
        save = _save_and_check(trainer, Path(spec["workdir"]) / "saved", spec.get("keep_saved", False))

    host_rises = host_peaks.stop() if host_peaks is not None else None
    batches = _all_ranks(_batch_tokens(collator, spec, accumulation)) if collator else None
    if trainer.is_world_process_zero():
        steady = timer.times[spec["warmup"]:spec["steps"]]  # the profiled steps are slower: never timed
        median = statistics.median(steady)
        # per optimizer step: every micro-batch of the accumulation, on every rank
        tokens_per_step = setup["micro_batch"] * spec["seq"] * world * accumulation
        tokens_per_s = tokens_per_step / median
        data_stats = None
        if batches:  # steps differ in length: real tokens of all ranks over the time of all timed steps
            real = sum(sum(rank["real"]) for rank in batches)
            tokens_per_step, tokens_per_s = real / len(steady), real / sum(steady)
            data_stats = {**variable, **_padding_stats(batches, real)}
        train_mem = [r["train"] for r in per_rank]
        key = "alloc_gib" if "alloc_gib" in train_mem[0] else "rss_gib"
        result = {
            "status": "ok", "engine": engine, "world_size": world, "partitioned": partitioned,
            "device": {"type": "cuda" if has_gpu() else "cpu",
                       "name": torch.cuda.get_device_name() if has_gpu() else "cpu",
                       "count": torch.cuda.device_count() if has_gpu() else os.cpu_count()},
            "step_times": timer.times[:spec["steps"]], "median_step_s": median, "tokens_per_step": tokens_per_step,
            "gradient_accumulation_steps": accumulation,
            "host_memory": {"peak_rss_gib": max(r["train"]["host_peak_rss_gib"] for r in per_rank),
                            "peak_pinned_gib": max((r["train"].get("host_peak_pinned_gib") for r in per_rank
                                                    if r["train"].get("host_peak_pinned_gib") is not None), default=None)},
            "tokens_per_s": tokens_per_s,
            "memory": {"kind": "cuda" if key == "alloc_gib" else "rss", "per_rank": per_rank,
                       "peak_gib": max(m[key] for m in train_mem),
                       "peak_reserved_gib": max(m.get("reserved_gib", 0.0) for m in train_mem) if key == "alloc_gib" else None},
            "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
            "save": save, "setup_s": model_ready, "warnings": callback.warnings if callback else [],
            "engine_fixes": callback.engine_fixes if callback else [],
        }
        if (setup["deepspeed"] or {}).get("zero_optimization", {}).get("stage") == 3:
            result["leaf_classes"] = leaf_classes(trainer.model)  # how the row's leaves came about: MoE, threshold
        if exact is not None:
            result["exactness"] = exact.result(result["losses"])
        if nvme is not None:
            result["nvme_gib"] = nvme.peak_gib  # this rank's files: rank 0 writes the result
        if setup.get("lora"):
            result["adapter_dtypes"] = adapter_dtypes(trainer.model)
        if data_stats:
            result["data"] = data_stats
        graphs = _compiled_graphs()
        if graphs:
            result["compiled_graphs"] = graphs
        if profiler is not None:
            result["profile"] = profiler.summary()
        if recorder is not None:
            result["memory_breakdown"] = recorder.summary
        if host_rises is not None:
            result["host_peaks"] = host_rises
        Path(spec["result"]).write_text(json.dumps(result, indent=1))
    hf_zero.shutdown()


if __name__ == "__main__":
    main()
