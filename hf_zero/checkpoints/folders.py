"""What a ZeRO checkpoint folder holds, and whether all of it was written.

A Trainer save is written in place, file by file, with trainer_state.json last; DeepSpeed's
part is one ``global_stepN/`` folder with a model-states file (per rank under stage 3) and an
optimizer-states file per rank. A rank killed mid-save leaves truncated or missing files and
no trainer_state.json, yet ``get_last_checkpoint`` still picks the folder. Everything here
reads only file names, sizes, zip directories and the small rank-0 model-states record.
"""

import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError
from ..zero3.loading import zero3_init_paused
from ..zero3.partitions import full_shapes
from .safe_load import check_checkpoint, safe_torch_load
from .saved_models import has_model_weights, saved_model_problems

TRAINER_STATE = "trainer_state.json"
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


@dataclass
class ZeroCheckpoint:
    """The DeepSpeed part of a checkpoint: ``root`` holds ``latest`` and the ``tag`` folder."""

    root: Path
    tag: str
    stage: int | None = None
    dp_world_size: int | None = None
    problems: list = field(default_factory=list)

    @property
    def tag_dir(self) -> Path:
        return self.root / self.tag

    @property
    def universal(self) -> bool:
        return (self.tag_dir / "zero").is_dir()


def find_zero_checkpoint(folder) -> ZeroCheckpoint | None:
    """The DeepSpeed checkpoint in a Trainer ``checkpoint-N/``, a DeepSpeed save folder or a ``global_stepN/``."""
    folder = Path(folder)
    if any(folder.glob("*model_states.pt")):  # a tag folder itself
        return ZeroCheckpoint(folder.parent, folder.name)
    latest = folder / "latest"
    if latest.is_file():
        return ZeroCheckpoint(folder, latest.read_text().strip())
    tags = sorted((p for p in folder.glob("global_step*") if p.is_dir() and not p.name.endswith("_universal")),
                  key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    return ZeroCheckpoint(folder, tags[-1].name) if tags else None


def checkpoint_within(folder) -> Path | None:
    """The first checkpoint at or under ``folder`` (a ``checkpoint-N/``, a DeepSpeed save with ``latest`` or
    ``global_step*/``, a rank's model-states file, a ``trainer_state.json``), else None: what no replacing of a
    folder may delete."""
    for root, dirs, files in os.walk(folder):
        path = Path(root)
        if (_CHECKPOINT_NAME.match(path.name) or TRAINER_STATE in files or "latest" in files
                or any(d.startswith("global_step") for d in dirs) or any(f.endswith("model_states.pt") for f in files)):
            return path
    return None


def _zip_problem(path: Path) -> str | None:
    """torch.save writes a zip whose directory sits at the end: a truncated file has none."""
    if not path.is_file():
        return f"{path.name} is missing"
    if path.stat().st_size == 0:
        return f"{path.name} is empty (0 bytes)"
    try:
        with zipfile.ZipFile(path) as z:
            z.namelist()
    except (zipfile.BadZipFile, OSError):
        return f"{path.name} is truncated or corrupt ({path.stat().st_size} bytes, no zip directory)"
    return None


def _read_states_record(path: Path, trust: bool) -> dict:
    return safe_torch_load(path, trust=trust, map_location="cpu", mmap=True)


def inspect_zero_checkpoint(ckpt: ZeroCheckpoint, *, trust: bool = False) -> ZeroCheckpoint:
    """Fill stage and world size from the rank-0 record and list what is missing or truncated."""
    tag_dir = ckpt.tag_dir
    if not tag_dir.is_dir():
        ckpt.problems.append(f"{ckpt.root}/latest names {ckpt.tag}, which does not exist")
        return ckpt
    record_file = next((p for p in (tag_dir / "mp_rank_00_model_states.pt", tag_dir / "zero_pp_rank_0_mp_rank_00_model_states.pt")
                        if p.exists()), None)
    if record_file is None:
        ckpt.problems.append(f"{tag_dir.name}: no rank-0 model-states file")
        return ckpt
    problem = _zip_problem(record_file)
    if problem:
        ckpt.problems.append(f"{tag_dir.name}: {problem}")
        return ckpt
    record = _read_states_record(record_file, trust)
    ckpt.dp_world_size = int(record.get("dp_world_size") or 1)
    ckpt.stage = int((record.get("ds_config") or {}).get("zero_optimization", {}).get("stage", 0))
    if ckpt.universal:
        return ckpt  # converted: one folder per parameter, no per-rank files left to count
    prefix = _optim_prefix(tag_dir)
    expected = [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ckpt.dp_world_size)]
    if ckpt.stage == 3:
        expected += [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(ckpt.dp_world_size)]
    for name in expected:
        problem = _zip_problem(tag_dir / name)
        if problem:
            ckpt.problems.append(f"{tag_dir.name}: {problem}")
    return ckpt


def ensure_complete(zero: ZeroCheckpoint, folder, *, trust: bool = False, refused: str, remedy: str,
                    scan=None) -> ZeroCheckpoint:
    """``zero`` inspected complete and its pickles scanned safe (the tag folder, or ``scan``), before anything loads it.

    Raises CheckpointError when it is incomplete (``folder`` is named, ``refused`` says what cannot be done,
    ``remedy`` what to do instead) and UnsafeCheckpointError when a pickle would run code (unless ``trust``)."""
    inspect_zero_checkpoint(zero, trust=trust)  # reads only the rank-0 record, weights_only
    if zero.problems:
        raise CheckpointError(f"{folder} is incomplete, so it {refused}: " + "; ".join(zero.problems) + f". {remedy}")
    check_checkpoint(scan if scan is not None else zero.tag_dir, trust=trust)
    return zero


def _optim_prefix(tag_dir: Path) -> str:
    """bf16 runs write ``bf16_zero_pp_rank_*``; the others ``zero_pp_rank_*``."""
    return "bf16_" if any(tag_dir.glob("bf16_zero_pp_rank_*_optim_states.pt")) else ""


def _model_from_config(folder: Path):
    """The model built on the meta device from config.json, for shapes; None without a usable config."""
    import torch
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError):
        return None
    # the class that wrote the weights (names and heads differ between AutoModel* classes)
    classes = [getattr(transformers, a, None) for a in (config.architectures or [])]
    with torch.device("meta"), zero3_init_paused():
        for cls in [c for c in classes if c is not None] + [transformers.AutoModelForCausalLM, transformers.AutoModel]:
            try:
                return cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)
            except (ValueError, KeyError, TypeError):
                continue
    return None


def checkpoint_problems(folder, *, trust: bool = False) -> list:
    """Everything that makes ``folder`` incomplete or not reloadable; [] when it is good.

    ``folder`` may be a Trainer checkpoint, a DeepSpeed save folder, a ``global_stepN/`` or a
    plain model folder. Raises CheckpointError when it is none of these.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder. Pass a checkpoint-N/ folder, a DeepSpeed global_step*/ "
                          "folder or a saved model folder.")
    zero = find_zero_checkpoint(folder)
    has_weights = has_model_weights(folder)
    if zero is None and not has_weights and not _is_trainer_checkpoint(folder):
        raise CheckpointError(f"{folder} holds neither a ZeRO checkpoint (global_step*/ with model/optimizer states) nor "
                          "model weights (model.safetensors): it is not a checkpoint or model folder.")
    problems = _training_state_problems(folder, zero, trust)
    if zero is not None and not problems and not trust:
        # complete, so someone may load it: refuse (UnsafeCheckpointError) a pickle that would run code
        check_checkpoint(folder)
    if has_weights:
        model = _model_from_config(folder) if (folder / "config.json").exists() else None
        problems += saved_model_problems(folder, model)
    elif zero is None:
        problems.append(f"{folder.name}: no model weights and no DeepSpeed checkpoint")
    return problems


def _is_trainer_checkpoint(folder: Path) -> bool:
    """A Trainer checkpoint by name, or a save_model folder that also got DeepSpeed state (a renamed checkpoint).
    A plain save_model folder (training_args.bin, no global_step*) is a model folder, not a checkpoint."""
    return bool(_CHECKPOINT_NAME.match(folder.name)) or (
        (folder / "training_args.bin").exists() and ((folder / "latest").exists() or any(folder.glob("global_step*"))))


def training_state_problems(folder, *, trust: bool = False) -> list:
    """What is missing for a resume: the Trainer's last-written file and every rank's ZeRO files."""
    folder = Path(folder)
    return _training_state_problems(folder, find_zero_checkpoint(folder), trust)


def _training_state_problems(folder: Path, zero: ZeroCheckpoint | None, trust: bool) -> list:
    problems = []
    if _is_trainer_checkpoint(folder) and not (folder / TRAINER_STATE).exists():
        problems.append(f"{folder.name}: partial save: {TRAINER_STATE}, which the Trainer writes last, is missing")
    if zero is not None:
        problems += inspect_zero_checkpoint(zero, trust=trust).problems
    return problems


def checkpoint_step(path: Path) -> int | None:
    match = _CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def trainer_checkpoints(output_dir) -> list:
    """``checkpoint-N`` folders of a run, oldest step first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=checkpoint_step)


def last_good_checkpoint(output_dir, *, trust: bool = False) -> Path | None:
    """The newest ``checkpoint-N`` that is complete, skipping partial ones (unlike ``get_last_checkpoint``)."""
    for path in reversed(trainer_checkpoints(output_dir)):
        if not checkpoint_problems(path, trust=trust):
            return path
    return None


def set_aside_partial(output_dir, *, trust: bool = False) -> list:
    """Rename incomplete ``checkpoint-N`` folders to ``partial-checkpoint-N``; return (new path, problems) pairs.

    The Trainer's ``resume_from_checkpoint=True`` and its rotation only look at ``checkpoint-*``
    names, so a set-aside folder is neither resumed from nor rotated, and nothing is deleted.
    """
    moved = []
    for path in trainer_checkpoints(output_dir):
        problems = checkpoint_problems(path, trust=trust)
        if problems:
            target = path.with_name("partial-" + path.name)
            n = 1
            while target.exists():
                target, n = path.with_name(f"partial{n}-{path.name}"), n + 1
            path.rename(target)
            moved.append((target, problems))
    return moved


def shape_mismatches(folder, state_shapes: dict) -> list:
    """Names whose shape in ``state_shapes`` differs from the model that folder's config.json builds."""
    model = _model_from_config(Path(folder))
    if model is None:
        return []
    expected = full_shapes(model)
    return [f"{n}: {tuple(s)} != {expected[n]}" for n, s in state_shapes.items() if n in expected and tuple(s) != expected[n]]
