"""``hf-zero check CONFIG``: lint a DeepSpeed config with DeepSpeed's own parser."""

import contextlib
import json
import sys

from ..config import validate_config
from ..distributed import has_gpu
from ..presets import load_config


def add_parser(subparsers):
    p = subparsers.add_parser("check", help="check a DeepSpeed config (preset name or JSON file)",
                              description="Report every problem in a DeepSpeed config at once. Exit 1 on errors.")
    p.add_argument("config", help="preset name or path to a DeepSpeed JSON file")
    p.add_argument("--world-size", type=int, default=1, help="number of processes the run will have")
    p.add_argument("--cpu", action="store_true", default=None, help="check for a CPU-only machine (default: this machine)")
    p.add_argument("--nvme-path", help="NVMe folder for offload to nvme")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    config = load_config(args.config, nvme_path=args.nvme_path)
    on_cpu = args.cpu if args.cpu is not None else not has_gpu()
    # DeepSpeed logs to stdout; keep stdout for the report (and --json) alone.
    with contextlib.redirect_stdout(sys.stderr):
        findings = validate_config(config, on_cpu=on_cpu, world_size=args.world_size)
    if args.json:
        print(json.dumps([f.__dict__ for f in findings], indent=2))
    elif not findings:
        print(f"{args.config}: OK")
    else:
        for f in findings:
            print(f"{args.config}: {f.severity} [{f.code}] {f.message}\n    fix: {f.fix}")
    return 1 if any(f.severity == "error" for f in findings) else 0
