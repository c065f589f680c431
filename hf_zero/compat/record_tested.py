"""Write the releases this environment runs, for every package hf_zero knows, as the "newest tested" module.

``make test-newest`` runs it after its tests pass (``python -m hf_zero.compat.record_tested FILE``): the module then
says what the newest-release environment ran, and ``hf-zero check`` compares installed releases with it."""

import json
import sys
from pathlib import Path

from .releases import FLOORS, installed_version


HEADER = ('"""The newest release of each package that CI\'s newest-release environment ran its tests on, written by\n'
          '`make test-newest` (python -m hf_zero.compat.record_tested) when they passed: not edited by hand."""\n\n')


def installed_releases() -> dict[str, str]:
    """{package: installed release} for every package with a floor; stops naming any that is missing, since a
    record without it would claim a test that did not run."""
    found = {package: installed_version(package) for package in FLOORS}
    missing = sorted(package for package, version in found.items() if version is None)
    if missing:
        raise SystemExit(f"record_tested: {', '.join(missing)} not installed here; install the test extras "
                         "(pip install -e '.[test,finetune,plot]') before recording what was tested")
    return {package: str(version) for package, version in found.items()}


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m hf_zero.compat.record_tested FILE.py")
    Path(args[0]).write_text(HEADER + "NEWEST_TESTED = " + json.dumps(installed_releases(), indent=4) + "\n")


if __name__ == "__main__":
    main()
