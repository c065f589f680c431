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
        print(f"hf-zero {args.command}: error: {_said(e)}", file=sys.stderr)
        return 2


def _said(error: Exception) -> str:
    """The message for ``error``: a file-system error names the path, what went wrong and a fix, not an errno."""
    if isinstance(error, OSError) and error.filename is not None:
        fixes = {FileNotFoundError: "check the path, or create its folder first",
                 PermissionError: "pick a path this user may read or write",
                 IsADirectoryError: "name a file, not a folder", NotADirectoryError: "a part of the path is a file"}
        fix = next((text for kind, text in fixes.items() if isinstance(error, kind)), "check the path")
        return f"{error.filename}: {error.strerror or error}. Fix: {fix}."
    return str(error)


if __name__ == "__main__":
    raise SystemExit(main())
