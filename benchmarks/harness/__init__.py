"""GPU benchmark harness (lives in the repository, outside the installed package): DDP, FSDP, HF-docs "auto" DeepSpeed configs and every hf_zero preset, side by side.

    python -m benchmarks.harness --out bench_out                   # every setup, one torchrun launch each
    python -m benchmarks.harness --report bench_out/results.json   # re-render results.md and bench.png

setups.py names the setups and parses sweep variants, worker.py runs one setup, run.py launches
the sweep and merges results.json, report.py renders the table, the targets and the chart.
"""

__all__ = []  # run from an hf_zero checkout; not part of the installed package
