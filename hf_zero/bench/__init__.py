"""GPU benchmark harness: DDP, FSDP, HF-docs "auto" DeepSpeed configs and every hf_zero preset, side by side.

    hf-zero bench --out bench_out                   # every setup, one torchrun launch each
    hf-zero bench --report bench_out/results.json   # re-render results.md and bench.png

setups.py names the setups and parses sweep variants, worker.py runs one setup, run.py launches
the sweep and merges results.json, report.py renders the table, the targets and the chart.
"""

__all__ = []  # a command (hf-zero bench); its modules are imported by name
