"""``python -m benchmarks.harness``: DDP, FSDP, HF "auto" DeepSpeed configs and the hf_zero presets, side by side."""

import argparse
import json
import sys
from pathlib import Path

from hf_zero.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    from .setups import GROUPS

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.harness",
        description="Run each setup in its own torchrun launch and write OUT/results.json, results.md and "
                    "bench.png. On GPUs: a Llama-like 1.35B model, seq 1024, bf16; without a GPU: a tiny model, "
                    "so CI tests the harness. Results merge into an existing OUT/results.json of the same model, "
                    "nproc, seq and steps.")
    p.add_argument("--out", help="output folder (default: bench_out; with --report: the JSON's folder)")
    p.add_argument("--setups", type=lambda s: [x for x in s.split(",") if x],
                   help=f"comma-separated setup names or groups ({', '.join(GROUPS)}); default: all for this nproc "
                        "(none when --variant is given); --list shows them")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=BASE:key=value,...",
                   help="an extra setup, e.g. z3b=zero3:zero_optimization.reduce_bucket_size=1e9,"
                        "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; keys: mbs, gc, env.VAR, args.FIELD, "
                        "torchrun.OPTION (e.g. torchrun.numa-binding=node), dotted DeepSpeed keys (value null removes "
                        "the key). Repeatable.")
    p.add_argument("--nproc", type=int, help="processes (GPUs) per setup; default: all GPUs, or 2 on CPU")
    p.add_argument("--model", help="1.35b, 8b, tiny, or a config.json (default: 1.35b on GPU, tiny on CPU)")
    p.add_argument("--steps", type=int, help="optimizer steps per setup (default: 20 on GPU, 6 on CPU)")
    p.add_argument("--warmup", type=int, help="steps left out of the median (default: 5 on GPU, 2 on CPU)")
    p.add_argument("--seq", type=int, help="sequence length (default: 1024 on GPU, 64 on CPU)")
    p.add_argument("--resume", action="store_true", help="skip setups OUT/results.json already holds as ok")
    p.add_argument("--fresh", action="store_true", help="discard an existing OUT/results.json instead of merging")
    p.add_argument("--max-minutes", type=float, help="start no new setup after this many minutes (then --resume)")
    p.add_argument("--setup-timeout", type=float, default=900.0, help="seconds before a setup is killed (default 900)")
    p.add_argument("--save-all", action="store_true",
                   help="save every setup's model and check it reloads equal (default: ZeRO-3 setups only)")
    p.add_argument("--keep-saved", action="store_true", help="keep each setup's work folder and saved model")
    p.add_argument("--profile-steps", type=int, default=0, metavar="N",
                   help="after the timed steps, profile N more (torch.profiler with Python tracing): compute, "
                        "communication, exposed communication, idle GPU and hook time per step in results.md; "
                        "rank 0's trace in OUT/traces/ (open in Perfetto)")
    p.add_argument("--memory-snapshot", action="store_true",
                   help="record one more step's CUDA allocator history (rank 0): results.md lists what is alive at "
                        "the step's memory peak, grouped by the code that allocated it")
    p.add_argument("--host-peaks", action="store_true",
                   help="sample rank 0's resident host memory from launch to the end of the save: results.md "
                        "lists the code that raised its high-water mark, and by how much (offload's peak is on the host)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="launch every setup N times, round by round (A B C A B C), and report the median tokens/s "
                        "with every launch's value: between-sweep drift then hits all setups alike")
    p.add_argument("--simulate-ranks", type=_rank_counts, metavar="N,N,...",
                   help="measure rank 0's memory of an N-GPU run on one GPU, for each N (e.g. 2,4,8): each setup "
                        "runs as rank 0 of N over torch's fake process group, nothing is communicated, so speed is "
                        "not measured; writes OUT/simulated.json, .md and .png with the planner's predictions")
    p.add_argument("--ranks-per-gpu", type=int, default=1, metavar="N",
                   help="run N ranks on each GPU over gloo (NCCL refuses two ranks on one device): several-rank "
                        "behaviour on one GPU; its speed is gloo's, not a multi-GPU run's")
    p.add_argument("--exactness", action="store_true",
                   help="compare each setup with a DDP launch on the same data: every parameter's first-step "
                        "gradient and the loss of every step; results.md says which setups train as DDP does "
                        "(needs a ddp setup and equal micro batches; a second DDP row measures the noise)")
    p.add_argument("--list", action="store_true", help="print the setups that would run, with their configs, and exit")
    p.add_argument("--report", metavar="RESULTS_JSON", help="only re-render results.md and bench.png from a results.json "
                                                          "(or simulated.md and .png from a simulated.json)")
    p.add_argument("--replan", action="store_true",
                   help="with --report: first recompute the planner's predictions with this hf_zero's planner and "
                        "write them into the JSON (after the planner was recalibrated)")
    return p


def _rank_counts(text: str) -> list:
    try:
        return [int(n) for n in text.split(",") if n]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rank counts like 2,4,8, got {text!r}") from None


def _list(opts, simulated_ranks=None) -> int:
    from .run import resolve_defaults
    from hf_zero.distributed import gpu_count
    from .setups import select
    from .simulate import planned_runs

    if simulated_ranks:  # each runs as one process: what --simulate-ranks would run, once per setup
        setups = list({s.name: s for _, s in planned_runs(opts, simulated_ranks)}.values())
    else:
        setups = select(opts.setups, opts.variants, resolve_defaults(opts, gpu_count()).nproc)
    for setup in setups:
        extra = {k: v for k, v in (("args", setup.args), ("env", setup.env)) if v}
        print(f"{setup.name}: {setup.kind}, micro batch {setup.micro_batch}"
              f"{', gradient checkpointing' if setup.gradient_checkpointing else ''}"
              f"{f', {setup.weights} weights' if setup.weights else ''}"
              + (f", {json.dumps(extra)}" if extra else ""))
        if setup.deepspeed:
            print("  " + json.dumps(setup.deepspeed.get("zero_optimization", {})))
    return 0


def _report(path: Path, out, replan_first: bool) -> int:
    """Re-render a sweep's results.json, or a --simulate-ranks simulated.json, optionally replanned first."""
    from . import report, run, simulate

    data = report.load(path)
    simulated = path.name == "simulated.json"
    if replan_first:
        replanned = (simulate.replan if simulated else run.replan)(data)
        print(f"replanned {replanned} row(s) with the installed planner")
        run.write_results(path, data)
    written = (simulate.write_reports if simulated else report.write_reports)(data, Path(out or path.parent))
    print("wrote " + ", ".join(map(str, written)))
    return 0


def run(args) -> int:
    if args.replan and not args.report:
        raise ConfigError("--replan recomputes the planner column of an existing results.json: pass it with --report PATH")
    if args.report:
        return _report(Path(args.report), args.out, args.replan)
    from .run import Options, run_bench

    if args.profile_steps < 0:
        raise ConfigError(f"--profile-steps must be 0 (off) or more, got {args.profile_steps}")
    if args.warmup is not None and args.warmup < 0:
        raise ConfigError(f"--warmup must be 0 or more, got {args.warmup}")
    for flag in ("nproc", "steps", "seq"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag} must be a positive integer, got {value}")
    for flag in ("max_minutes", "setup_timeout"):
        value = getattr(args, flag)
        if value is not None and not value > 0:  # also NaN
            raise ConfigError(f"--{flag.replace('_', '-')} must be a positive number, got {value:g}")
    opts = Options(out=args.out or "bench_out", setups=args.setups, variants=args.variant, nproc=args.nproc, model=args.model,
                   steps=args.steps, warmup=args.warmup, seq=args.seq, resume=args.resume, fresh=args.fresh,
                   max_minutes=args.max_minutes, setup_timeout=args.setup_timeout, keep_saved=args.keep_saved,
                   save_all=args.save_all,
                   profile_steps=args.profile_steps, memory_snapshot=args.memory_snapshot, host_peaks=args.host_peaks,
                   repeat=args.repeat, ranks_per_gpu=args.ranks_per_gpu, exactness=args.exactness)
    if args.list:
        return _list(opts, args.simulate_ranks)
    if args.simulate_ranks:
        from .simulate import simulate

        return simulate(opts, args.simulate_ranks)
    return run_bench(opts)


def main(argv=None) -> int:
    from hf_zero.distributed import name_cpu_accelerator
    from hf_zero.errors import HfZeroError

    args = build_parser().parse_args(argv)
    name_cpu_accelerator()
    try:
        return run(args)
    except (HfZeroError, ValueError, OSError) as e:
        # bad input: one message saying what and how to fix, never a traceback
        print(f"benchmarks.harness: error: {e}", file=sys.stderr)
        return 2
