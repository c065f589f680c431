"""``hf-zero finetune ...``: fine-tune a model under ZeRO (same as ``python -m hf_zero.finetune``)."""

import argparse


def add_parser(subparsers):
    p = subparsers.add_parser("finetune", add_help=False, help="fine-tune a pretrained model under ZeRO "
                              "(run it under torchrun/accelerate/deepspeed for several processes)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    if args.rest[:1] in (["-h"], ["--help"]):
        from ..finetune.args import finetune_parser

        finetune_parser().print_help()
        return 0
    from ..finetune.train import main
    from .streams import deepspeed_logs_on_stderr

    with deepspeed_logs_on_stderr():
        return main(args.rest)
