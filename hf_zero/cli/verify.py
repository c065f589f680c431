"""``hf-zero verify DIR``: is a checkpoint or model folder complete and reloadable? Exit 0 yes, 1 no."""

import contextlib
import json
import sys

from ..checkpoints.folders import checkpoint_problems
from .checkpoint_flags import add_checkpoint_flags


def add_parser(subparsers):
    p = subparsers.add_parser("verify", help="check that a checkpoint or model folder is complete and reloadable",
                              description="Checks every rank's ZeRO files (present, not truncated), that the Trainer "
                                          "finished the save, and that model weights are present, not zero-size "
                                          "(the classic ZeRO-3 save) and match config.json's shapes. Exit 0 when good, "
                                          "1 when not.")
    p.add_argument("folders", nargs="+", metavar="DIR", help="checkpoint-N/, global_stepN/ or model folder(s)")
    add_checkpoint_flags(p, json_help="print the result as JSON")
    p.set_defaults(run=run, loads_deepspeed=True)
    return p


def run(args) -> int:
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's and transformers' chatter stays off the report
        results = {folder: checkpoint_problems(folder, trust=args.trust_checkpoint) for folder in args.folders}
    if args.json:
        print(json.dumps({f: {"ok": not p, "problems": p} for f, p in results.items()}, indent=2))
    else:
        for folder, problems in results.items():
            print(f"{folder}: {'OK, complete and reloadable' if not problems else 'NOT OK'}")
            for problem in problems:
                print(f"  - {problem}")
    return 1 if any(results.values()) else 0
