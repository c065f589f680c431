"""DeepSpeed's compiled ops: where torch caches them, and one line before the first build.

DeepSpeed compiles its C++/CUDA ops (gcc or nvcc, ninja) the first time a run needs them: on CPU shm_comm when the
process group starts, fused Adam or cpu_adam at the first step; each took 17-27 s here, silent, in every process.
torch caches them under TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions/<python>_<cuda>, one folder for
every environment of that Python whatever its torch and DeepSpeed; hf_zero gives each Python environment its own.
"""

import os
import sys
from pathlib import Path

__all__ = ["prepare_op_builds"]

_told = False  # once per process


def _cache_root() -> Path:
    """TORCH_EXTENSIONS_DIR, set to ``<sys.prefix>/torch_extensions`` when unset and that environment is writable."""
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        own = Path(sys.prefix) / "torch_extensions"
        if own.is_dir() or os.access(sys.prefix, os.W_OK):
            os.environ["TORCH_EXTENSIONS_DIR"] = str(own)
    if "TORCH_EXTENSIONS_DIR" in os.environ:
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch_extensions"


def prepare_op_builds() -> Path:
    """Set the per-environment cache folder (unless the user set one) and, while nothing is built there yet, say on
    stderr (local rank 0, once) that the first run builds DeepSpeed's ops. Returns the cache folder."""
    global _told
    root = _cache_root()
    built = root.is_dir() and next(root.rglob("*.so"), None) is not None
    if not built and not _told and os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"hf_zero: DeepSpeed builds its C++/CUDA ops the first time a run needs them; this can take minutes, "
              f"once: they are cached in {root}", file=sys.stderr, flush=True)
        _told = True
    return root
