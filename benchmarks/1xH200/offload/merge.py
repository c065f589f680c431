"""Build results.json from the raw `python -m benchmarks.harness` files in sweeps/ (each keeps the command that made it).

Rows keep their own date; the merged file's `runs` lists every sweep's command. Some rows are renamed so that each
name is unique and says its preset; two rows each of call3 and call12 are left out (see benchmarks/README.md). Afterwards
`python -m benchmarks.harness --report results.json --replan` recomputes the planner column and writes results.md and bench.png.

    python benchmarks/1xH200/offload/merge.py && python -m benchmarks.harness --report benchmarks/1xH200/offload/results.json --replan
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
CALLS = 29

RENAMES = {
    4: {"ddp@64k": "ddp_mbs4_again@64k", "z2o_mbs32@64k": "zero2_offload_mbs32@64k",
        "z2o_mbs32_fused@64k": "zero2_offload_mbs32_fused@64k", "z3o_mbs32@64k": "zero3_offload_mbs32@64k"},
    5: {"ddp@256k": "ddp_mbs4_again@256k", "z2o_mbs32@256k": "zero2_offload_mbs32@256k",
        "z3o_mbs32@256k": "zero3_offload_mbs32@256k"},
    7: {"zero2_offload_mbs32@64k": "zero2_offload_mbs32_profiled@64k",
        "zero3_offload_mbs32@64k": "zero3_offload_mbs32_profiled@64k"},
    8: {"z3_superoffload_noclip@64k": "zero3_offload_superoffload_mbs32@64k",
        "z2o_zenflow@64k": "zero2_offload_zenflow_mbs32@64k"},
    10: {"zero3_optimizer_offload_mbs32@64k": "zero3_offload_params_on_gpu_mbs32@64k"},
    # from call12 on, zero2_offload accumulates gradients in fp32 (data_types.grad_accum_dtype): rows of the earlier
    # config say "16bitacc" (DeepSpeed's default: 16-bit accumulation buffers on the host)
    12: {"zero2_offload_mbs32@64k": "zero2_offload_16bitacc_mbs32@64k",
         "zero2_offload_mbs32_syncs@64k": "zero2_offload_16bitacc_syncs_mbs32@64k"},
    13: {"zero2_offload@4k": "zero2_offload_16bitacc@4k", "zero2_offload_syncs@4k": "zero2_offload_16bitacc_syncs@4k",
         "zero2_offload_omp1@4k": "zero2_offload_16bitacc_omp1@4k"},
    14: {"zero2_offload_omp1_raised@4k": "zero2_offload_16bitacc_omp1_raised@4k",
         "zero2_offload_mbs32@64k": "zero2_offload_16bitacc_mbs32_again@64k",
         "zero2_offload_fp32acc_mbs32@64k": "zero2_offload_mbs32_fp32acc_again@64k",
         "zero2_offload_fp32acc_mbs32@256k": "zero2_offload_mbs32_fp32acc@256k"},
    15: {"zero3_offload@4k": "zero3_offload_again@4k"},
    18: {"zero2_offload_mbs32_bucket1e8@64k": "zero2_offload_mbs32_fp32acc_bucket1e8@64k",
         "zero2_offload_mbs32_bucket1e9@64k": "zero2_offload_mbs32_fp32acc_bucket1e9@64k",
         "zero2_offload_mbs32_again2@64k": "zero2_offload_mbs32_fp32acc_again2@64k"},
}
# one timed step after one warm-up: too short for the 4k offload rows (call1 has them over 3 timed steps)
# call12's 4k rows: two timed steps; call13 measured the same setups over six
# call24's in-forward row: one warm-up step, so the first timed step had no held step to finish (not steady)
LEFT_OUT = {3: {"zero2_offload@4k", "zero3_offload@4k"}, 12: {"zero2_offload@4k", "zero2_offload_fp32acc@4k"},
            24: {"zero2_offload_inforward_mbs32@64k"}}
# call1's pinned-memory figures read a key torch's host_memory_stats() lacks: 0 there, not measured
PINNED_UNMEASURED = {1}


def _without_pinned(row: dict) -> dict:
    row = {**row, "host_memory": {**row["host_memory"], "peak_pinned_gib": None}}
    per_rank = [{phase: {k: v for k, v in figures.items() if k != "host_peak_pinned_gib"}
                 for phase, figures in rank.items()} for rank in row["memory"]["per_rank"]]
    return {**row, "memory": {**row["memory"], "per_rank": per_rank}}


def merge() -> dict:
    merged = None
    for call in range(1, CALLS + 1):
        sweep = json.loads((HERE / "sweeps" / f"call{call}.json").read_text())
        rows = []
        for row in sweep["results"]:
            if row["name"] in LEFT_OUT.get(call, ()):
                continue
            if call in PINNED_UNMEASURED:
                row = _without_pinned(row)
            rows.append({**row, "name": RENAMES.get(call, {}).get(row["name"], row["name"])})
        if merged is None:
            merged = {**sweep, "results": rows, "runs": list(sweep["runs"])}
        else:
            merged["results"] += rows
            merged["runs"] += sweep["runs"]
    names = [row["name"] for row in merged["results"]]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise SystemExit(f"row names repeat across sweeps: {duplicated}; add them to RENAMES")
    return merged


if __name__ == "__main__":
    (HERE / "results.json").write_text(json.dumps(merge(), indent=1) + "\n")
