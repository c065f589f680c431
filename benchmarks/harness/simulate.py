"""Rank 0's memory of an N-GPU run, measured on one GPU: ``python -m benchmarks.harness --simulate-ranks 2,4,8``.

Each DeepSpeed setup runs in one process as rank 0 of N over torch's fake process group: collectives
return at once and move nothing, so DeepSpeed partitions, allocates and frees what rank 0 of N GPUs
would, and the peak is rank 0's own (DDP and FSDP wait on results the fake group never gives). On one H200 it reproduced the peaks measured on two (zero2 20.20,
zero3 23.22, zero3+gc 16.87 GiB) to the hundredth. It cannot measure speed (nothing is communicated),
NCCL's own buffers, or the weights' values (the other ranks' shards are never received), so no save is
checked. Every step's allocations are recorded on the last step: the peak comes with what holds it.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from hf_zero.distributed import free_port, gpu_count
from hf_zero.errors import ConfigError
from hf_zero.planner import GIB, ModelShape
from hf_zero.model_configs import build_config, resolve_model
from .peak_memory import BEFORE
from .run import (Options, child_env, command_line, failure, planner_row, replan_rows, resolve_defaults,
                  versions, write_results)
from .setups import default_names, named_setups, select

STEPS = 6  # ZeRO-3 completes its parameter trace in the first step; the prefetching steps after it are what peaks
SCHEMA = 1


def _rank0_share(model) -> float | None:
    """Share of the ZeRO-3 parameters rank 0 holds: 1/N when DeepSpeed partitioned for the simulated N."""
    params = [p for p in model.parameters() if hasattr(p, "ds_numel")]
    if not params:
        return None
    return sum(p.ds_tensor.ds_numel for p in params) / sum(p.ds_numel for p in params)


def worker(spec: dict) -> dict:
    """In the child: train ``spec["steps"]`` steps as rank 0 of ``spec["ranks"]`` and return the measurements."""
    import torch
    import torch.distributed as dist
    # importing it registers the "fake" backend (torch's own, used by its tests to trace large meshes)
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import Trainer

    import hf_zero
    from . import worker as bench_worker
    from .peak_memory import PeakMemoryRecorder

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=spec["ranks"])
    setup = spec["setup"]
    if setup["kind"] == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="fake")  # DeepSpeed's comm wraps the group torch already has
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
    bench_worker.apply_dynamo_settings(setup)
    args = bench_worker.build_args(spec, setup)
    model = bench_worker.with_lora(bench_worker.build_model(spec, setup), setup)
    data = bench_worker.RandomTokens(model.config.vocab_size, spec["seq"], spec["steps"] * setup["micro_batch"] * spec["ranks"])
    trainer = Trainer(model=model, args=args, train_dataset=data)
    if setup["kind"] == "deepspeed":
        hf_zero.attach(trainer, log_memory=False, **setup.get("callback", {}))
    timer = bench_worker.StepTimer()  # resets the peak once the model and engine are built
    recorder = PeakMemoryRecorder(step=spec["steps"] - 1)
    trainer.add_callback(timer)
    trainer.add_callback(recorder)
    trainer.train()
    memory = bench_worker._memory()
    result = {"status": "ok", "world_size": args.world_size, "engine": type(trainer.model_wrapped).__name__,
              "rank0_share": _rank0_share(trainer.model),
              "memory": {"kind": "cuda" if "alloc_gib" in memory else "rss",
                         "peak_gib": memory.get("alloc_gib", memory.get("rss_gib")),
                         "peak_reserved_gib": memory.get("reserved_gib")},
              "memory_breakdown": recorder.summary}
    if setup.get("lora"):
        result["adapter_dtypes"] = bench_worker.adapter_dtypes(trainer.model)
    hf_zero.shutdown()
    return result


def _launch(setup, ranks: int, opts: Options, model: tuple, out: Path, on_gpu: bool) -> dict:
    """One setup as rank 0 of ``ranks``, in its own process (DeepSpeed keeps global state)."""
    work = out / "work" / f"{setup.name}-{ranks}"
    work.mkdir(parents=True, exist_ok=True)
    spec = {"setup": setup.as_dict(), "model": {"name": model[0], "config": model[1]}, "seq": opts.seq,
            "steps": opts.steps, "warmup": 0, "ranks": ranks, "save": False, "workdir": str(work)}
    (work / "spec.json").write_text(json.dumps(spec, indent=1))
    env, changed = child_env(setup, on_gpu, 1)  # one process: it gets every core
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    log_path = out / "logs" / f"{setup.name}-{ranks}.log"
    cmd = [sys.executable, "-m", "benchmarks.harness.simulate", "--spec", str(work / "spec.json")]
    start = time.perf_counter()
    row = {"name": setup.name, "ranks": ranks, "micro_batch": setup.micro_batch,
           "gradient_checkpointing": setup.gradient_checkpointing, "env_changed": changed, "setup": setup.as_dict()}
    with open(log_path, "w") as log:
        try:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=opts.setup_timeout).returncode
        except subprocess.TimeoutExpired:
            code = None
    row["wall_s"] = round(time.perf_counter() - start, 1)
    result = work / "result.json"
    if code == 0 and result.exists():
        row.update(json.loads(result.read_text()))
    else:
        row.update(failure(log_path.read_text(errors="replace"), code, opts.setup_timeout))
    return row


def _check(opts: Options, ranks: list, runs: list) -> None:
    problems = [f"--simulate-ranks takes rank counts of 2 or more, got {n}" for n in ranks if n < 2]
    # DDP's reducer and FSDP wait on the fake group's futures, which carry no result (an internal assert)
    others = sorted({s.name for _, s in runs if s.kind != "deepspeed"})
    if others:
        problems.append(f"--simulate-ranks measures DeepSpeed setups only, not {', '.join(others)}: DDP and FSDP "
                        "cannot run over torch's fake process group; pass --setups with DeepSpeed setups")
    variable = sorted({s.name for _, s in runs if s.data})
    if variable:
        problems.append(f"--simulate-ranks runs full-length batches; {', '.join(variable)} sets data.* keys "
                        "(variable-length batches): measure those with a real sweep")
    for flag, used in (("--repeat", opts.repeat > 1), ("--profile-steps", opts.profile_steps),
                       ("--resume", opts.resume), ("--max-minutes", opts.max_minutes)):
        if used:
            problems.append(f"{flag} does not apply to --simulate-ranks, which measures memory only; leave it out")
    if problems:
        raise ConfigError(problems)


def planned_runs(opts: Options, ranks: list) -> list:
    """(N, setup) for every rank count and setup, checked; no setups named: the default sweep's DeepSpeed ones."""
    if opts.setups is None and not opts.variants:
        known = named_setups()
        opts.setups = [name for name in default_names(2) if known[name].kind == "deepspeed"]
    runs = [(n, s) for n in ranks for s in select(opts.setups, opts.variants, n)]
    _check(opts, ranks, runs)
    return runs


def simulate(opts: Options, ranks: list, progress=print) -> int:
    """Every setup at every rank count; OUT/simulated.json, .md and .png. 0 when all measured, else 1."""
    gpus = gpu_count()
    opts.nproc, opts.steps, opts.warmup = 1, opts.steps or STEPS, 0
    opts = resolve_defaults(opts, gpus)
    model = resolve_model(opts.model)
    shape = ModelShape.from_config(build_config(model[1]), name=model[0])
    out = Path(opts.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    runs = planned_runs(opts, ranks)
    progress(f"python -m benchmarks.harness --simulate-ranks: {len(runs)} run(s), {model[0]}, each as rank 0 of N on "
             f"{'one GPU' if gpus else 'the CPU'}, {opts.steps} steps -> {out}")
    data = {"schema": SCHEMA, "model": {"name": model[0], "config": model[1], "params": shape.params},
            "seq": opts.seq, "steps": opts.steps, "versions": versions(),
            "command": command_line(opts).replace("--nproc 1", "--simulate-ranks " + ",".join(map(str, ranks))),
            "results": []}
    for i, (n, setup) in enumerate(runs, 1):
        row = _launch(setup, n, opts, model, out, gpus > 0)
        if row["status"] == "ok":
            row["planner"] = planner_row(setup, shape, Options(nproc=n, seq=opts.seq), row)
        data["results"].append(row)
        write_results(out / "simulated.json", data)
        progress(f"[{i}/{len(runs)}] {setup.name} as rank 0 of {n}: " + (
            f"peak {row['memory']['peak_gib']:.2f} GiB" if row["status"] == "ok" else f"{row['status']}: {row['error']}"))
    write_reports(data, out)
    progress(f"wrote {out / 'simulated.json'}, simulated.md, simulated.png")
    return 0 if all(r["status"] == "ok" for r in data["results"]) else 1


def replan(data: dict) -> int:
    """Recompute every measured row's planner prediction with the installed planner; returns the count."""
    rows = [row for row in data["results"] if row["status"] == "ok"]
    return replan_rows(data, rows, lambda row: Options(nproc=row["ranks"], seq=data["seq"]))


def write_reports(data: dict, out: Path) -> list:
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulated.md").write_text(render(data))
    plot(data, out / "simulated.png")
    return [out / "simulated.md", out / "simulated.png"]


def _largest(row: dict, top: int = 4) -> str:
    rows = [r for r in (row.get("memory_breakdown") or {}).get("rows") or [] if r["bytes"] >= GIB / 100]
    return "; ".join(f"{r['bytes'] / GIB:.2f} {'before the step' if r['owner'] == BEFORE else '`' + r['owner'] + '`'}"
                     for r in rows[:top])


def render(data: dict) -> str:
    lines = [f"# Rank 0's memory as N grows: {data['model']['name']} ({data['model']['params'] / 1e9:.2f}B), "
             f"sequence {data['seq']}", "",
             "Each row ran on one device as rank 0 of N over torch's fake process group (nothing communicated): "
             "the allocations are rank 0's own, speed is not measured. `" + data["command"] + "`"
             + (f" (planner column recomputed {data['replanned']})" if data.get("replanned") else ""), "",
             "| setup | N | mbs | peak GiB | planner GiB (err) | largest at the peak (GiB) | status |",
             "|---|---|---|---|---|---|---|"]
    for row in data["results"]:
        if row["status"] != "ok":
            lines.append(f"| {row['name']} | {row['ranks']} | {row['micro_batch']} | | | {row['error']} | {row['status']} |")
            continue
        plan = row.get("planner") or {}
        planned = (f"{plan['predicted_gib']:.1f} ({plan['error']:+.0%})" if "error" in plan
                   else f"{plan['predicted_gib']:.1f}" if "predicted_gib" in plan else "")
        lines.append(f"| {row['name']} | {row['ranks']} | {row['micro_batch']} | {row['memory']['peak_gib']:.2f} | "
                     f"{planned} | {_largest(row)} | ok |")
    return "\n".join(lines) + "\n"


def plot(data: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    by_setup = {}
    for row in data["results"]:
        if row["status"] == "ok":
            by_setup.setdefault(row["name"], []).append(row)
    for name, rows in by_setup.items():
        rows.sort(key=lambda r: r["ranks"])
        line, = ax.plot([r["ranks"] for r in rows], [r["memory"]["peak_gib"] for r in rows], marker="o", label=name)
        planned = [(r["ranks"], r["planner"]["predicted_gib"]) for r in rows if "predicted_gib" in (r.get("planner") or {})]
        if planned:
            ax.plot(*zip(*planned), linestyle="--", color=line.get_color(), alpha=0.6)
    gpu = any(r["memory"]["kind"] == "cuda" for rows in by_setup.values() for r in rows)
    ranks = sorted({r["ranks"] for rows in by_setup.values() for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.minorticks_off()
    ax.set_xlabel("data-parallel ranks N")
    ax.set_ylabel("rank 0's peak allocated GiB" if gpu else "rank 0's peak RSS GiB (CPU)")
    ax.set_title(f"{data['model']['name']}: measured (solid) and planned (dashed) memory per GPU")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if by_setup:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="one setup as rank 0 of N (run by python -m benchmarks.harness --simulate-ranks)")
    p.add_argument("--spec", required=True)
    spec_path = Path(p.parse_args(argv).spec)
    result = worker(json.loads(spec_path.read_text()))
    (spec_path.parent / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
