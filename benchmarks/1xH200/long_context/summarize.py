"""Builds results.json, results.md and long_context.png in this folder from the raw benchmark-harness files in runs/.

    python benchmarks/1xH200/long_context/summarize.py

It reads runs/ only: every number it writes comes from a raw harness file there. Each row is a setup: `plain` marks
the plain Trainer with gradient checkpointing, `max_seq` is the longest sequence that completed a full step among
the lengths runs/ holds, `by_seq` holds tokens/s and peaks at each length measured (and the error where a length
failed). runs/ holds the plain Trainer at 131,072 tokens only: its longest sequence is not measured here. `hf` is the strongest stack without hf_zero: the Trainer's Liger kernels
(use_liger_kernel=True: fused linear cross-entropy) with gradient checkpointing and the checkpointed activations in
pinned host memory (torch's save_on_cpu, the harness's activation_offload=true); runs/same_call_262144.json measures
it beside hf_zero's long_context in one call.
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = 1024 ** 3
SETUPS = {"p1": ("plain Trainer + gradient checkpointing (ddp+gc, micro batch 1)", True),
          "lc": ("zero2 + hf_zero long_context (tiled MLP, fused loss, offloaded checkpoints; micro batch 1)", False),
          "hf": ("plain Trainer + Liger kernels + checkpointing with activations offloaded to pinned host memory "
                 "(micro batch 1)", False)}


# Where the failure happened, read from the run's log (runs/ keeps the error line only)
FAILED_WHERE = {"hf": "in torch's save_on_cpu, allocating pinned host memory for a checkpointed activation"}


def runnable(command: str) -> str:
    """A run's command as it runs today: runs recorded as `python -m benchmarks.harness ARGS` ran the harness `python -m
    benchmarks.harness ARGS` runs (the CLI has no bench subcommand)."""
    prefix = "python -m benchmarks.harness "
    return "python -m benchmarks.harness " + command[len(prefix):] if command.startswith(prefix) else command


def main():
    rows, commands, beside = {}, [], {}
    for path in sorted((HERE / "runs").glob("*.json")):
        data = json.loads(path.read_text())
        commands += [runnable(run["command"]) for run in data.get("runs", [])]
        for result in data["results"]:
            label, plain = SETUPS[result["name"]]
            row = rows.setdefault(result["name"], {"name": result["name"], "setup": label, "plain": plain, "by_seq": {}})
            if result["status"] != "ok":
                seq = data["runs"][-1]["argv"][data["runs"][-1]["argv"].index("--seq") + 1]
                # a length that completed in another run keeps its measurement
                row["by_seq"].setdefault(str(seq), {"failed": result.get("error"), "source": f"runs/{path.name}"})
                continue
            seq = result["tokens_per_step"]
            host = result.get("host_memory") or {}
            # the long_context row keeps its own runs (their first steps); the one beside hf is its comparison
            target = beside if path.name.startswith("same_call") and result["name"] == "lc" else row["by_seq"]
            target[str(seq)] = {"tokens_per_s": round(result["tokens_per_s"]), "step_s": result["step_times"][-1],
                                       "warm": len(result["step_times"]) > 1,
                                       "peak_alloc_gib": round(result["memory"]["peak_gib"], 2),
                                       "host_peak_rss_gib": round(host.get("peak_rss_gib") or 0, 2),
                                       "host_peak_pinned_gib": round(host.get("peak_pinned_gib") or 0, 2),
                                       "source": f"runs/{path.name}"}
    for row in rows.values():
        row["by_seq"] = dict(sorted(row["by_seq"].items(), key=lambda kv: int(kv[0])))
        row["max_seq"] = max(int(s) for s, m in row["by_seq"].items() if "failed" not in m)
    plain, long, native = rows["p1"], rows["lc"], rows["hf"]
    slope = lambda row, a, b: ((row["by_seq"][b]["peak_alloc_gib"] - row["by_seq"][a]["peak_alloc_gib"])
                               / ((int(b) - int(a)) / 1024))
    summary = {
        "gib_per_1k_tokens": {"long_context": slope(long, "262144", "614400"), "hf": slope(native, "262144", "524288")},
        "tokens_per_s_at_131072": {"plain": plain["by_seq"]["131072"]["tokens_per_s"],
                                   "long_context": long["by_seq"]["131072"]["tokens_per_s"]},
    }
    summary["tokens_per_s_ratio_at_131072"] = (summary["tokens_per_s_at_131072"]["long_context"]
                                               / summary["tokens_per_s_at_131072"]["plain"])
    same = lambda row: (beside if row is long else row["by_seq"])["262144"]
    summary["strongest_baseline"] = {
        "same_call_262144": {name: {k: same(row)[k] for k in ("tokens_per_s", "peak_alloc_gib", "host_peak_pinned_gib")}
                             for name, row in (("hf", native), ("long_context", long))},
        "max_seq": {"hf": native["max_seq"], "long_context": long["max_seq"]},
        "max_seq_ratio": long["max_seq"] / native["max_seq"],
        "hf_failed": {seq: m["failed"] for seq, m in native["by_seq"].items() if "failed" in m},
    }
    out = {"model": "1.35b", "device": "1x NVIDIA H200 (16 CPU cores, 128 GB host)", "commands": commands,
           "results": [plain, long, native], "summary": summary}
    (HERE / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["| setup | seq | tokens/s | peak GPU GiB | host pinned GiB | step s |", "|---|---|---|---|---|---|"]
    for row in (plain, long, native):
        for seq, m in row["by_seq"].items():
            if "failed" in m:
                lines.append(f"| {row['name']} | {int(seq):,} | failed: {m['failed']} ({FAILED_WHERE[row['name']]}) | | | |")
                continue
            step = f"{m['step_s']:.1f}{'' if m.get('warm') else ' (first)'}" if "step_s" in m else ""
            lines.append(f"| {row['name']} | {int(seq):,} | {m['tokens_per_s']:,} | {m['peak_alloc_gib']:.2f} | "
                         f"{m.get('host_peak_pinned_gib', '')} | {step} |")
    lines += ["", f"The plain Trainer is measured at 131,072 tokens only (its longest sequence is not measured). "
              f"At 131,072 tokens long_context runs at {summary['tokens_per_s_ratio_at_131072']:.1%} of plain's tokens/s. "
              f"GPU GiB per 1k more tokens: long_context {summary['gib_per_1k_tokens']['long_context']:.3f} "
              f"(262,144 to 614,400), hf {summary['gib_per_1k_tokens']['hf']:.3f} (262,144 to 524,288).",
              "", f"Against the strongest stack without hf_zero (hf: {native['setup']}), measured in one call at "
              f"262,144 tokens: hf {same(native)['tokens_per_s']:,} tokens/s on {same(native)['peak_alloc_gib']:.2f} GiB "
              f"GPU and {same(native)['host_peak_pinned_gib']:.2f} GiB pinned host memory, long_context "
              f"{same(long)['tokens_per_s']:,} tokens/s on {same(long)['peak_alloc_gib']:.2f} GiB and "
              f"{same(long)['host_peak_pinned_gib']:.2f} GiB. hf's longest full step: {native['max_seq']:,} tokens; "
              + "; ".join(f"at {int(seq):,} it fails ({error})" for seq, error in summary["strongest_baseline"]["hf_failed"].items())
              + f". long_context's longest: {long['max_seq']:,} ({summary['strongest_baseline']['max_seq_ratio']:.2f}x hf's).",
              "", "Commands:", ""] + [f"    {c}" for c in commands]
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row, style in ((plain, "o-"), (long, "s-"), (native, "^-")):
        done = {int(s): m for s, m in row["by_seq"].items() if "failed" not in m}
        ax.plot([s / 1024 for s in done], [m["peak_alloc_gib"] for m in done.values()], style,
                label=row["setup"].split(" (")[0])
    ax.axhline(139.8, color="gray", ls="--", lw=0.8)
    ax.set_xlabel("sequence length (k tokens, micro batch 1)")
    ax.set_ylabel("peak GPU memory (GiB)")
    ax.set_title("1.35B Llama on one H200: memory against sequence length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "long_context.png", dpi=120)


if __name__ == "__main__":
    main()
