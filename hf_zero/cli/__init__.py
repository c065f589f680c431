"""The ``hf-zero`` command: a thin entry that hands each subcommand its own module."""

import argparse
import contextlib
import sys

from ..errors import HfZeroError
from . import check, export, finetune, plan, presets, verify
from .streams import deepspeed_logs_on_stderr

_SUBCOMMANDS = (presets, check, plan, finetune, export, verify)

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-zero", description="DeepSpeed ZeRO for the Hugging Face Trainer.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    # finetune passes every flag through to HfArgumentParser; the other subcommands are strict
    args, unknown = parser.parse_known_args(argv)
    if args.command == "finetune":
        args.rest = unknown + args.rest
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    # finetune's --help must not wait for DeepSpeed: it enters the same context itself, after that
    quiet = deepspeed_logs_on_stderr() if getattr(args, "loads_deepspeed", False) else contextlib.nullcontext()
    try:
        with quiet:
            return args.run(args)
    except (HfZeroError, ValueError, OSError) as e:
        # Bad input: one message saying what and how to fix, never a traceback.
        print(f"hf-zero {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
