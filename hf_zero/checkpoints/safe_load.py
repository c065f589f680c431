"""Load checkpoints from elsewhere without letting their pickles run code.

A ``torch.save`` file is a pickle; unpickling one made to do so runs any code (DeepSpeed 0.19.8
loads every checkpoint file with ``torch.load(weights_only=False)``). hf_zero defends in two layers:

- ``check_checkpoint(folder)`` reads every pickle's opcodes without unpickling and refuses a file
  that would import anything outside ``ALLOWED_GLOBALS``, what DeepSpeed and torch really write
  (derived from real ZeRO-1/2/3, offload, bf16, 2-process and universal checkpoints);
- ``safe_torch_load`` and ``guard_deepspeed_loads`` make the loads themselves ``weights_only=True``,
  allowing only DeepSpeed's three plain-data classes beyond torch's own list.

``trust=True`` (the CLI's ``--trust-checkpoint``) is the one way past both, per call.
"""

import _compat_pickle
import contextlib
import io
import os
import pickle
import pickletools
import re
from pathlib import Path

from ..compat.deepspeed_api import CHECKPOINT_PLAIN_DATA, weights_only_classes
from ..compat.hf_api import legacy_storage_class, numpy_array_reconstructor
from ..errors import CheckpointError, UnsafeCheckpointError

TRUST_HINT = "If you trust where this checkpoint came from, pass --trust-checkpoint to load it anyway."

# Files of a Trainer checkpoint-N/ that the Trainer and hf_zero never unpickle: training_args.bin
# holds the whole TrainingArguments object (with accelerate's PartialState and DeepSpeedPlugin
# inside), which no allow-list of plain data could pass. Nothing loads it; do not torch.load it.
NEVER_LOADED = frozenset({"training_args.bin"})
PICKLE_SUFFIXES = (".pt", ".bin", ".pth")

# Every (module, name) a real checkpoint imports, and where it was seen (transformers 5.24,
# DeepSpeed 0.19.8, torch 2.13; ZeRO-1/2/3, zero3_offload, bf16 and fp32, 1 and 2 processes,
# ds_to_universal output). Each is a plain-data type or a tensor rebuild function torch's own
# weights_only unpickler also accepts; none runs code beyond building that value.
_EXPLICIT_GLOBALS = {
    # state dicts and param_shapes (model_states, optim_states, universal *.pt, rng_state.pth)
    ("collections", "OrderedDict"),
    ("torch", "Size"),
    # how torch.save writes a tensor: storage + offset/stride, rebuilt without code
    ("torch._utils", "_rebuild_tensor_v2"),
    # a tensor carrying a __dict__ (DeepSpeed's flat fp32 partitions in optim_states)
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch", "Tensor"),
    # DeepSpeed's optimizer states (optim_states, universal optimizer_state.pt): plain-data classes
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
    # rng_state*.pth: numpy's RNG state (the Trainer loads it with these allowed, trainer_pt_utils.safe_globals)
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.dtypes", "UInt32DType"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),  # the same function under numpy < 2
    ("_codecs", "encode"),  # protocol-2 pickles store the array's bytes as latin-1 text
} | CHECKPOINT_PLAIN_DATA  # what older DeepSpeed releases add (a set in model_states)


def _torch_data_globals() -> set:
    """Storage classes and dtypes, by name: which of them a file uses depends on the training dtype."""
    import torch

    legacy = legacy_storage_class()
    names = set()
    for name, value in vars(torch).items():
        if isinstance(value, torch.dtype):
            names.add(("torch", name))
        elif isinstance(value, type) and issubclass(value, legacy) and name.endswith("Storage") and value is not legacy:
            names.add(("torch", name))
    return names


def allowed_globals() -> frozenset:
    """What ``check_checkpoint`` lets a checkpoint pickle import."""
    return frozenset(_EXPLICIT_GLOBALS | _torch_data_globals())


def _weights_only_extras() -> list:
    """The objects torch's weights_only unpickler must additionally accept for DeepSpeed and rng files."""
    import numpy as np

    return [*weights_only_classes(), numpy_array_reconstructor(), np.ndarray, np.dtype, type(np.dtype(np.uint32))]


# ---------------------------------------------------------------------------------------------
# Scanning pickles without unpickling them

_UNRESOLVED = "<unresolved>"  # module of a pseudo-global: the scan could not tell what is imported
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}
_NO_STACK_OPS = {"PROTO", "FRAME"}
_UNKNOWN = object()
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PICKLES = 5  # magic number, protocol, sys info, the object, storage keys; raw bytes follow


def _scan_one_pickle(stream, found: set) -> object:
    """Add the globals one pickle imports to ``found``; return its first value if it is a plain int (else None).

    Only GLOBAL, INST, STACK_GLOBAL and EXT* import anything; every callable that REDUCE, OBJ,
    NEWOBJ or BUILD may call was imported by one of them, so judging the imports judges the calls.
    STACK_GLOBAL takes its names from the stack: the two strings pushed just before (directly or
    from the memo). When anything else could have put them there, the import is unresolved.
    """
    stack, memo, first_int = [], {}, None
    for index, (op, arg, pos) in enumerate(pickletools.genops(stream)):
        name = op.name
        if index <= 1 and first_int is None and name in ("INT", "LONG", "LONG1", "LONG4", "BININT", "BININT1", "BININT2"):
            first_int = arg
        if name in ("GLOBAL", "INST"):
            module, _, attr = arg.partition(" ")
            found.add(_as_imported(module, attr))
            stack.append(_UNKNOWN)
        elif name == "STACK_GLOBAL":
            module, attr = (stack[-2], stack[-1]) if len(stack) >= 2 else (_UNKNOWN, _UNKNOWN)
            if isinstance(module, str) and isinstance(attr, str):
                found.add(_as_imported(module, attr))
            else:
                found.add((_UNRESOLVED, f"STACK_GLOBAL at byte {pos}"))
            stack.append(_UNKNOWN)
        elif name.startswith("EXT"):
            # copyreg's extension registry: the import is whatever this process registered
            found.add((_UNRESOLVED, f"{name} {arg} at byte {pos}"))
            stack.append(_UNKNOWN)
        elif name in _STRING_OPS:
            stack.append(arg if isinstance(arg, str) else _UNKNOWN)
        elif name in _GET_OPS:
            stack.append(memo.get(arg, _UNKNOWN))
        elif name in _PUT_OPS:
            memo[arg] = stack[-1] if stack else _UNKNOWN
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else _UNKNOWN  # as the Unpickler numbers it
        elif name in _NO_STACK_OPS:
            pass
        else:
            stack.append(_UNKNOWN)  # anything else leaves an unknown on top: a later STACK_GLOBAL is unresolved
        del stack[:-2]  # only the top two matter
    return first_int


def _as_imported(module: str, name: str) -> tuple:
    """The name Python's Unpickler really imports: protocol-2 pickles (torch's default) say
    ``__builtin__`` for ``builtins`` and so on, and find_class maps them (fix_imports)."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def pickle_globals(path) -> set:
    """Every (module, name) unpickling this torch.save / pickle file would import, found without unpickling.

    Zip archives (torch.save's format) are read with torch's own archive reader, so the bytes
    scanned are the bytes torch.load would unpickle; legacy (non-zip) files are scanned pickle by
    pickle as torch's legacy loader reads them. Where the scan cannot be sure (truncated or
    malformed pickle, a name taken from something other than a string, TorchScript code), the set
    holds a pseudo-global whose module is ``"<unresolved>"``, which no allow-list contains.
    """
    path = Path(path)
    found = set()
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(0)
        if head == b"PK\x03\x04":
            _scan_zip(f, found)
        else:
            _scan_legacy(f, found)
    return found


def _scan_zip(f, found: set) -> None:
    import torch

    try:
        reader = torch._C.PyTorchFileReader(f)
        records = reader.get_all_records()
    except Exception as e:  # torch's reader raises RuntimeError for any damage
        found.add((_UNRESOLVED, f"not a readable torch.save archive ({str(e).splitlines()[0][:120]})"))
        return
    if any(r.startswith("code/") or r == "constants.pkl" for r in records):
        found.add((_UNRESOLVED, "a TorchScript archive (its code runs when loaded)"))
    pickles = [r for r in records if r.endswith(".pkl")]
    if "data.pkl" not in records:
        found.add((_UNRESOLVED, "an archive without data.pkl (not a torch.save file)"))
    for record in pickles:
        try:
            _scan_one_pickle(io.BytesIO(reader.get_record(record)), found)
        except Exception as e:  # genops: truncated or invalid opcodes
            found.add((_UNRESOLVED, f"{record} is not a complete pickle ({e})"))


def _scan_legacy(f, found: set) -> None:
    size = os.fstat(f.fileno()).st_size
    for i in range(_LEGACY_PICKLES):
        if f.tell() >= size:
            if i == 0:
                found.add((_UNRESOLVED, "an empty file"))
            return
        try:
            first = _scan_one_pickle(f, found)
        except Exception as e:
            found.add((_UNRESOLVED, f"not a complete pickle at byte {f.tell()} ({e})"))
            return
        if i == 0 and first != _TORCH_LEGACY_MAGIC:
            # not torch's legacy layout: a plain pickle file, which pickle-based loaders may read
            # object after object to the end; scan all of it
            while f.tell() < size:
                try:
                    _scan_one_pickle(f, found)
                except Exception as e:
                    found.add((_UNRESOLVED, f"not a complete pickle at byte {f.tell()} ({e})"))
                    return
            return


def disallowed_globals(path) -> list:
    """The imports of ``path`` outside the allow-list, as sorted "module.name" strings ([] if none)."""
    allowed = allowed_globals()
    bad = pickle_globals(path) - allowed
    return sorted(f"{m}: {n}" if m == _UNRESOLVED else f"{m}.{n}" for m, n in bad)


def _problem(path, bad) -> str:
    if all(b.startswith(_UNRESOLVED) for b in bad):
        what = "cannot be checked: " + "; ".join(b.split(": ", 1)[1] for b in bad)
        return f"{path} {what}. Refusing to unpickle it (a crafted pickle runs code). {TRUST_HINT}"
    names = ", ".join(b for b in bad if not b.startswith(_UNRESOLVED))
    return (f"{path} would import {names} when unpickled, which DeepSpeed and torch never write into a checkpoint "
            f"(a crafted pickle runs code this way). Refusing to load it. {TRUST_HINT}")


def checkpoint_files(folder) -> list:
    """The pickle files of a checkpoint folder (recursively) that a resume, export or verify may load."""
    folder = Path(folder)
    if folder.is_file():
        return [folder]
    return sorted(p for p in folder.rglob("*")
                  if p.suffix in PICKLE_SUFFIXES and p.name not in NEVER_LOADED and p.is_file())


def check_checkpoint(folder, trust: bool = False) -> list:
    """Scan every pickle in a checkpoint-N/ or global_step*/ folder (or one file); return the files scanned.

    Raises UnsafeCheckpointError naming each refused file and what it would import.
    ``trust=True`` skips the scan (the user vouched for the source with --trust-checkpoint).
    """
    folder = Path(folder)
    if not folder.exists():
        raise CheckpointError(f"checkpoint {str(folder)!r} does not exist")
    if trust:
        return []
    files = checkpoint_files(folder)
    problems = []
    for path in files:
        bad = disallowed_globals(path)
        if bad:
            problems.append(_problem(path, bad))
    if problems:
        raise UnsafeCheckpointError(problems, source=None if len(problems) == 1 else str(folder))
    return files


# ---------------------------------------------------------------------------------------------
# Loading

def _file_being_loaded(error):
    """The file torch.load was reading when ``error`` was raised (its ``f`` argument), or None."""
    import torch

    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is torch.serialization.load.__code__:
            f = frame.f_locals.get("f")
            return f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
        tb = tb.tb_next
    return None


def _weights_only_failure(path, error) -> UnsafeCheckpointError:
    path = path if path is not None else _file_being_loaded(error)
    bad = disallowed_globals(path) if path is not None and Path(path).is_file() else []
    if bad:
        return UnsafeCheckpointError(_problem(path, bad))
    found = re.search(r"GLOBAL (\S+) was not an allowed global", str(error))
    detail = f"it would import {found.group(1)}" if found else str(error).strip().splitlines()[0]
    where = f"{path}" if path is not None else "a checkpoint file"
    return UnsafeCheckpointError(f"{where} cannot be loaded as plain data (weights_only=True): {detail}. {TRUST_HINT}")


def safe_torch_load(path, trust: bool = False, **kwargs):
    """``torch.load(path, weights_only=True)`` with DeepSpeed's plain-data classes allowed.

    A file that needs anything more raises UnsafeCheckpointError naming the file and the global;
    there is no silent fallback. ``trust=True`` loads with ``weights_only=False``.
    """
    import torch

    if trust:
        return torch.load(path, weights_only=False, **kwargs)
    kwargs.pop("weights_only", None)
    with torch.serialization.safe_globals(_weights_only_extras()):
        try:
            return torch.load(path, weights_only=True, **kwargs)
        except pickle.UnpicklingError as e:
            raise _weights_only_failure(path, e) from None


@contextlib.contextmanager
def guard_deepspeed_loads(folder=None, trust: bool = False):
    """While active, every ``torch.load`` in this process (DeepSpeed's 44 call sites included) is weights_only.

    For code paths where DeepSpeed loads checkpoint files itself (engine.load_checkpoint,
    get_fp32_state_dict_from_zero_checkpoint, ds_to_universal). It uses torch's own switch,
    TORCH_FORCE_WEIGHTS_ONLY_LOAD, which overrides an explicit ``weights_only=False`` at the call
    site, reaches ``from torch import load`` aliases and the worker processes ds_to_universal forks,
    and is read on every call; DeepSpeed's three classes are allowed meanwhile. ``folder`` is scanned
    first with check_checkpoint, so a refusal names the file. ``trust=True`` changes nothing.
    The variable is process-wide: do not load untrusted files from other threads meanwhile
    expecting the old behaviour (they get the safe one).
    """
    if trust:
        yield
        return
    import torch

    if folder is not None:
        check_checkpoint(folder)
    saved = {k: os.environ.get(k) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # both set is an error in torch.load
    try:
        with torch.serialization.safe_globals(_weights_only_extras()):
            yield
    except pickle.UnpicklingError as e:
        raise _weights_only_failure(None, e) from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
