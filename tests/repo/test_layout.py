"""The package's shape: no import circles, no private names across modules, an explicit __all__ per
subpackage, benchmark data outside the package, and a CLI whose --help loads neither torch nor DeepSpeed."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hf_zero"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` names, relative levels resolved."""
    if node.level == 0:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str):
    """(imported hf_zero module, names imported from it) for every import in the file, lazy ones included."""
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hf_zero":
                    yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target.split(".")[0] != "hf_zero":
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                # ``from pkg import module`` imports the module; ``from module import name`` the name
                yield (submodule, []) if submodule in MODULES else (target, [alias.name])


def import_graph() -> dict:
    graph = {}
    for module in MODULES:
        graph[module] = {target for target, _ in imports_of(module) if target in MODULES and target != module}
    return graph


def find_cycle(graph: dict) -> list | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_circles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_private_name_is_imported_from_another_module():
    private = [f"{module}: from {target} import {name}" for module in MODULES for target, names in imports_of(module)
               for name in names if name.startswith("_") and not name.startswith("__")]
    assert not private, "\n".join(private)


def test_every_subpackage_lists_its_public_names():
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        declared = [n for n in tree.body if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)]
        assert declared, f"{module} has no __all__"


def test_benchmark_results_live_outside_the_package():
    data = [p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*") if p.suffix in (".json", ".png", ".md")]
    data = [p for p in data if not p.startswith("hf_zero/metrics/")]
    assert not data, data
    assert (ROOT / "benchmarks" / "README.md").is_file()


HELP_PROBE = """
import sys
from hf_zero.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "deepspeed") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""
SUBCOMMANDS = ["presets", "check", "plan", "finetune", "export", "verify"]


@pytest.mark.parametrize("argv", [["--help"]] + [[name, "--help"] for name in SUBCOMMANDS])
def test_help_loads_neither_torch_nor_deepspeed(argv):
    proc = subprocess.run([sys.executable, "-c", HELP_PROBE.format(argv=argv)], capture_output=True, text=True, cwd=ROOT)
    assert "usage:" in proc.stdout, proc.stderr[-2000:]
    assert "HEAVY:\n" in proc.stdout, proc.stdout.splitlines()[-1]
    assert "Setting accelerator" not in proc.stdout + proc.stderr


def test_cli_commands_do_not_print_deepspeeds_cpu_notice(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "DS_ACCELERATOR"}
    proc = subprocess.run([sys.executable, "-m", "hf_zero", "check", "zero2", "--no-env"], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    assert "zero2" in proc.stdout, proc.stderr[-2000:]
    assert "Setting accelerator" not in proc.stdout + proc.stderr


def test_the_checks_import_nothing_from_a_door():
    """hf_zero.checks sits below both doors (the Trainer's and the Accelerate loop's): what a check shares with a
    door lives below them too, so no import arrow runs back up."""
    doors = ("hf_zero.trainer", "hf_zero.accelerate")
    upward = [f"{module} -> {target}" for module in MODULES if module.startswith("hf_zero.checks")
              for target, _ in imports_of(module) if target.startswith(doors)]
    assert upward == []
