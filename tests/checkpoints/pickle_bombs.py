"""Checkpoint files whose unpickling would run code, for the tests of the pickle defences.

The payload only creates an empty marker file, so a test can prove that nothing was unpickled:
if the defences fail, the marker exists. Never load these with ``weights_only=False`` outside a test.
"""

import shutil
from collections import OrderedDict
from pathlib import Path

import torch


class _CreatesFile:
    """Unpickled, it calls ``open(marker, "w")``: any callable would do, this one leaves a trace."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_bomb(path, marker: Path, *, legacy: bool = False, like=None) -> Path:
    """Write a torch.save file at ``path`` whose unpickling creates ``marker``.

    It looks like a DeepSpeed shard (a state dict of real tensors) with the payload inside.
    ``like``: a real shard to copy the contents of, so only the payload differs.
    ``legacy=True`` writes torch's old non-zip format.
    """
    state = torch.load(like, map_location="cpu", weights_only=False) if like else {
        "module": OrderedDict(weight=torch.zeros(2, 2))}
    state["payload"] = _CreatesFile(marker)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    return Path(path)


def bombed_copy(checkpoint, dest, marker: Path, pattern="*model_states.pt") -> tuple:
    """Copy a real checkpoint folder to ``dest`` and replace its first file matching ``pattern`` with a bomb.

    Returns (copied folder, the bombed file).
    """
    dest = Path(dest)
    shutil.copytree(checkpoint, dest)
    target = sorted(dest.rglob(pattern))[0]
    write_bomb(target, marker, like=target)
    return dest, target
