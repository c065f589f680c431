"""What a pip-installed hf_zero holds: every module and preset, and no benchmark data; and that it writes a preset's
Accelerate YAML on its own."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_carries_every_module_and_preset_and_no_results(tmp_path):
    """A user who pip-installs hf_zero without the repo still gets every subpackage and recipes/."""
    # from a copy of what the package is built from: setuptools reuses a checkout's build/ folder, whose stale
    # modules (a package since moved out) would otherwise reach the wheel
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    # "recipes" inside hf_zero: a checkout may link hf_zero/recipes to ../recipes; setup.cfg maps the top-level one
    shutil.copytree(ROOT / "hf_zero", source / "hf_zero", ignore=shutil.ignore_patterns("__pycache__", "recipes"))
    shutil.copytree(ROOT / "recipes", source / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source],
                   check=True, capture_output=True)
    [wheel] = out.glob("hf_zero-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (ROOT / "recipes").glob("*.json"):  # the presets: each YAML is written from its JSON
        assert f"hf_zero/recipes/{path.name}" in names
    for path in (ROOT / "recipes" / "accelerate").glob("*.yaml"):  # the launch-only YAMLs, stored
        assert f"hf_zero/recipes/accelerate/{path.name}" in names
    assert "hf_zero/metrics/accuracy/accuracy.py" in names
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "hf_zero").rglob("*.py")}
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)}"
    data = sorted(n for n in names if n.startswith("hf_zero/") and n.endswith((".json", ".png", ".md"))
                  and not n.startswith("hf_zero/recipes/"))
    assert not data, f"benchmark data inside the wheel: {data[:5]}"
    # the benchmark harness (with its release targets) stays in the repository, as does any module-path shim
    harness = sorted(n for n in names if n.startswith(("hf_zero/bench/", "benchmarks/")) or "moved_modules" in n)
    assert not harness, f"repository-only code inside the wheel: {harness[:5]}"
    # installed alone, it writes a preset's Accelerate YAML, as the docs' launch command asks it to
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, wheel], check=True,
                   capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    written = tmp_path / "zero3.yaml"
    done = subprocess.run([sys.executable, "-c", "import hf_zero.cli, hf_zero; print(hf_zero.__file__); "
                           f"hf_zero.cli.main(['presets', 'zero3', '--accelerate-config', {str(written)!r}])"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith(str(site)), done.stdout + done.stderr
    inline = yaml.safe_load(written.read_text())["deepspeed_config"]["deepspeed_config_file"]
    assert json.loads(inline) == json.loads((ROOT / "recipes" / "zero3.json").read_text())


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
