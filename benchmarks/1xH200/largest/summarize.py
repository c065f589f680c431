"""results.md and largest.png from plan.json (hf-zero plan --largest) and the real runs in runs/ (python -m benchmarks.harness).

    python benchmarks/1xH200/largest/summarize.py
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
GIB = 1024**3
PLAN_COMMAND = ("hf-zero plan 8b --gpus 1 --gpu-mem 139.8 --cpu-mem 125 --nvme-mem 50 --seq 1024 --micro-batch 1 "
                "--gradient-checkpointing --largest --largest-configs configs --json > plan.json")
NOT_RUN = {
    "zero1": "not run: the plain Trainer fits a deeper model on one GPU (ZeRO-1/2 keep a 16-bit copy beside the "
             "fp32 master weights and gain nothing from sharding over one rank)",
    "zero2": "not run: as zero1",
    "zero3": "not run: as zero1",
}

# setups whose run used a config other than the preset the plan counts
RUN_CONFIG_DIFFERS = {
    "zero2_offload": "the run's config had no data_types block, so 16-bit gradient accumulation; the plan's GPU "
                     "figure counts the preset's fp32 gradient partition, 15.6 GiB of it",
}


def load_runs(folder: Path = HERE / "runs") -> dict:
    runs = {}
    for path in sorted(folder.glob("*.json")):
        sweep = json.loads(path.read_text())
        [row] = sweep["results"]
        # the runs read the plan's configs from a scratch copy; the same files are in configs/
        command = sweep["runs"][0]["command"].replace(".whl/largest/", "benchmarks/1xH200/largest/configs/")
        runs[path.stem] = {**row, "command": command, "date": sweep["runs"][0]["date"]}
    return runs


def table(plan: dict, runs: dict) -> list:
    lines = ["| setup | layers | parameters | limit | planned GPU GiB | measured GPU GiB | planned host GiB | "
             "measured host RSS GiB (pinned) | host plan error | planned NVMe GiB | measured NVMe GiB | tokens/s | "
             "save s | reload | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for setup, largest in plan["largest"].items():
        run = runs.get(setup)
        measured = host = error = nvme = speed = save = reload = ""
        planned_nvme = f"{largest['nvme_per_node'] / GIB:.1f}" if largest["nvme_per_node"] else ""
        if run:
            measured = f"{run['memory']['peak_gib']:.2f}"
            peak = run["host_memory"]["peak_rss_gib"]
            host = f"{peak:.1f} ({run['host_memory']['peak_pinned_gib']:.1f})"
            off = (largest["host_per_node"] / GIB - peak) / peak
            error = f"{off:+.0%}" if round(off, 2) else "0%"
            nvme = f"{run['nvme_gib']:.1f}" if run.get("nvme_gib") is not None else ""
            speed = f"{run['tokens_per_s']:,.0f}"
            if run.get("save"):
                save, reload = f"{run['save']['seconds']:.1f}", "equal" if run["save"]["reload_equal"] else "DIFFERS"
        status = run["status"] if run else NOT_RUN.get(setup, "not run")
        if run and setup in RUN_CONFIG_DIFFERS:
            status += f" ({RUN_CONFIG_DIFFERS[setup]})"
        lines.append(f"| {setup} | {largest['layers']} | {largest['params'] / 1e9:.2f}B | {', '.join(largest['limit'])} "
                     f"| {largest['gpu_total'] / GIB:.1f} | {measured} | {largest['host_per_node'] / GIB:.1f} | {host} "
                     f"| {error} | {planned_nvme} | {nvme} | {speed} | {save} | {reload} | {status} |")
    return lines


def host_peak_lines(runs: dict, top: int = 8) -> list:
    """Per run made with --host-peaks: the code that raised the host's resident memory before the save."""
    lines = []
    for setup, run in runs.items():
        peaks = run.get("host_peaks")
        if not peaks:
            continue
        rises = [r for r in peaks["rises"] if r["phase"] != "save"][:top]
        lines += [f"### {setup}: what raised the host's peak", "",
                  f"`python -m benchmarks.harness --host-peaks`: {peaks['start_gib']:.2f} GiB at launch; before the save "
                  f"the peak is {run['host_memory']['peak_rss_gib']:.1f} GiB.", "",
                  "| phase | raised by | GiB |", "|---|---|---|"]
        lines += [f"| {r['phase']} | `{r['code'].split('site-packages/')[-1].replace('/tmp/site/', '')}` "
                  f"| {r['gib']:.2f} |" for r in rises]
        lines.append("")
    return lines


def plot(plan: dict, runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = list(plan["largest"])
    params = [plan["largest"][s]["params"] / 1e9 for s in setups]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar(setups, params, color=["tab:green" if s in runs else "tab:gray" for s in setups])
    for bar, setup in zip(bars, setups):
        limit = ", ".join(plan["largest"][setup]["limit"])
        ax.annotate(f"{bar.get_height():.2f}B\n{limit}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("parameters (billions)")
    ax.set_ylim(0, max(params) * 1.25)
    ax.set_title("Largest Llama-8B-shaped model per setup on one H200 (125 GiB host, 50 GiB NVMe)\n"
                 "green: trained on the GPU, saved and reloaded; grey: planned only", fontsize=10)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    plan = json.loads((HERE / "plan.json").read_text())
    runs = load_runs()
    lines = ["# The largest model on one H200", "",
             "The deepest model of Llama-3-8B's layer shape (hidden 4096, intermediate 14336, 32 heads, 8 key/value "
             "heads, vocabulary 32,000) that each setup trains on one H200 (139.8 GiB) with its 125 GiB of host "
             "memory and 50 GiB of disk for NVMe swap files, at sequence 1024, micro batch 1, gradient "
             "checkpointing, as `hf-zero plan --largest` finds it within 90% of each resource; *limit* is the "
             "resource one more layer would overflow. The runs train that model with `python -m benchmarks.harness` for 3 steps "
             "(1 warm-up), zero3_nvme for 2 (1 warm-up; about a minute each), then save the 16-bit model and "
             "reload it against the engine's weights. *Measured host RSS* is the process's peak until the save "
             "(ru_maxrss), *pinned* torch's pinned pool (DeepSpeed's aio buffers are page-locked outside it); "
             "*host plan error* is the planned host figure against that peak; *measured NVMe* is the swap "
             "files' size at a step's end.",
             "", *table(plan, runs), "", *host_peak_lines(runs),
             "## How this was made", "", f"- plan: `{PLAN_COMMAND}`"]
    for setup, run in runs.items():
        lines.append(f"- {setup} ({run['date']}): `{run['command']}`")
    aio = [json.loads(line) for line in (HERE / "aio_sweep.jsonl").read_text().splitlines() if line.strip()]
    lines += ["", "The swap folder's disk, measured through DeepSpeed's aio handle (`python "
              "benchmarks/1xH200/largest/aio_sweep.py /tmp/aio --gib 2 --settings 8x1,32x8,64x16 --out aio_sweep.jsonl`, "
              "[aio_sweep.jsonl](aio_sweep.jsonl); 8 x 1 is the preset's queue depth and thread count):", ""]
    lines += [f"- queue depth {a['queue_depth']}, {a['thread_count']} thread(s): write {a['write_gib_s']:.2f} GiB/s, "
              f"read {a['read_gib_s']:.2f} GiB/s" for a in aio]
    attempts = load_runs(HERE / "runs" / "attempts")
    lines += ["", "## Attempts that failed", "",
              "zero3_nvme on the H200, with libaio's header and library carried to the machine (CFLAGS, LDFLAGS, "
              "LD_LIBRARY_PATH) and the swap files on its local disk:", ""]
    for name, run in attempts.items():
        lines.append(f"- {name} ({run['date']}): {run['status']}, `{run['error']}`; `{run['command']}`")
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    plot(plan, runs, HERE / "largest.png")


if __name__ == "__main__":
    main()
