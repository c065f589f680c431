"""Release knowledge stays in hf_zero/compat/ (docs/versions.md): no other module compares versions, reads them, or
probes a library for what its release has. Each rule also has a leak it must catch, so a rule that stops matching
fails here instead of passing quietly."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hf_zero"
LIBRARIES = ("deepspeed", "transformers", "accelerate", "torch", "numpy")
VERSION_LOOKUPS = ("packaging", "importlib.metadata", "pkg_resources")
ORDERINGS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _root_name(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_names(tree) -> tuple[set, set]:
    """(names bound to a library or anything imported from one, names imported from hf_zero.compat)."""
    library, compat = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            library |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in LIBRARIES}
        elif isinstance(node, ast.ImportFrom):
            names = {a.asname or a.name for a in node.names}
            if (node.module or "").split(".")[0] in LIBRARIES and node.level == 0:
                library |= names
            elif "compat" in (node.module or "").split(".") or (node.module is None and "compat" in names):
                compat |= names
    return library, compat


def _release_names(compat: set, tree) -> set:
    """compat's release values (Version constants, version strings, the installed-version functions) as imported,
    and every name assigned from an expression that uses one."""
    from packaging.version import Version

    from hf_zero.compat import deepspeed_api, hf_api, releases

    def is_version(value):
        return isinstance(value, Version) or (isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)+", value))

    def is_release(name):
        values = [getattr(m, name) for m in (deepspeed_api, hf_api, releases) if hasattr(m, name)]
        return any(is_version(v) or (isinstance(v, dict) and v and all(map(is_version, v.values())))
                   or v in (releases.deepspeed_version, releases.installed_version) for v in values)

    tainted = {name for name in compat if is_release(name)} | ({"releases"} & compat)
    assigns = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)]
    while True:
        grown = tainted | {t.id for n in assigns if {_root_name(v) for v in ast.walk(n.value)} & tainted
                           for t in n.targets if isinstance(t, ast.Name)}
        if grown == tainted:
            return tainted
        tainted = grown


def _probe(node, library: set, class_attributes: set) -> bool:
    """hasattr(x, "name") / getattr(x, "name", default) / inspect.signature(x) asking a library what it has."""
    if not (isinstance(node, ast.Call) and node.args):
        return False
    func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    if func == "signature":
        return _root_name(node.args[0]) in library
    literal = len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
    if not literal or not (func == "hasattr" or (func == "getattr" and len(node.args) == 3)):
        return False
    return _root_name(node.args[0]) in library or (func == "hasattr" and node.args[1].value in class_attributes)


def release_leaks(source: str, class_attributes: set = frozenset()) -> list[str]:
    """Each line of ``source`` that compares or reads a release, or probes a library's attributes, with why."""
    tree = ast.parse(source)
    library, compat = _bound_names(tree)
    release = _release_names(compat, tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            why = [a.name for a in node.names if a.name.startswith(VERSION_LOOKUPS)] and "a version lookup"
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
            why = node.level == 0 and any(m.startswith(VERSION_LOOKUPS) for m in modules) and "a version lookup"
        elif isinstance(node, ast.Attribute):
            why = node.attr in ("__version__", "version_info") and f"reads {node.attr}"
        elif isinstance(node, ast.Compare):
            ordered = any(isinstance(op, ORDERINGS) for op in node.ops)
            why = ordered and {_root_name(n) for n in ast.walk(node)} & release and "orders releases"
        elif isinstance(node, ast.Try):
            caught = {_root_name(h.type) for h in node.handlers} | {getattr(e, "id", None) for h in node.handlers
                                                                    if isinstance(h.type, ast.Tuple) for e in h.type.elts}
            imports = [n for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            why = caught & {"ImportError", "ModuleNotFoundError"} and _bound_names(ast.Module(imports, type_ignores=[]))[0] \
                and "tries an import from a required library"
        else:
            why = _probe(node, library, class_attributes) and "probes a library's attributes"
        if why:
            found.append(f"line {node.lineno}: {why}: {ast.get_source_segment(source, node)[:80]}")
    return found


@pytest.fixture(scope="module")
def class_attributes() -> set:
    """Attributes DeepSpeed's, transformers' and Accelerate's own classes define on the objects hf_zero handles:
    ``hasattr(obj, name)`` on one of them asks which release made ``obj``."""
    from accelerate import Accelerator
    from deepspeed import DeepSpeedEngine
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from transformers import PreTrainedModel, Trainer, TrainingArguments

    names = set()
    for cls in (Accelerator, DeepSpeedEngine, DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3, PreTrainedModel,
                Trainer, TrainingArguments):
        for owner in cls.__mro__:
            if owner.__module__.split(".")[0] in ("deepspeed", "transformers", "accelerate"):
                names |= {name for name in vars(owner) if not name.startswith("__")}
    return names


# hasattr probes by a name that one of those classes also defines, on another kind of object
OTHER_OBJECTS = {"hf_zero/trainer/callback.py": {"use_cache"}}  # the model config's, not TrainingArguments.use_cache


def test_no_module_outside_compat_compares_reads_or_probes_releases(class_attributes):
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if "compat" not in p.relative_to(PACKAGE).parts]
    leaks = [f"{path.relative_to(ROOT)} {leak}" for path in paths
             for leak in release_leaks(path.read_text(),
                                       class_attributes - OTHER_OBJECTS.get(path.relative_to(ROOT).as_posix(), set()))]
    assert not leaks, "move these behind a named function in hf_zero/compat/:\n" + "\n".join(leaks)


LEAKS = {
    "packaging": "from packaging.version import Version\n",
    "packaging module": "import packaging.version\n",
    "metadata": "from importlib import metadata\n",
    "metadata module": "import importlib.metadata\n",
    "__version__": "import deepspeed\nok = deepspeed.__version__\n",
    "python release": "import sys\nnew = sys.version_info\n",
    "compat constant": ("from ..compat.deepspeed_api import ZENFLOW_ZERO3_CHECKED\n"
                        "def f(v):\n    return v <= ZENFLOW_ZERO3_CHECKED\n"),
    "installed release": ("from ..compat.releases import deepspeed_version\n"
                          "def f():\n    installed = deepspeed_version()\n    return installed >= (0, 19)\n"),
    "version string": ("from ..compat import deepspeed_api\nfrom ..compat.deepspeed_api import FROZEN_RECOMPUTE_FIX\n"
                       "newer = '0.20' > FROZEN_RECOMPUTE_FIX\n"),
    "module probe": "import transformers\nnew = hasattr(transformers, 'PreTrainedModel')\n",
    "deep probe": "import torch\nsetter = getattr(torch.storage, '_LegacyStorage', None)\n",
    "imported probe": "from deepspeed import utils\nnew = hasattr(utils, 'set_z3_leaf_module')\n",
    "object probe": "def f(optimizer):\n    return hasattr(optimizer, 'update_offload_overflow_tracker')\n",
    "arguments probe": "def f(args):\n    return hasattr(args, 'gradient_checkpointing')\n",
    "signature": ("import inspect\nfrom deepspeed.utils.zero_to_fp32 import to_torch_tensor\n"
                  "new = 'dtype' in inspect.signature(to_torch_tensor).parameters\n"),
    "import fallback": ("try:\n    from transformers.trainer_utils import rotate_checkpoints\n"
                        "except ImportError:\n    rotate_checkpoints = None\n"),
}


@pytest.mark.parametrize("name", LEAKS)
def test_each_kind_of_leak_is_caught(name, class_attributes):
    assert release_leaks(LEAKS[name], class_attributes), LEAKS[name]


def test_code_that_only_uses_libraries_and_names_releases_passes(class_attributes):
    source = (
        "import transformers\nfrom ..compat.releases import deepspeed_version\n"
        "from ..compat.deepspeed_api import ZENFLOW_ZERO3_CHECKED, frozen_recompute_fails\n"
        "__version__ = '0.1.0'\n"
        "def f(model, arch, batch, layers, version=None):\n"
        "    message = f'DeepSpeed {deepspeed_version(version)} is newer than {ZENFLOW_ZERO3_CHECKED}'\n"
        "    cls = getattr(transformers, arch, None) if hasattr(transformers, arch) else None\n"
        "    if hasattr(model, 'peft_config') and hasattr(batch, 'get') and len(layers) > 2:\n"
        "        return frozen_recompute_fails(version), message, cls\n"
        "try:\n    from peft import PeftModel\nexcept ImportError:\n    PeftModel = None\n"
    )
    assert release_leaks(source, class_attributes) == []
