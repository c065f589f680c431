"""results.json -> results.md (the table the docs quote, with the project's targets) and bench.png.

Everything here reads the JSON only, so ``python -m benchmarks.harness --report OUT/results.json`` re-renders a
committed result without a GPU.
"""

import json
from pathlib import Path

from hf_zero.config.presets import load_config
from hf_zero.errors import ConfigError
from hf_zero.planner import GIB
from hf_zero.model_configs import params_text

from . import exactness

SAVE_SECONDS = 5.0  # target: ZeRO-3 16-bit save of the 1.35B model
ZERO2_SPEED, ZERO2_MEMORY = 0.95, 0.65  # zero2 >= 95% of DDP tokens/s at <= 65% of its peak
ZERO3_MEMORY = 1.10  # zero3 >= FSDP tokens/s at <= FSDP peak + 10%
# every setup trains as DDP does: the mean logged loss of the same steps on the same data within this of DDP's. On
# 2x H200 (1.35B, 20 steps) DDP, FSDP, ZeRO-1/2/3 and the offload presets agreed within 0.008; runs with ZeRO-3 leaf
# modules were 0.03 to 0.49 off (docs, presets.md)
LOSS_TOLERANCE = 0.02


def load(path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--report {str(path)!r}: no such file; pass the results.json a sweep wrote") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"--report {str(path)!r}: not readable JSON ({e})") from None
    if not isinstance(data, dict) or "results" not in data or "model" not in data:
        raise ConfigError(f"--report {str(path)!r}: not an python -m benchmarks.harness results.json (no 'results'/'model')")
    return data


def _ok(rows: dict, name: str):
    row = rows.get(name)
    return row if row and row.get("status") == "ok" else None


def is_lora(row: dict) -> bool:
    return bool((row.get("setup") or {}).get("lora"))


def is_variable_length(row: dict) -> bool:
    return bool((row.get("setup") or {}).get("data"))


def reference(rows: dict, row: dict, base: str):
    """The DDP / FSDP row to compare with: same gradient-checkpointing setting (so the same micro batch).
    None for a LoRA row (it trains an adapter, not the model those rows train) and for a variable-length
    row (its batches are shorter and padded, theirs are full)."""
    if is_lora(row) or is_variable_length(row):
        return None
    return _ok(rows, base + ("+gc" if row.get("gradient_checkpointing") else ""))


def data_lines(rows: list, seq: int) -> list:
    """One line per variable-length row: what its batches were, and how often torch.compile compiled."""
    lines = []
    for row in rows:
        data = row.get("data")  # what the worker measured: only variable-length rows that ran have it
        if not data:
            continue
        padded = f", padded to a multiple of {data['pad_to_multiple_of']}" if data.get("pad_to_multiple_of") else ""
        widths = data.get("batch_widths") or []
        graphs = f"; {row['compiled_graphs']} graphs compiled" if row.get("compiled_graphs") else ""
        lines.append(f"- `{row['name']}`: samples of {data['min_seq']}..{seq} tokens (mean "
                     f"{data['mean_sample_tokens']:.0f}){padded}; timed batches {min(widths)}..{max(widths)} tokens wide "
                     f"({len(widths)} widths), "
                     f"{data['padding_share']:.0%} of the batch was padding{graphs}")
    if lines:
        lines = ["Variable-length rows (`data.*` variants): each batch is padded to its longest sample; tokens/s count "
                 "the real tokens, and these rows are not compared with DDP / FSDP, whose batches are full.", ""] + lines
    return lines


def _gpu_memory(row) -> float | None:
    mem = row.get("memory") or {}
    return mem.get("peak_gib") if mem.get("kind") == "cuda" else None


def _spread_note(ratio: float, target: float, ours: dict, theirs: dict) -> str:
    """With --repeat: whether the launches of either setup vary by more than the speed ratio's distance
    from its target, which makes that PASS or FAIL a matter of which launches were kept."""
    spreads = [row.get("tokens_per_s_spread") for row in (ours, theirs)]
    if not any(spreads):
        return ""
    half = [(x or 0) / 2 for x in spreads]
    note = f"; launches vary ±{half[0]:.0%} / ±{half[1]:.0%}"
    return note + (", more than the distance to the target" if abs(ratio - target) < sum(half) else "")


# one GPU: each offload preset's tokens/s against the plain Trainer's at the same tokens per optimizer step
# (preset, tokens per optimizer step it applies to: exactly / at least, fraction of the plain Trainer)
OFFLOAD_TARGETS = (("zero2_offload", "at least", 65_536, 0.85), ("zero3_offload", "at least", 65_536, 0.65),
                   ("zero2_offload", "exactly", 4_096, 0.31), ("zero3_offload", "exactly", 4_096, 0.26))
# what a setup may change and still be "the preset": the batch (micro batch, checkpointing, accumulation)
_BATCH_ARGS = {"gradient_accumulation_steps"}
_SETUP_EXTRAS = ("env", "dynamo", "lora", "data", "callback", "long_context")


def is_shipped(row: dict) -> bool:
    """A row of a preset as recipes/ ships it, or of the plain Trainer: only the batch differs."""
    setup = row.get("setup") or {}
    if any(setup.get(key) for key in _SETUP_EXTRAS) or set(setup.get("args") or {}) - _BATCH_ARGS:
        return False
    if row.get("kind") == "ddp":
        return True
    try:
        return setup.get("deepspeed") == load_config(row["base"])
    except (ConfigError, KeyError, OSError):  # a base that is no preset (an HF "auto" config, a user's file)
        return False


def offload_targets(data: dict) -> list:
    """The one-GPU offload targets, per measured tokens-per-step: the best shipped row of the preset against the
    best plain-Trainer row (micro batch and checkpointing free); empty without offload rows of that kind."""
    ok = [r for r in data["results"] if r.get("status") == "ok" and r.get("tokens_per_step") and is_shipped(r)]
    found = []
    for preset, relation, tokens, share in OFFLOAD_TARGETS:
        steps = sorted({r["tokens_per_step"] for r in ok if r["base"] == preset
                        and (r["tokens_per_step"] >= tokens if relation == "at least" else r["tokens_per_step"] == tokens)})
        for step in steps:
            target = f"{preset} >= {share:.0%} of the plain Trainer at {step:,} tokens per optimizer step (one GPU)"
            ours = max((r for r in ok if r["base"] == preset and r["tokens_per_step"] == step), key=lambda r: r["tokens_per_s"])
            plain = [r for r in ok if r["kind"] == "ddp" and r["tokens_per_step"] == step]
            if not plain:
                found.append((target, "n/a", f"no plain-Trainer row at {step:,} tokens per step"))
                continue
            theirs = max(plain, key=lambda r: r["tokens_per_s"])
            ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
            found.append((target, "PASS" if ratio >= share else "FAIL",
                          f"{ratio:.0%}: {ours['tokens_per_s']:,.0f} ({ours['name']}) against "
                          f"{theirs['tokens_per_s']:,.0f} ({theirs['name']})"))
    return found


def evaluate_targets(data: dict) -> list:
    """The project's targets as (target, "PASS" / "FAIL" / "n/a", detail), from the measured rows."""
    rows = {r["name"]: r for r in data["results"]}
    ranks = data.get("fingerprint", {}).get("nproc")
    found = offload_targets(data) if ranks == 1 else []
    for suffix in ("", "+gc"):
        for name, base, speed, memory in (("zero2", "ddp", ZERO2_SPEED, ZERO2_MEMORY), ("zero3", "fsdp", 1.0, ZERO3_MEMORY)):
            target = (f"{name}{suffix} >= {speed:.0%} of {base}{suffix} tokens/s at <= "
                      f"{memory:.0%} of its peak memory")
            ours, theirs = _ok(rows, name + suffix), _ok(rows, base + suffix)
            if ranks not in (None, 2):
                # one process shards nothing and has no FSDP; the targets are set for two GPUs
                found.append((target, "n/a", f"set for 2 GPUs; this run used {ranks}"))
                continue
            if not ours or not theirs:
                found.append((target, "n/a", "not measured (both setups must have run)"))
                continue
            ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
            a, b = _gpu_memory(ours), _gpu_memory(theirs)
            if a is None or b is None:
                found.append((target, "n/a", f"speed {ratio:.0%}; GPU memory not measured (CPU run)"))
                continue
            passed = ratio >= speed and a / b <= memory
            found.append((target, "PASS" if passed else "FAIL", f"speed {ratio:.0%}, memory {a / b:.0%}"
                          + _spread_note(ratio, speed, ours, theirs)))
    for name in ("zero3", "zero3+gc"):
        target = f"{name}: 16-bit save <= {SAVE_SECONDS:g} s, reloaded weights bitwise equal"
        save = (_ok(rows, name) or {}).get("save")
        if not save:
            found.append((target, "n/a", "not measured"))
            continue
        passed = save["seconds"] <= SAVE_SECONDS and save["reload_equal"]
        detail = f"{save['seconds']:.2f} s, {save['bytes'] / 1e9:.2f} GB, " + (
            "bitwise equal" if save["reload_equal"] else "DIFFERS: " + "; ".join(save["problems"][:3]))
        found.append((target, "PASS" if passed else "FAIL", detail))
    found.append(loss_target(data))
    planned = [r for r in data["results"] if r.get("status") == "ok" and "within_tolerance" in (r.get("planner") or {})]
    if planned:
        misses = [f"{r['name']} {r['planner']['error']:+.0%}" for r in planned if not r["planner"]["within_tolerance"]]
        found.append(("planner predicts each measured peak within +-15%", "FAIL" if misses else "PASS",
                      f"{len(planned) - len(misses)}/{len(planned)} within" + (f"; off: {', '.join(misses)}" if misses else "")))
    else:
        found.append(("planner predicts each measured peak within +-15%", "n/a", "no GPU memory measured"))
    return found


def _mean_loss(row: dict) -> float | None:
    losses = row.get("losses") or []
    return sum(losses) / len(losses) if losses else None


def loss_target(data: dict) -> tuple:
    """(target, result, detail): each setup's mean loss against DDP's of the same gradient-checkpointing setting. Left
    out: LoRA and variable-length rows (they train something else) and configs with a DeepSpeed scheduler block (the
    HF docs' "auto" configs: WarmupLR replaces the Trainer's schedule)."""
    target = f"every setup trains as DDP does: mean loss within {LOSS_TOLERANCE:g} of DDP's"
    rows = {r["name"]: r for r in data["results"]}
    compared, off = 0, []
    for row in data["results"]:
        scheduled = "scheduler" in ((row.get("setup") or {}).get("deepspeed") or {})
        ddp = reference(rows, row, "ddp") if row.get("status") == "ok" and row.get("kind") != "ddp" and not scheduled \
            else None
        ours, theirs = _mean_loss(row), _mean_loss(ddp) if ddp else None
        if ours is None or theirs is None:
            continue
        compared += 1
        if abs(ours - theirs) > LOSS_TOLERANCE:
            off.append(f"{row['name']} {ours - theirs:+.3f}")
    if not compared:
        return target, "n/a", "no setup with a DDP row and logged losses"
    return target, "FAIL" if off else "PASS", f"{compared - len(off)}/{compared} within" + (
        f"; off: {', '.join(off)}" if off else "")


def _pct(value) -> str:
    return f"{value:.0%}" if value is not None else ""


def _num(value, fmt) -> str:
    return format(value, fmt) if value is not None else ""


def table(data: dict) -> str:
    rows = {r["name"]: r for r in data["results"]}
    gpu = any((r.get("memory") or {}).get("kind") == "cuda" for r in rows.values())
    mem = "peak alloc GiB/GPU" if gpu else "peak RSS GiB/rank"
    lines = [f"| setup | mbs | gc | tokens/s | % DDP | % FSDP | TFLOP/s/GPU | {mem} | % DDP mem | % FSDP mem "
             "| reserved GiB | planner GiB (err) | save s | reload | status |",
             "|" + "---|" * 15]
    for row in data["results"]:
        cells = [row["name"], str(row["micro_batch"]), "yes" if row["gradient_checkpointing"] else ""]
        if row.get("status") == "ok":
            ddp, fsdp = reference(rows, row, "ddp"), reference(rows, row, "fsdp")
            peak = row["memory"]["peak_gib"]
            plan = row.get("planner") or {}
            planned = ""
            if plan.get("predicted_gib") is not None:
                planned = f"{plan['predicted_gib']:.1f}" + (f" ({plan['error']:+.0%})" if "error" in plan else "")
            save = row.get("save")
            repeats = row.get("repeat_tokens_per_s") or []
            cells += [f"{row['tokens_per_s']:,.0f}" + (f" ±{row['tokens_per_s_spread'] / 2:.0%} (n={len(repeats)})"
                                                         if len(repeats) > 1 else ""),
                      _pct(row["tokens_per_s"] / ddp["tokens_per_s"]) if ddp else "",
                      _pct(row["tokens_per_s"] / fsdp["tokens_per_s"]) if fsdp else "",
                      _num(row.get("tflops_per_gpu"), ".1f" if gpu else ".4f"), f"{peak:.2f}",
                      _pct(peak / ddp["memory"]["peak_gib"]) if ddp else "",
                      _pct(peak / fsdp["memory"]["peak_gib"]) if fsdp else "",
                      _num(row["memory"].get("peak_reserved_gib"), ".2f"), planned,
                      f"{save['seconds']:.2f}" if save else "",
                      ("equal" if save["reload_equal"] else "DIFFERS") if save else "", "ok"]
        else:
            cells += [""] * 11 + [f"{row.get('status')}: {row.get('error', '')}".replace("|", "/")[:160]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def batch_and_host_table(data: dict) -> str:
    """Tokens per optimizer step (gradient accumulation counted) and the host's memory next to the GPU's: what an
    offload run spends on the CPU side. Empty for results that predate these fields."""
    rows = [r for r in data["results"] if r.get("status") == "ok" and "host_memory" in r]
    if not rows:
        return ""
    lines = ["| setup | tokens / optimizer step | gradient accumulation | host peak RSS GiB/rank | host peak pinned GiB/rank |",
             "|" + "---|" * 5]
    for row in rows:
        host = row["host_memory"]
        lines.append(f"| {row['name']} | {row['tokens_per_step']:,.0f} | {row.get('gradient_accumulation_steps', 1)} | "
                     f"{host['peak_rss_gib']:.2f} | {_num(host.get('peak_pinned_gib'), '.2f')} |")
    return "\n".join(lines)


def _profiled(data: dict) -> list:
    return [r for r in data["results"] if r.get("status") == "ok" and "step_ms" in (r.get("profile") or {})]


def profile_table(data: dict) -> str:
    rows = _profiled(data)
    if not rows:
        return ""
    lines = ["| setup | timed step ms | profiled step ms | compute | comm | exposed comm | GPU idle | CPU waits on GPU "
             "| traced step ms | training thread, traced: own time ms | top kernel |", "|" + "---|" * 11]
    for row in rows:
        p = row["profile"]
        python = ", ".join(f"{k} {v:.1f}" for k, v in sorted(p["cpu_self_ms"].items(), key=lambda kv: -kv[1]) if v >= 0.1)
        top = p["top_kernels"][0] if p["top_kernels"] else None
        lines.append("| " + " | ".join([
            row["name"], f"{row['median_step_s'] * 1000:.1f}", f"{p['step_ms']:.1f}", f"{p['compute_ms']:.1f}",
            f"{p['comm_ms']:.1f}", f"{p['exposed_comm_ms']:.1f}", f"{p['idle_ms']:.1f}", f"{p['cpu_sync_ms']:.1f}",
            _num(p.get("python_traced_step_ms"), ".1f"), python, f"{top['name'][:40]} ({top['ms_per_step']:.1f})".replace("|", "/") if top else ""]) + " |")
    return "\n".join(lines)


def plot_profile(data: dict, path) -> bool:
    """Stacked bars per profiled setup: overlapped compute, exposed communication, GPU idle. False if none."""
    rows = _profiled(data)
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    compute = [r["profile"]["compute_ms"] for r in rows]
    exposed = [r["profile"]["exposed_comm_ms"] for r in rows]
    idle = [r["profile"]["idle_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2) + 3, 5))
    ax.bar(names, compute, label="compute kernels", color="tab:blue")
    ax.bar(names, exposed, bottom=compute, label="exposed communication", color="tab:red")
    ax.bar(names, idle, bottom=[a + b for a, b in zip(compute, exposed)], label="GPU idle", color="tab:gray")
    # the profiler's own per-operator cost lengthens a launch-bound step: show the unprofiled median beside it
    ax.scatter(names, [r["median_step_s"] * 1000 for r in rows], marker="_", s=900, color="black", linewidths=2,
               label="timed step (median, not profiled)", zorder=3)
    ax.set_ylabel("ms per step (rank 0, profiled)")
    ax.set_title(f"{data['model']['name']}: where a step's time goes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: bars fill the axes
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _ok_rows_with(data: dict, key: str) -> list:
    return [r for r in data["results"] if r.get("status") == "ok" and r.get(key)]


def memory_breakdown_table(data: dict) -> str:
    """Per setup with --memory-snapshot: the bytes alive at the recorded step's peak, by allocating code."""
    rows = _ok_rows_with(data, "memory_breakdown")
    if not rows:
        return ""
    lines = ["| setup | allocated by | GiB at the peak |", "|---|---|---|"]
    for row in rows:
        breakdown = row["memory_breakdown"]
        if "rows" not in breakdown:
            lines.append(f"| {row['name']} | {breakdown.get('note', 'not recorded')} | |")
            continue
        lines.append(f"| {row['name']} | **peak of the recorded step** | **{breakdown['peak_bytes'] / GIB:.2f}** |")
        lines += [f"| | `{r['owner']}` | {r['bytes'] / GIB:.2f} |" for r in breakdown["rows"]]
    return "\n".join(lines)


def host_peaks_table(data: dict) -> str:
    """Per setup with --host-peaks: the code that raised rank 0's resident memory on its way to the peak."""
    rows = _ok_rows_with(data, "host_peaks")
    if not rows:
        return ""
    lines = ["| setup | phase | raised by | GiB |", "|---|---|---|---|"]
    for row in rows:
        peaks = row["host_peaks"]
        lines.append(f"| {row['name']} | | **peak resident, from {peaks['start_gib']:.2f} at launch** "
                     f"| **{peaks['peak_gib']:.2f}** |")
        lines += [f"| | {r['phase']} | `{r['code']}` | {r['gib']:.2f} |" for r in peaks["rises"]]
        if peaks["other_gib"]:
            lines.append(f"| | | other code | {peaks['other_gib']:.2f} |")
    return "\n".join(lines)


def _env_text(env: dict) -> str:
    return ", ".join(f"`{k}={val}`" for k, val in env.items())


def environment_lines(rows: list) -> list:
    """What the harness set in the workers' environment: what every row shares once, then what single
    rows (a variant's env.VAR) added, named by row, so a variant's setting is not read as the whole sweep's."""
    envs = [r.get("env_changed") or {} for r in rows]
    if not any(envs):
        return []
    common = {k: val for k, val in envs[0].items() if all(e.get(k) == val for e in envs[1:])}
    lines = [f"Environment the harness set for every setup's workers: {_env_text(common)}."] if common else []
    own = [(row["name"], {k: val for k, val in env.items() if k not in common}) for row, env in zip(rows, envs)]
    if any(env for _, env in own):
        lines += ["Environment set for single setups:", ""]
        lines += [f"- `{name}`: {_env_text(env)}" for name, env in own if env]
    return lines


def machine_text(data: dict) -> str:
    """"2 x H100", or "2 ranks on 1 x H100 (gloo)" for a sweep whose ranks shared GPUs (--ranks-per-gpu)."""
    fp, device = data.get("fingerprint", {}), data.get("device") or {}
    name, nproc = device.get("name", "?"), fp.get("nproc")
    argv = (data.get("runs") or [{}])[-1].get("argv", [])
    shared = int(argv[argv.index("--ranks-per-gpu") + 1]) if "--ranks-per-gpu" in argv[:-1] else 1
    if shared > 1 and nproc:
        return f"{nproc} ranks on {max(nproc // shared, 1)} x {name} (gloo)"
    return f"{nproc} x {name}"


def render_markdown(data: dict) -> str:
    model, fp = data["model"], data.get("fingerprint", {})
    device = data.get("device") or {}
    v = data.get("versions") or {}
    lines = [f"# python -m benchmarks.harness: {model['name']} ({params_text(model['params'])} parameters)", "",
             f"{machine_text(data)}, sequence {fp.get('seq')}, bf16, HF Trainer; "
             f"{fp.get('steps')} steps, tokens/s from the median step after {fp.get('warmup')} warm-up steps "
             "(with --repeat: the median over launches, ± half their range, n launches). "
             "% DDP / % FSDP compare with the DDP / FSDP row of the same gradient-checkpointing setting. "
             "TFLOP/s are model FLOPs (6N + 12 L h seq per token, no recompute). Peak memory is the maximum over "
             "ranks, reset after the model and engine were built."
             + (" Rows with a LoRA adapter (`lora.*` variants) count 4N (no weight gradients for the frozen base) and "
                "are not compared with DDP / FSDP, which train every weight." if any(map(is_lora, data["results"])) else ""),
             "",
             "Setups: `ddp` is the Trainer's DDP (find_unused_parameters off), `fsdp` the Trainer's "
             "`fsdp=\"full_shard auto_wrap\"`, `ds_auto_zero2/3` the ZeRO-2/3 configs of the transformers DeepSpeed "
             "docs with `\"auto\"` buckets (their offload blocks left out), the others hf_zero's presets "
             "(recipes/*.json); `+gc` is micro batch 8 with gradient checkpointing, the rest micro batch 4. "
             "ZeRO-3 setups time `trainer.save_model` (16-bit gather) and reload the file against the engine's weights.", ""]
    if device.get("type") != "cuda":
        lines += ["**CPU run**: a tiny model that tests the harness; its speeds and memory say nothing about GPUs, "
                  "and the targets below are defined for H200 GPUs.", ""]
    lines += [table(data), "", "## Targets", "",
              "The zero2 and zero3 speed and memory targets are set for 2x H200, the offload targets for one.", "",
              "| target | result | measured |", "|---|---|---|"]
    lines += [f"| {t} | {s} | {d} |" for t, s, d in evaluate_targets(data)]
    exact = exactness.table(data)
    if exact:
        lines += ["", exact]
    host = batch_and_host_table(data)
    if host:
        lines += ["", "## Batch and host memory", "", host]
    profiled = profile_table(data)
    if profiled:
        lines += ["", "## Where a step's time goes (rank 0, torch.profiler)", "",
                  "Milliseconds per step, from steps profiled after the timed ones. *exposed comm* is NCCL time with no compute "
                  "kernel running; *GPU idle* is the step with no kernel at all. The last columns come from further "
                  "steps profiled with Python tracing, which slows a hook-heavy step (*traced step ms*): *own time* "
                  "splits that traced step among the code running at each moment: each framework's own Python (hooks "
                  "included), and *torch ops* for time inside operators (their C++ work and kernel launches).", "", profiled]
    breakdown = memory_breakdown_table(data)
    if breakdown:
        lines += ["", "## What is alive at the memory peak (rank 0, --memory-snapshot)", "",
                  "One step after the timed ones, recorded with torch.cuda.memory._record_memory_history: the blocks "
                  "alive when the allocated bytes peaked, grouped by the first Python frame outside torch that "
                  "allocated them.", "", breakdown]
    host_peaks = host_peaks_table(data)
    if host_peaks:
        lines += ["", "## What raised the host's memory peak (rank 0, --host-peaks)", "",
                  "Resident memory sampled every 5 ms from launch to the end of the save: each rise past the "
                  "highest value so far is credited to the code the main thread ran then (its innermost frame "
                  "outside torch). *init* is the model's and the engine's start, before the first step.", "", host_peaks]
    lines += ["", "## How this was made", "",
              "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + "."]
    lines += environment_lines(data["results"])
    variable = data_lines(data["results"], fp.get("seq"))
    if variable:
        lines += [""] + variable
    if data.get("replanned"):
        lines += ["", f"The planner column was recomputed on {data['replanned']} with the planner of that date "
                     "(`python -m benchmarks.harness --report results.json --replan`), not the one that ran with the sweep."]
    lines.append("")
    lines += [f"- `{r['command']}` ({r['date']}, {len(r['setups'])} setup(s))" for r in data.get("runs", [])]
    return "\n".join(lines) + "\n"


def plot(data: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = {"ddp": "tab:gray", "fsdp": "tab:green", "ds_auto": "tab:red", "preset": "tab:blue", "variant": "tab:purple"}
    gpu, groups, xs, ys = False, set(), [0.0], [0.0]
    for row in data["results"]:
        if row.get("status") != "ok":
            continue
        gpu = gpu or row["memory"]["kind"] == "cuda"
        base = row.get("base", "")
        group = (row["kind"] if row["kind"] in ("ddp", "fsdp") else "ds_auto" if base.startswith("ds_auto")
                 else "preset")
        if row["name"] not in (base, base + "+gc"):
            group = "variant"
        x, y = row["memory"]["peak_gib"], row["tokens_per_s"]
        groups.add(group)
        xs.append(x)
        ys.append(y)
        ax.scatter(x, y, color=colors[group], marker="^" if row["gradient_checkpointing"] else "o", s=50)
        ax.annotate(row["name"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    for group, color in colors.items():
        if group in groups:
            ax.scatter([], [], color=color, label=group)
    ax.scatter([], [], color="black", marker="^", label="gradient checkpointing")
    ax.set_xlabel("peak allocated GiB per GPU" if gpu else "peak RSS GiB per rank (CPU)")
    ax.set_ylabel("tokens/s (all ranks)")
    fp = data.get("fingerprint", {})
    ax.set_title(f"{data['model']['name']}: {machine_text(data)}, seq {fp.get('seq')}")
    ax.set_xlim(0, max(xs) * 1.2 or 1)  # room for the labels right of the points
    ax.set_ylim(0, max(ys) * 1.1 or 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(data: dict, out) -> list:
    """Write results.md and bench.png next to the JSON; returns the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(render_markdown(data))
    try:
        import matplotlib  # noqa: F401  (an optional extra: a GPU image may lack it)
    except ImportError:
        return [out / "results.md"]  # the JSON keeps everything: --report re-renders the chart elsewhere
    plot(data, out / "bench.png")
    written = [out / "results.md", out / "bench.png"]
    if plot_profile(data, out / "profile.png"):
        written.append(out / "profile.png")
    return written
