"""hf_zero.save_pretrained() in a user's Accelerate loop: every rank calls it, the gathered 16-bit weights are written
beside the output folder and moved into place only once they are verified to reload."""

import shutil
from pathlib import Path

from ..batch_counts import UNEVEN_FIX
from ..checkpoints.export import replace_folder
from ..checks import CHECKS, RunContext, run_moment
from ..distributed import from_rank0, wait_for_every_rank
from ..engine.fixes import finish_offload_step
from ..errors import CheckpointError, RanksDivergedError
from .runs import RUNS, WAITS_FOR_RANKS

SAVE_ARRIVAL_TIMEOUT_S = 120


def save_pretrained(accelerator, model, out_dir, processing_class=None, *, arrival_timeout_s: float = SAVE_ARRIVAL_TIMEOUT_S) -> Path:
    """Save the trained model (gathered 16-bit weights under ZeRO-3) as a ``from_pretrained`` folder; every rank calls it.

    The folder is written beside ``out_dir`` and moved into place only once it is verified to reload (weights
    present, no zero-size tensors, shapes match), so a failed save never replaces a good folder. A rank that does not
    call it (a save under ``if accelerator.is_main_process:``) is found before anything is gathered or written: the
    ranks wait ``arrival_timeout_s`` for each other (Accelerators from ``hf_zero.accelerator()``)."""
    out_dir = Path(out_dir)
    if accelerator in WAITS_FOR_RANKS:
        uneven = RUNS[accelerator].kept.get("uneven_batches") if accelerator in RUNS else None
        fix = "call it on every rank, not under `if accelerator.is_main_process:`."
        if uneven:  # the ranks that are missing still run the steps the others did not have
            fix = f"the likely cause is {uneven}; {UNEVEN_FIX[5:]}"
        try:
            wait_for_every_rank("hf_zero.save_pretrained (it gathers ZeRO-3's shards)", arrival_timeout_s, fix)
        except RanksDivergedError as e:
            raise CheckpointError(f"{e} Nothing was written.") from None
    finish_offload_step(model)  # a step prepare(offload_step_in_forward=True) left to the next forward
    state = accelerator.get_state_dict(model)  # a collective: gathers ZeRO-3's 16-bit weights to rank 0
    unwrapped = accelerator.unwrap_model(model)
    problems = []
    if accelerator.is_main_process:
        staging = out_dir.with_name(f".{out_dir.name}.saving")
        shutil.rmtree(staging, ignore_errors=True)
        unwrapped.save_pretrained(str(staging), state_dict=state, safe_serialization=True)
        if processing_class is not None:
            processing_class.save_pretrained(str(staging))
        run = RUNS.get(accelerator) or RunContext("accelerate", {}, accelerator=accelerator)
        run.folder, run.model = staging, unwrapped
        problems = run_moment(CHECKS, "save", run)
        if problems:
            shutil.rmtree(staging, ignore_errors=True)
        else:
            replace_folder(staging, out_dir)
    problems = from_rank0(problems)
    if problems:
        raise CheckpointError("hf_zero: the saved model would not reload (nothing was replaced): " + " ".join(problems))
    return out_dir
