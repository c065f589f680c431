""".ci/run: a dependency CI is meant to have (libaio for the NVMe test) fails the run instead of being skipped.

The script runs with stub dpkg/apt-get/id/make first on PATH: what it would install and run is recorded, not done.
"""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_ci(tmp_path, *, installed: bool, apt_ok: bool, root: bool = True):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    log = tmp_path / "calls.log"
    scripts = {
        "dpkg": f"exit {0 if installed else 1}",
        "apt-get": f'echo "apt-get $*" >> {log}; exit {0 if apt_ok else 100}',
        "id": f"echo {0 if root else 1000}",
        "make": f'echo "make $* HF_ZERO_CI=${{HF_ZERO_CI:-}}" >> {log}',
    }
    for name, body in scripts.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}")
    env.pop("HF_ZERO_CI", None)
    proc = subprocess.run(["bash", str(REPO / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    return proc, (log.read_text().splitlines() if log.exists() else [])


def test_failed_libaio_install_fails_ci(tmp_path):
    proc, calls = run_ci(tmp_path, installed=False, apt_ok=False)
    assert proc.returncode != 0 and "apt-get install libaio-dev failed" in proc.stderr
    # the package lists refreshed (the stub fails that too), then no make: nothing ran to skip the NVMe test
    assert calls == ["apt-get install -y -q libaio-dev", "apt-get update -q"]


def test_missing_libaio_without_root_fails_ci(tmp_path):
    proc, calls = run_ci(tmp_path, installed=False, apt_ok=True, root=False)
    assert proc.returncode != 0 and "libaio-dev is not installed and CI is not root" in proc.stderr and calls == []


def test_ci_installs_libaio_then_runs_every_suite_strictly(tmp_path):
    proc, calls = run_ci(tmp_path, installed=False, apt_ok=True)
    assert proc.returncode == 0, proc.stderr
    assert calls == ["apt-get install -y -q libaio-dev", "make test HF_ZERO_CI=1", "make test-nvme HF_ZERO_CI=1",
                     "make test-long HF_ZERO_CI=1", "make test-floor HF_ZERO_CI=1", "make test-newest HF_ZERO_CI=1"]


def test_ci_with_libaio_present_installs_nothing(tmp_path):
    proc, calls = run_ci(tmp_path, installed=True, apt_ok=False)
    assert proc.returncode == 0 and calls[0] == "make test HF_ZERO_CI=1"
