"""``hf-zero export CKPT OUT``: a ZeRO checkpoint becomes a model folder that from_pretrained loads."""

import contextlib
import json
import sys

from ..checkpoints.export import DTYPES, export
from .checkpoint_flags import add_checkpoint_flags


def add_parser(subparsers):
    p = subparsers.add_parser("export", help="turn a ZeRO checkpoint into a Hugging Face model folder",
                              description="Consolidate a ZeRO checkpoint (any stage, any world size, saved with or without "
                                          "16-bit gathering) into sharded safetensors with an index, config, generation "
                                          "config and tokenizer, loadable with from_pretrained.")
    p.add_argument("checkpoint", help="a Trainer checkpoint-N/ folder, a DeepSpeed save folder or its global_stepN/")
    p.add_argument("out", help="output model folder (must be empty or new unless --overwrite; outside CHECKPOINT)")
    p.add_argument("--dtype", choices=DTYPES, help="convert the weights to this dtype (default: the dtype the run "
                                                  "trained in, from the checkpoint's config.json, so they equal its weights)")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors file, e.g. 5GB or 500MB")
    p.add_argument("--config", metavar="DIR", help="folder with config.json/tokenizer when the checkpoint has none")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT (only once the export succeeded; never one that holds a "
                                                          "checkpoint)")
    add_checkpoint_flags(p, json_help="print the summary as JSON")
    p.set_defaults(run=run, loads_deepspeed=True)
    return p


def run(args) -> int:
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's and transformers' chatter stays off the report
        summary = export(args.checkpoint, args.out, dtype=args.dtype, max_shard_size=args.max_shard_size,
                         overwrite=args.overwrite, trust_checkpoint=args.trust_checkpoint, config_dir=args.config)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"exported {summary['checkpoint']} (ZeRO-{summary['stage']}, {summary['world_size']} rank(s)) to "
              f"{summary['out']}: {summary['tensors']} tensors in {summary['shards']} {summary['dtype']} shard(s)"
              + (f"; tied copies left to from_pretrained: {', '.join(summary['tied_dropped'])}" if summary["tied_dropped"] else ""))
    return 0
