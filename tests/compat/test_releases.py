"""The declared ranges: setup.cfg states exactly hf_zero's floors, a package below its floor stops the import with
one line, and hf-zero check reports the installed stack."""

import configparser
import runpy
import importlib.util
import subprocess
import sys

import pytest
from packaging.version import Version

from conftest import REPO, worker_env
from hf_zero.compat import releases


def _floor_constraints():
    spec = importlib.util.spec_from_file_location("floor_constraints", REPO / ".ci" / "floor_constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_cfg_declares_exactly_the_floors_hf_zero_knows():
    assert _floor_constraints().floors() == releases.FLOORS
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    declared = {line.split(">=")[0].strip() for line in parser["options"]["install_requires"].split() if ">=" in line}
    assert declared == set(releases.REQUIRED)
    assert parser["options"]["python_requires"] == ">=3.11"


def test_every_tested_window_is_ordered():
    assert releases.FLOORS.keys() == releases.NEWEST_TESTED.keys()
    from packaging.version import Version

    assert all(Version(releases.FLOORS[p]) <= Version(releases.NEWEST_TESTED[p]) for p in releases.FLOORS)


def test_record_tested_writes_the_installed_releases(tmp_path):
    out = tmp_path / "newest_tested.py"
    proc = subprocess.run([sys.executable, "-m", "hf_zero.compat.record_tested", str(out)], cwd=REPO,
                          env=worker_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    recorded = runpy.run_path(str(out))["NEWEST_TESTED"]
    assert recorded.keys() == releases.FLOORS.keys()
    assert all(Version(recorded[p]) == releases.installed_version(p) for p in recorded)


# Run "import hf_zero" in a fresh process where package metadata reports another release of one package: what a
# --no-deps install of that release looks like to hf_zero (it reads the release from metadata, importing nothing).
IMPORT_WITH = """
import importlib.metadata as metadata
real = metadata.version
metadata.version = lambda name: {fake!r} if name == {package!r} else real(name)
import hf_zero
print("imported")
"""


def _import_with(package, fake):
    return subprocess.run([sys.executable, "-c", IMPORT_WITH.format(package=package, fake=fake)], cwd=REPO,
                          env=worker_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("package, fake", [("deepspeed", "0.17.6"), ("transformers", "4.57.1"),
                                           ("accelerate", "1.10.1"), ("torch", "2.5.1+cu124")])
def test_import_stops_with_one_line_below_a_floor(package, fake):
    proc = _import_with(package, fake)
    floor = releases.FLOORS[package]
    installed = fake.split("+")[0]
    assert proc.returncode == 1 and "imported" not in proc.stdout
    assert proc.stderr.strip() == (f"hf_zero needs {package}>={floor}, but {package} {installed} is installed. "
                                   f"Fix: pip install '{package}>={floor}'")


@pytest.mark.parametrize("package, fake", [("deepspeed", "0.18.0"), ("deepspeed", "0.21.0"), ("torch", "2.6.0+cpu")])
def test_import_quiet_at_the_floor_and_above(package, fake):
    proc = _import_with(package, fake)
    assert proc.returncode == 0 and proc.stdout.strip() == "imported" and proc.stderr == ""


def test_check_reports_the_stack_and_flags_an_untested_release(monkeypatch, capsys):
    from hf_zero.cli import main

    assert main(["check"]) == 0
    out = capsys.readouterr().out
    for package in releases.FLOORS:
        assert f"  {package} " in out
    assert "newer than tested" not in out
    installed = releases.installed_version("deepspeed")
    monkeypatch.setitem(releases.NEWEST_TESTED, "deepspeed", "0.0.1")
    assert main(["check"]) == 0
    assert f"deepspeed     {installed}" in capsys.readouterr().out.replace("  deepspeed", "deepspeed")
    assert main(["check", "zero2", "--cpu"]) == 0
    out = capsys.readouterr()
    assert "warning [untested-release] deepspeed" in out.out and "newer than tested (0.18.0 to 0.0.1)" in out.err


def test_check_quiet_about_releases_inside_the_tested_window(capsys):
    from hf_zero.cli import main

    main(["check", "zero2", "--cpu"])
    assert "untested-release" not in capsys.readouterr().out
