"""What a pip-installed hf_zero holds: every module and preset, and no benchmark data."""

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

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, ROOT],
                   check=True, capture_output=True)
    [wheel] = tmp_path.glob("hf_zero-*.whl")
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
