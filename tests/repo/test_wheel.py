"""What a pip-installed hf_zero holds: every module and preset, and no benchmark data."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_carries_every_module_and_preset_and_no_results(tmp_path):
    """A user who pip-installs hf_zero without the repo still gets every subpackage and recipes/."""
    from hf_zero.config.presets import preset_descriptions

    # from a copy of what the package is built from: setuptools reuses a checkout's build/ folder, whose stale
    # modules (a package since moved out) would otherwise reach the wheel
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("hf_zero", "recipes"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source],
                   check=True, capture_output=True)
    [wheel] = out.glob("hf_zero-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in preset_descriptions():
        assert f"hf_zero/recipes/{name}.json" in names
        assert f"hf_zero/recipes/accelerate/{name}.yaml" in names
    assert "hf_zero/metrics/accuracy/accuracy.py" in names
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "hf_zero").rglob("*.py")}
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)}"
    data = sorted(n for n in names if n.startswith("hf_zero/") and n.endswith((".json", ".png", ".md"))
                  and not n.startswith("hf_zero/recipes/"))
    assert not data, f"benchmark data inside the wheel: {data[:5]}"
    # the benchmark harness (with its release targets) stays in the repository, as does any module-path shim
    harness = sorted(n for n in names if n.startswith(("hf_zero/bench/", "benchmarks/")) or "moved_modules" in n)
    assert not harness, f"repository-only code inside the wheel: {harness[:5]}"


def declared_packages():
    import configparser

    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return set(setup["options"]["packages"].split())


def test_setup_cfg_declares_every_subpackage():
    """The quick form of the wheel test, in make test: setup.cfg lists its packages by name, and an editable
    install imports a package it leaves out, so only a built wheel would show the gap."""
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "hf_zero").rglob("__init__.py")}
    missing = sorted(folders - declared_packages())
    assert not missing, f"packages setup.cfg does not list (add them under [options] packages): {missing}"
