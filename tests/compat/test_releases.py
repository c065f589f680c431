"""The declared ranges: setup.cfg states exactly hf_zero's floors, a package below its floor stops the import with
one line, and hf-zero check reports the installed stack."""

import configparser
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


def _ci_module(name):
    spec = importlib.util.spec_from_file_location(name, REPO / ".ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def record(tmp_path, monkeypatch):
    """.ci/record_tested.py writing into copies of the record and docs/versions.md, with the installed releases given
    by the test: {package: release} to install, then main(argv) -> (NEWEST_TESTED, NEWEST_FAILING, page text)."""
    module = _ci_module("record_tested")
    for name, source in (("RECORD", REPO / "hf_zero" / "compat" / "newest_tested.py"), ("VERSIONS_PAGE", REPO / "docs" / "versions.md")):
        copy = tmp_path / source.name
        copy.write_text(source.read_text())
        monkeypatch.setattr(module, name, copy)

    def run(installed, *argv):
        monkeypatch.setattr(module, "_installed", lambda package: Version(installed.get(package, releases.NEWEST_TESTED[package])))
        assert module.main(list(argv)) == 0
        tested, failing = module.read_record(module.RECORD)
        return tested, failing, module.VERSIONS_PAGE.read_text()

    run.module = module
    return run


def _junit(path, failed=()):
    cases = [f'<testcase classname="tests.compat.test_x" name="test_{i}"/>' for i in range(3)]
    cases += [f'<testcase classname="tests.zero3.test_y" name="{name}"><failure message="x"/></testcase>' for name in failed]
    path.write_text(f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>')
    return path


def test_a_green_newest_run_widens_the_windows_and_the_page_quotes_them(record, tmp_path):
    tested, failing, page = record({"peft": "9.1.0", "torch": "2.13.0"}, "newest", str(_junit(tmp_path / "j.xml")))
    assert tested["peft"] == "9.1.0" and failing is None
    assert tested["torch"] == releases.NEWEST_TESTED["torch"]  # never moved down to an older installed release
    assert "| 9.1.0 |" in page and "The last `make test-newest` passed" in page


def test_a_red_newest_run_keeps_the_windows_and_names_the_release_and_the_tests(record, tmp_path):
    junit = _junit(tmp_path / "j.xml", failed=["test_reload[zero3]"])
    tested, failing, page = record({"peft": "9.1.0"}, "newest", str(junit))
    assert tested == releases.NEWEST_TESTED
    assert failing["releases"] == {"peft": "9.1.0"} and failing["failed"] == ["tests/zero3/test_y.py::test_reload[zero3]"]
    assert "failed on " in page and "peft 9.1.0: `tests/zero3/test_y.py::test_reload[zero3]`" in page
    # a newest run that wrote no report (pytest stopped at collection) is red too
    _, failing, _ = record({"peft": "9.1.0"}, "newest", str(tmp_path / "missing.xml"))
    assert failing["failed"] == ["pytest wrote no report (it stopped before any test ran)"]
    # make lock's green suite on those releases widens the window and clears the failure it covers
    tested, failing, page = record({"peft": "9.1.0"}, "widen")
    assert tested["peft"] == "9.1.0" and failing is None and "The last `make test-newest` passed" in page


def test_the_lock_pins_every_package_but_torch_and_only_releases():
    pins = _ci_module("lock").read_lock(REPO / ".ci" / "lock.txt")
    assert "torch" not in pins and "hf-zero" not in pins
    for package in releases.FLOORS:
        if package != "torch":
            assert Version(pins[package]) >= Version(releases.FLOORS[package]), package
            # make lock widened the window to what it proved: the lock never holds an untested release
            assert Version(pins[package]) <= Version(releases.NEWEST_TESTED[package]), package
    assert all(Version(release) for release in pins.values())


def test_the_floor_lock_holds_exactly_the_floors():
    pins = _ci_module("lock").read_lock(REPO / ".ci" / "lock-floor.txt")
    assert {package: pins[package] for package in releases.FLOORS} == releases.FLOORS


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


def _installed(monkeypatch, **release):
    """Installed releases as the test gives them (the others at the newest tested): no test depends on what pip
    resolved today."""
    given = {**releases.NEWEST_TESTED, **{package: version for package, version in release.items()}}
    monkeypatch.setattr(releases, "installed_version", lambda package: Version(given[package]) if given.get(package) else None)


def test_check_reports_the_stack_and_flags_an_untested_release(monkeypatch, capsys):
    from hf_zero.cli import main

    _installed(monkeypatch)
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    for package in releases.FLOORS:
        assert f"  {package} " in out
    assert "newer than tested" not in out and out.count("tested window (") == len(releases.FLOORS)
    _installed(monkeypatch, deepspeed="99.0.0")
    assert main(["check"]) == 0
    floor, newest = releases.FLOORS["deepspeed"], releases.NEWEST_TESTED["deepspeed"]
    assert f"deepspeed     99.0.0         newer than tested ({floor} to {newest})" in capsys.readouterr().out
    assert main(["check", "zero2", "--cpu"]) == 0
    out = capsys.readouterr()
    assert "warning [untested-release] deepspeed" in out.out and "deepspeed 99.0.0 is newer than the newest" in out.out


def test_a_release_newer_than_the_lock_runs_make_tests_first_step(tmp_path):
    """make test starts with hf-zero check: with every package one release past the tested window (metadata faked in a
    fresh process), it still exits 0 and says each is newer than tested."""
    fake = {package: f"{Version(release).major}.{Version(release).minor}.{Version(release).micro + 1}"
            for package, release in releases.NEWEST_TESTED.items()}
    code = ("import importlib.metadata as m, sys\nreal = m.version\nfake = " + repr(fake) +
            "\nm.version = lambda name: fake.get(name) or real(name)\nfrom hf_zero.cli import main\nsys.exit(main(['check']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("newer than tested") == len(fake), proc.stdout


def test_check_names_the_failing_newest_release_when_the_record_has_one(monkeypatch, capsys):
    from hf_zero.cli import main

    monkeypatch.setattr(releases, "NEWEST_FAILING", {"date": "2026-12-01", "releases": {"peft": "9.1.0"}, "failed": ["t"]})
    _installed(monkeypatch, peft="9.1.0")
    assert main(["check"]) == 0
    assert "hf_zero's tests failed on peft 9.1.0 (2026-12-01" in capsys.readouterr().out
    _installed(monkeypatch, peft="9.0.0")  # older than the failing release: untested, not known to fail
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "newer than tested" in out and "failed on" not in out


def test_check_quiet_about_releases_inside_the_tested_window(monkeypatch, capsys):
    from hf_zero.cli import main

    _installed(monkeypatch)
    main(["check", "zero2", "--cpu"])
    assert "untested-release" not in capsys.readouterr().out
