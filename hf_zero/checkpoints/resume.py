"""Resuming a ZeRO run: from the last complete checkpoint, on any world size.

DeepSpeed checkpoints are split per data-parallel rank, so resuming on another GPU count
fails (``used a DP world size of 2 but the current world size is 1``). DeepSpeed's universal
checkpoint format (``ds_to_universal``) stores each parameter and its Adam states whole; an
engine built with ``"checkpoint": {"load_universal": true}`` re-splits them for its own world
size. ``prepare_resume`` does the conversion (once, on rank 0) and sets that key.
"""

import logging
import subprocess
import sys
from pathlib import Path

from ..config.live import deepspeed_config_of, load_universal_checkpoint
from ..distributed import from_rank0, is_main_process
from ..errors import CheckpointError
from .folders import ensure_complete, find_zero_checkpoint, last_good_checkpoint

logger = logging.getLogger("hf_zero")


def universal_dir(root: Path, tag: str) -> Path:
    return Path(root) / f"{tag}_universal"


def convert_to_universal(checkpoint, *, trust_checkpoint: bool = False, quiet: bool = True) -> Path:
    """Write ``<tag>_universal/`` (and ``latest_universal``) next to the checkpoint's ``<tag>/``; returns it.

    Reuses a finished earlier conversion. ZeRO-1/2 checkpoints lack the per-parameter layout
    record DeepSpeed's converter wants, so they are converted with ``--inject_missing_state``.
    """
    zero = find_zero_checkpoint(checkpoint)
    if zero is None:
        raise CheckpointError(f"{checkpoint} holds no DeepSpeed ZeRO checkpoint to convert (no global_step*/ folder).")
    ensure_complete(zero, checkpoint, trust=trust_checkpoint, refused="cannot be converted",
                    remedy="Convert an earlier complete checkpoint (hf-zero verify tells which are).")
    return _convert(zero, quiet)


def _convert(zero, quiet: bool = True) -> Path:
    """ds_to_universal on a checkpoint already inspected complete and scanned safe."""
    target = universal_dir(zero.root, zero.tag)
    latest = zero.root / "latest_universal"
    if (target / "zero").is_dir() and latest.is_file() and latest.read_text().strip() == target.name:
        return target  # converted by an earlier attempt
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(zero.tag_dir),
           # no trailing slash: with one the converter writes latest_universal inside the output folder
           "--output_folder", str(target).rstrip("/")]
    if (zero.stage or 0) < 3:
        cmd.append("--inject_missing_state")
    # The converter loads the shards with weights_only=False; the caller's check_checkpoint has already
    # refused any pickle whose globals are outside the allow-list, so it only sees plain tensors.
    proc = subprocess.run(cmd, capture_output=quiet, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-3:] if quiet else []
        raise CheckpointError(f"DeepSpeed's ds_to_universal failed on {zero.tag_dir} (exit {proc.returncode}): "
                          + " | ".join(tail))
    return target


def prepare_resume(trainer, checkpoint=True, *, trust_checkpoint: bool = False):
    """The checkpoint to pass to ``trainer.train(resume_from_checkpoint=...)``, made loadable on this world size.

    ``checkpoint=True`` means the newest *complete* ``checkpoint-N`` in ``args.output_dir``
    (None when there is none, so the run starts fresh). When the checkpoint was written by a
    different number of data-parallel ranks, it is converted to DeepSpeed's universal format
    and the run's DeepSpeed config gets ``"checkpoint": {"load_universal": true}``; optimizer
    states, step and learning-rate schedule carry over. Call it on every rank before train().
    """
    args = trainer.args
    if checkpoint is True:
        checkpoint = last_good_checkpoint(args.output_dir, trust=trust_checkpoint)
        if checkpoint is None:
            logger.info("hf_zero: no complete checkpoint in %s; training starts from scratch", args.output_dir)
            return None
    if not checkpoint:
        return None
    checkpoint = Path(checkpoint)
    config = deepspeed_config_of(args)
    zero = find_zero_checkpoint(checkpoint)
    if config is None or zero is None:
        return str(checkpoint)  # not a DeepSpeed resume: the Trainer's own loading applies
    ensure_complete(zero, checkpoint, trust=trust_checkpoint, refused="cannot be resumed from", scan=checkpoint,
                    remedy="Resume from an earlier complete checkpoint (prepare_resume(trainer, True) finds it).")
    if zero.dp_world_size == args.world_size:
        return str(checkpoint)
    if is_main_process():
        logger.warning("hf_zero: %s was saved by %d rank(s), this run has %d: converting it to DeepSpeed's universal "
                       "format to re-split the optimizer states", checkpoint, zero.dp_world_size, args.world_size)
    failure = None
    if is_main_process():
        try:
            _convert(zero)  # inspected and scanned above
        except CheckpointError as e:
            failure = str(e)
    failure = from_rank0(failure)  # also a barrier: no rank reads a half-written conversion
    if failure:
        raise CheckpointError(failure)
    logger.info("hf_zero: %s", load_universal_checkpoint(config))
    return str(checkpoint)
