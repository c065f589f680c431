"""Run a benchmark sweep: each setup in its own ``torchrun`` launch, results merged into ``OUT/results.json``.

One setup that crashes, runs out of memory or hangs is recorded as failed (with its error line and the
tail of its log, kept in OUT/logs/) and the sweep goes on. results.json is rewritten after every setup,
so a sweep cut short by a time limit keeps what finished; ``--resume`` skips setups already measured.
"""

import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields, replace
from importlib import metadata
from pathlib import Path

from hf_zero.distributed import free_port, gpu_count
from hf_zero.errors import ConfigError
from hf_zero.planner import GIB, ModelShape, RunShape, estimate, run_of_config
from hf_zero.model_configs import build_config, flops_per_token, params_text, resolve_model
from .setups import Setup, reduce_bucket, select

SCHEMA = 1
PLANNER_TOLERANCE = 0.15  # the target: each plan within +-15% of the measured peak
_PACKAGES = ("torch", "transformers", "deepspeed", "accelerate", "hf_zero", "safetensors")


@dataclass
class Options:
    out: str = "bench_out"
    setups: list | None = None  # None: the defaults for nproc (or only the variants)
    variants: list = field(default_factory=list)
    nproc: int | None = None
    model: str | None = None
    steps: int | None = None
    warmup: int | None = None
    seq: int | None = None
    resume: bool = False
    fresh: bool = False
    max_minutes: float | None = None
    setup_timeout: float = 900.0
    keep_saved: bool = False
    save_all: bool = False  # save and reload-check every setup, not only ZeRO-3 (where the 16-bit gather can go wrong)
    profile_steps: int = 0  # > 0: profile this many steps after the timed ones (traces in OUT/traces/)
    memory_snapshot: bool = False  # record one more step's allocator history: what is alive at the peak
    host_peaks: bool = False  # sample rank 0's resident memory: the code that raised the host's high-water mark
    repeat: int = 1  # launches per setup, interleaved round by round (A B C A B C), so drift hits all alike
    ranks_per_gpu: int = 1  # > 1: that many ranks share each GPU over gloo (NCCL refuses two ranks on one device)
    exactness: bool = False  # compare each setup's first-step gradients and losses with a DDP launch's


def resolve_defaults(opts: Options, gpus: int) -> Options:
    """GPU: the 1.35B model at sequence 1024 on every GPU; CPU: a tiny model, so CI tests the harness."""
    on_gpu = gpus > 0
    opts.nproc = opts.nproc or (gpus * opts.ranks_per_gpu if on_gpu else 2)
    opts.model = opts.model or ("1.35b" if on_gpu else "tiny")
    opts.seq = opts.seq or (1024 if on_gpu else 64)
    opts.steps = opts.steps or (20 if on_gpu else 6)
    opts.warmup = opts.warmup if opts.warmup is not None else (5 if on_gpu else 2)
    problems = []
    if opts.nproc < 1:
        problems.append(f"--nproc must be at least 1, got {opts.nproc}")
    if opts.ranks_per_gpu < 1:
        problems.append(f"--ranks-per-gpu must be at least 1, got {opts.ranks_per_gpu}")
    elif on_gpu and opts.nproc > gpus * opts.ranks_per_gpu:
        problems.append(f"--nproc {opts.nproc} but this machine has {gpus} GPU(s)"
                        + (f" for {opts.ranks_per_gpu} rank(s) each" if opts.ranks_per_gpu > 1 else
                           "; --ranks-per-gpu 2 runs two ranks on each over gloo"))
    if opts.repeat < 1:
        problems.append(f"--repeat must be at least 1, got {opts.repeat}")
    if opts.warmup < 0 or opts.steps - opts.warmup < 1:
        problems.append(f"--steps {opts.steps} with --warmup {opts.warmup} leaves no timed step; "
                        "use more steps than warm-up steps (at least 3 more for a stable median)")
    if opts.seq < 1:
        problems.append(f"--seq must be positive, got {opts.seq}")
    if problems:
        raise ConfigError(problems)
    return opts


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def command_line(opts: Options) -> str:
    """The command that repeats this sweep, with every default spelled out."""
    parts = ["python", "-m", "benchmarks.harness", "--out", opts.out, "--nproc", str(opts.nproc), "--model", opts.model,
             "--seq", str(opts.seq), "--steps", str(opts.steps), "--warmup", str(opts.warmup)]
    if opts.setups is not None:
        parts += ["--setups", ",".join(opts.setups)]
    for spec in opts.variants:
        parts += ["--variant", spec]
    if opts.profile_steps:
        parts += ["--profile-steps", str(opts.profile_steps)]
    if opts.memory_snapshot:
        parts.append("--memory-snapshot")
    if opts.host_peaks:
        parts.append("--host-peaks")
    if opts.save_all:
        parts.append("--save-all")
    if opts.repeat > 1:
        parts += ["--repeat", str(opts.repeat)]
    if opts.ranks_per_gpu > 1:
        parts += ["--ranks-per-gpu", str(opts.ranks_per_gpu)]
    if opts.exactness:
        parts.append("--exactness")
    return shlex.join(parts)


def child_env(setup, on_gpu: bool, nproc: int) -> tuple[dict, dict]:
    """The workers' environment, and what the harness changed in it (recorded with the results)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACCELERATE_", "MASTER_")) and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    changed = {}
    package_root = str(Path(__file__).resolve().parents[2])  # the workers import this very hf_zero
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    for key, value in {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        env.setdefault(key, value)
    if "OMP_NUM_THREADS" not in env:
        # CPU ranks on few cores oversubscribe; on GPUs torchrun would pick 1, which starves the offload
        # setups' CPU Adam, so each rank gets its share of the cores instead
        threads = max(1, (os.cpu_count() or 1) // nproc) if on_gpu else 1
        changed["OMP_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
    arch = env.get("TORCH_CUDA_ARCH_LIST")
    if arch and re.search(r"\d\.\d+[a-zA-Z]", arch):
        # "9.0a" (the H200 image's default) crashes DeepSpeed's op builder: int('0a')
        changed["TORCH_CUDA_ARCH_LIST"] = env["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(\d\.\d+)[a-zA-Z]+", r"\1", arch)
    env.update(setup.env)
    changed.update(setup.env)
    return env, changed


def _error_line(log: str) -> str:
    """The most telling line of a failed worker's log: its last exception, not torchrun's wrapper."""
    found = [m.group(1).strip() for m in re.finditer(r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception)\b:?.*)$",
                                                     log, re.MULTILINE)
             if "ChildFailedError" not in m.group(1) and not m.group(1).lstrip().startswith("raise ")]
    if found:
        return found[-1][:500]
    lines = [ln for ln in log.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else "no output"


def failure(log: str, code: int | None, timeout: float) -> dict:
    """Status, error line and log tail of a launch that wrote no result (``code`` None: it was killed at ``timeout``)."""
    oom = "OutOfMemoryError" in log or "CUDA out of memory" in log
    row = {"status": "timeout" if code is None else ("oom" if oom else "failed"),
           "error": (f"no result after {timeout:g} s (--setup-timeout)" if code is None
                     else _error_line(log) if code != 0 else "the workers exited 0 but wrote no result"),
           "log_tail": log.splitlines()[-30:]}
    # the steps the worker finished before it stopped (its progress lines): how far a slow setup got
    finished = [float(s) for s in re.findall(r"^bench: step \d+/\d+: ([\d.]+) s$", log, re.MULTILINE)]
    if finished:
        row["finished_step_times"] = finished
    return row


def saves(setup, opts: Options) -> bool:
    """Whether a setup's model is saved and checked against the engine's weights: ZeRO-3 (where the 16-bit gather
    can go wrong) or every setup with --save-all; never a LoRA adapter (hf_zero.lora saves those)."""
    return (opts.save_all or setup.stage == 3) and not setup.lora


def launch(setup, opts: Options, model: tuple, out: Path, on_gpu: bool) -> dict:
    """Run one setup under torchrun and return its row (status ok / failed / oom / timeout)."""
    work = out / "work" / setup.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (out / "logs").mkdir(exist_ok=True)
    log_path = out / "logs" / f"{setup.name}.log"
    spec = {"setup": setup.as_dict(), "model": {"name": model[0], "config": model[1]}, "seq": opts.seq,
            "steps": opts.steps, "warmup": opts.warmup, "save": saves(setup, opts), "keep_saved": opts.keep_saved,
            "workdir": str(work), "result": str(work / "result.json"), "profile_steps": opts.profile_steps,
            "memory_snapshot": opts.memory_snapshot, "host_peaks": opts.host_peaks,
            "trace": str((out / "traces" / f"{setup.name}.json.gz").resolve()),
            "python_trace": str((out / "traces" / f"{setup.name}.python.json.gz").resolve())}
    if opts.profile_steps:
        (out / "traces").mkdir(exist_ok=True)
    spec["ranks_per_gpu"] = opts.ranks_per_gpu
    if opts.exactness:
        spec["exactness"] = exactness_spec(setup, out)
    (work / "spec.json").write_text(json.dumps(spec, indent=1))
    env, changed = child_env(setup, on_gpu, opts.nproc)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(opts.nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           *(f"--{option}={value}" for option, value in setup.torchrun.items()),
           "-m", "benchmarks.harness.worker", "--spec", str(work / "spec.json")]
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        # its own session, so a hung launch is ended with all its ranks and nothing else
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=_term_with_parent)
        try:
            code = proc.wait(timeout=opts.setup_timeout)
        except subprocess.TimeoutExpired:
            code = None
        except BaseException:  # Ctrl-C, or SIGTERM from a time limit (see _exit_on_sigterm): no orphaned ranks
            _kill(proc)
            raise
        if code is None:
            _kill(proc)
    row = {"name": setup.name, "base": setup.base, "kind": setup.kind, "micro_batch": setup.micro_batch,
           "gradient_checkpointing": setup.gradient_checkpointing, "wall_s": round(time.perf_counter() - start, 1),
           "log": str(log_path.relative_to(out)), "env_changed": changed, "setup": setup.as_dict(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    result_file = work / "result.json"
    if code is not None and result_file.exists():
        row.update(json.loads(result_file.read_text()))
        if code != 0:  # measured and written by rank 0; a rank then died at exit: keep the numbers, say so
            row["exit_warning"] = f"the workers exited {code} after rank 0 wrote the result (see the log)"
    else:
        row.update(failure(log_path.read_text(errors="replace"), code, opts.setup_timeout))
    if not opts.keep_saved:
        shutil.rmtree(work, ignore_errors=True)
    return row


def exactness_spec(setup, out: Path) -> dict:
    """Where the setup's DDP references lie, and whether this launch writes one (the sweep's first DDP launch of its
    kind of model) or compares with them: gradients with the DDP row of the same arithmetic where the sweep has one
    (DeepSpeed's bf16 mode against a DDP row with bf16 weights), losses with DDP's fp32 weights under autocast (the
    fp32 master weights DeepSpeed keeps)."""
    from .exactness import gradient_reference_key, reference_key

    folder = out / "exactness"
    folder.mkdir(exist_ok=True)
    # losses: always the reference of the setup's own kind (a DeepSpeed setup's is fp32 DDP; a second bf16 DDP row
    # measures noise against the first, not the bf16 drift against fp32)
    losses_key = reference_key(setup.as_dict())
    role = "reference" if setup.kind == "ddp" and not (folder / f"{losses_key}.safetensors").exists() else "compared"
    if role == "reference":
        (folder / f"{losses_key}.setup").write_text(setup.name)
        grads_key = losses_key
    else:
        grads_key = gradient_reference_key(setup.as_dict(), available=lambda key: (folder / f"{key}.safetensors").exists())

    def setup_name(key):
        return setup.name if role == "reference" else ((folder / f"{key}.setup").read_text()
                                                      if (folder / f"{key}.setup").exists() else None)

    return {"role": role, "gradients": str(folder / f"{grads_key}.safetensors"),
            "losses": str(folder / f"{losses_key}.losses.json"),
            "reference_setup": setup_name(grads_key), "loss_reference_setup": setup_name(losses_key)}


def _term_with_parent() -> None:
    """In the launcher: SIGTERM when this process dies, even by SIGKILL (a runner's time limit), so torchrun
    stops its ranks instead of leaving them on the GPUs (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the SIGTERM handler and the timeout still apply
        pass


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _kill(proc) -> None:
    """Stop a launch and every rank it started (they share its session's process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # torchrun passes it on to its ranks
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # any rank that outlived its launcher, or a launcher that hangs
    except ProcessLookupError:
        pass
    proc.wait()


def planner_row(setup, shape: ModelShape, opts: Options, row: dict) -> dict:
    """The planner's per-GPU peak for this setup, next to the measured one in ``row`` (GPU runs only: CPU RSS
    is not comparable)."""
    measured = row.get("memory")
    name = setup.planner_setup
    if name is None:
        return {"setup": None, "note": setup.planner_gap}
    launch = RunShape(gpus_per_node=opts.nproc, seq=opts.seq, micro_batch=setup.micro_batch,
                      gradient_checkpointing=setup.gradient_checkpointing, dtype="bf16",
                      compiled=bool(setup.args.get("torch_compile")),
                      accumulation=int(setup.args.get("gradient_accumulation_steps", 1)),
                      long_context=tuple(part for part, on in setup.long_context.items() if on))
    # what the config's keys set, as hf-zero plan --config reads them; an "auto" bucket is what the Trainer fills
    run = replace(run_of_config(launch, setup.deepspeed or {}), bucket=reduce_bucket(setup, shape.hidden))
    if setup.lora:
        run.lora_r, run.lora_targets = setup.lora.get("r", 8), setup.lora_targets(shape.model_type)  # peft's default r is 8
        # the dtype the engine trained the adapter in; rows measured before the bench recorded it (and before
        # ZeroCallback cast adapters to 16 bits) trained them in fp32 under ZeRO-3
        run.fp32_adapters = "torch.float32" in row.get("adapter_dtypes", ["torch.float32"])
    predicted = estimate(name, shape, run).gpu_total / GIB
    planned = {"setup": name, "predicted_gib": predicted, "bucket": run.bucket}
    if measured and measured.get("kind") == "cuda":
        error = predicted / measured["peak_gib"] - 1  # the plan's error, relative to what was measured
        planned.update(measured_gib=measured["peak_gib"], error=error,
                       within_tolerance=abs(error) <= PLANNER_TOLERANCE)
    else:
        planned["note"] = "measured on CPU as peak RSS (libraries included): not comparable with the plan"
    return planned


def replan(data: dict) -> int:
    """Recompute, in place, every row's planner prediction with the installed planner (after it was
    recalibrated on new measurements), and note when; returns the number of rows."""
    fingerprint = data["fingerprint"]
    opts = Options(nproc=fingerprint["nproc"], seq=fingerprint["seq"])
    rows = [row for row in data["results"] if "setup" in row]
    return replan_rows(data, rows, lambda row: opts)


def replan_rows(data: dict, rows: list, options_of) -> int:
    """``rows``' planner column recomputed, each with ``options_of(row)`` (its ranks and seq); ``data`` notes when."""
    model = data["model"]
    shape = ModelShape.from_config(build_config(model["config"]), name=model["name"])
    known = {f.name for f in fields(Setup)}
    for row in rows:  # rows from older versions lack newer Setup fields: their defaults apply
        setup = Setup(**{k: v for k, v in row["setup"].items() if k in known})
        row["planner"] = planner_row(setup, shape, options_of(row), row)
    data["replanned"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return len(rows)


def write_results(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def _fingerprint(opts: Options, model: tuple, device: str) -> dict:
    return {"model": model[0], "model_config": model[1], "nproc": opts.nproc, "seq": opts.seq,
            "steps": opts.steps, "warmup": opts.warmup, "device": device}


def _load_existing(path: Path, fingerprint: dict, fresh: bool) -> dict | None:
    if fresh or not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} exists but is not readable JSON ({e}); pass --fresh to start over") from None
    if data.get("fingerprint") != fingerprint:
        theirs = {k: v for k, v in (data.get("fingerprint") or {}).items() if k != "model_config"}
        raise ConfigError(f"{path} holds results of another run ({theirs}); use another --out, the same "
                          "--model/--nproc/--seq/--steps/--warmup, or --fresh to replace them")
    return data


def _check_configs(setups, on_gpu: bool, nproc: int, seq: int, out: Path) -> None:
    """Every DeepSpeed config through hf_zero's checker, and every variable-length setup against --seq, before
    any GPU minute is spent: all problems at once. An NVMe block without a folder is checked with the one the
    worker gives it, on the disk of ``out`` (worker.nvme_folder)."""
    from hf_zero.config.presets import load_config
    from hf_zero.config.validate import check_config

    problems = []
    for setup in setups:
        if setup.data.get("min_seq", 0) > seq:
            problems.append(f"{setup.name}: data.min_seq={setup.data['min_seq']} is longer than --seq {seq}")
        if setup.deepspeed is None:
            continue
        try:
            check_config(load_config(setup.deepspeed, nvme_path=out), on_cpu=not on_gpu, world_size=nproc)
        except ConfigError as e:
            problems += [f"{setup.name}: {p}" for p in e.problems]
    if problems:
        raise ConfigError(problems)


def exactness_order(setups: list, opts: Options) -> list:
    """The DDP setups first (the first of each kind of model is the reference), all on the same micro-batches."""
    sizes = {s.micro_batch for s in setups}
    if len(sizes) > 1:
        raise ConfigError(f"--exactness compares setups on the same data, but their micro batches differ "
                          f"({', '.join(f'{s.name}: {s.micro_batch}' for s in setups)}); give the others mbs=N "
                          "in a --variant (e.g. --variant zero3_gc=zero3+gc:mbs=4)")
    if opts.resume or opts.repeat > 1:
        raise ConfigError("--exactness compares one launch of each setup with the sweep's own DDP launch: "
                          "leave out --resume and --repeat")
    if not any(s.kind == "ddp" for s in setups):
        raise ConfigError("--exactness needs a DDP setup to compare with: add ddp to --setups")
    return sorted(setups, key=lambda s: s.kind != "ddp")


def _print(message: str) -> None:
    print(message, flush=True)  # a sweep cut short by a time limit still shows how far it got


def run_bench(opts: Options, progress=_print) -> int:
    """The sweep. 0 when every setup that ran measured; 1 when any failed (the results are written anyway)."""
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so the running setup's ranks are stopped with us
    try:
        return _sweep(opts, progress)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sweep(opts: Options, progress) -> int:
    gpus = gpu_count()
    on_gpu = gpus > 0
    opts = resolve_defaults(opts, gpus)
    setups = select(opts.setups, opts.variants, opts.nproc)
    out = Path(opts.out)
    if opts.exactness:
        setups = exactness_order(setups, opts)
        shutil.rmtree(out / "exactness", ignore_errors=True)  # a reference of this sweep only
    if opts.ranks_per_gpu > 1 and on_gpu and any(s.kind == "fsdp" for s in setups):
        raise ConfigError("FSDP cannot run with --ranks-per-gpu: its reduce-scatter needs NCCL, which refuses two "
                          "ranks on one GPU; leave the FSDP setups out of this sweep")
    out.mkdir(parents=True, exist_ok=True)
    _check_configs(setups, on_gpu, opts.nproc, opts.seq, out)
    model = resolve_model(opts.model)
    config = build_config(model[1])
    shape = ModelShape.from_config(config, name=model[0])
    tied = bool(getattr(config, "tie_word_embeddings", False))
    flops = flops_per_token(shape, opts.seq, tied)
    path = out / "results.json"
    fingerprint = _fingerprint(opts, model, "cuda" if on_gpu else "cpu")
    data = _load_existing(path, fingerprint, opts.fresh) or {
        "schema": SCHEMA, "fingerprint": fingerprint, "runs": [], "results": [],
        "model": {"name": model[0], "config": model[1], "params": shape.params, "tied_embeddings": tied,
                  "flops_per_token": flops,
                  "flops_note": "6*N + 12*L*h*seq per token, N = matmul parameters (input embedding excluded); "
                                "gradient-checkpointing recompute not counted (model FLOP/s)"},
    }
    data["runs"].append({"command": command_line(opts), "argv": sys.argv, "versions": versions(),
                         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                         "host": platform.node(), "setups": [s.name for s in setups]})
    data["versions"] = data["runs"][-1]["versions"]
    rows = {r["name"]: r for r in data["results"]}

    from .report import write_reports

    started, failed = time.perf_counter(), 0
    progress(f"bench: {len(setups)} setup(s), {model[0]} ({params_text(shape.params)} params), "
             f"{opts.nproc} process(es) on {'GPU' if on_gpu else 'CPU'}, seq {opts.seq}, {opts.steps} steps "
             f"({opts.warmup} warm-up) -> {out}")
    schedule = [(r, k, setup) for r in range(1, opts.repeat + 1) for k, setup in enumerate(setups, 1)]
    launched_here = dict.fromkeys((s.name for s in setups), 0)
    for r, k, setup in schedule:
        head = f"[{k}/{len(setups)}]" + (f" round {r}/{opts.repeat}" if opts.repeat > 1 else "") + f" {setup.name}"
        # repeats merge within one sweep (or the sweep --resume continues), never with an older sweep's row
        done = measured_launches(rows.get(setup.name)) if opts.resume or launched_here[setup.name] else 0
        if opts.resume and done >= r:
            progress(f"{head}: already measured, skipped (--resume)")
            continue
        if opts.max_minutes is not None and time.perf_counter() - started > 60 * opts.max_minutes:
            progress(f"{head}: not started, --max-minutes {opts.max_minutes:g} reached; rerun with --resume to continue")
            continue
        if setup.kind == "fsdp" and not on_gpu:
            if r > 1:
                continue
            row = {"name": setup.name, "base": setup.base, "kind": setup.kind, "micro_batch": setup.micro_batch,
                   "gradient_checkpointing": setup.gradient_checkpointing, "status": "skipped", "setup": setup.as_dict(),
                   "error": "FSDP needs GPUs: on CPU (use_cpu=True) the Trainer silently trains fsdp=... with plain DDP"}
        else:
            row = launch(setup, opts, model, out, on_gpu)
            launched_here[setup.name] += 1
        if row["status"] == "ok":
            data["device"] = row["device"]
        if done and row["status"] == "ok":
            row = merge_repeat(rows[setup.name], row)
        elif done:  # a failed repeat keeps the measured row and says so
            row = {**rows[setup.name], "repeat_failures": rows[setup.name].get("repeat_failures", []) + [row.get("error")]}
        if row["status"] == "ok":
            # variable-length rows: attention counted at the mean sample length the worker saw
            row_seq = round(row.get("data", {}).get("mean_sample_tokens", opts.seq))
            row_flops = flops_per_token(shape, row_seq, tied, frozen_base=bool(setup.lora))
            row["tflops_per_gpu"] = row_flops * row["tokens_per_s"] / opts.nproc / 1e12
        row["planner"] = planner_row(setup, shape, opts, row)
        rows[setup.name] = row
        data["results"] = list(rows.values())
        write_results(path, data)
        written = write_reports(data, out)
        failed += row["status"] not in ("ok", "skipped") or bool(row.get("repeat_failures"))
        progress(f"{head}: {_summary(row)}")
    write_results(path, data)
    written = write_reports(data, out)
    missing = "" if len(written) >= 2 else " (no bench.png: matplotlib is not installed; re-render with --report)"
    progress(f"wrote {', '.join(map(str, [path, *written]))}{missing}")
    return 1 if failed else 0


def _launch_speeds(row: dict) -> list:
    """tokens/s of each launch a measured row holds."""
    return row.get("repeat_tokens_per_s") or [row["tokens_per_s"]]


def measured_launches(row: dict | None) -> int:
    """How many launches a results row already holds (0: none that measured)."""
    if not row or row.get("status") != "ok":
        return 0
    return len(_launch_speeds(row))


def merge_repeat(previous: dict, new: dict) -> dict:
    """One row for all launches of a setup: tokens/s is the median over launches, the spread is kept, and
    memory is the highest peak seen. The other fields are the newest launch's."""
    import statistics

    speeds = _launch_speeds(previous) + [new["tokens_per_s"]]
    row = dict(new)
    row["repeat_tokens_per_s"] = speeds
    row["tokens_per_s"] = statistics.median(speeds)
    row["tokens_per_s_spread"] = (max(speeds) - min(speeds)) / row["tokens_per_s"]
    if previous["memory"]["peak_gib"] > new["memory"]["peak_gib"]:
        row["memory"] = previous["memory"]
    return row


def _summary(row: dict) -> str:
    if row["status"] == "ok":
        mem = row["memory"]
        what = "peak alloc {:.2f} GiB/GPU" if mem["kind"] == "cuda" else "peak RSS {:.2f} GiB/rank"
        save = row.get("save")
        saved = f", save {save['seconds']:.1f} s, reload {'equal' if save['reload_equal'] else 'DIFFERS'}" if save else ""
        repeats = row.get("repeat_tokens_per_s") or []
        spread = (f" (median of {len(repeats)}: {', '.join(f'{v:,.0f}' for v in repeats)})" if len(repeats) > 1 else "")
        return (f"{row['tokens_per_s']:,.0f} tokens/s{spread}, {what.format(mem['peak_gib'])}{saved} "
                f"({row['wall_s']:.0f} s)")
    where = f" (log: {row['log']})" if row.get("log") else ""
    return f"{row['status'].upper()}: {row['error']}{where}"
