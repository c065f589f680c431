"""``hf-zero finetune ...``: the fine-tuning recipe (same as ``python -m hf_zero.finetune``)."""

import argparse


def add_parser(subparsers):
    p = subparsers.add_parser("finetune", add_help=False, help="fine-tune a pretrained model under ZeRO "
                              "(run it under torchrun/accelerate/deepspeed for several processes)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    from ..finetune.train import main

    return main(args.rest)
