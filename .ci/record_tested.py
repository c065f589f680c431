"""Write what a green or red run proved about releases into hf_zero's record (hf_zero/compat/newest_tested.py) and
the table of docs/versions.md that quotes it.

    python .ci/record_tested.py widen              # make lock, after make test's suite passed on the candidate lock
    python .ci/record_tested.py newest JUNIT.xml   # make test-newest, after its tests ran (green or red)

``widen`` moves each package's "newest tested" release up to the installed one (never down: make test-newest may
have proven a newer torch than the lock's). ``newest`` widens the same way when every test passed; when some failed
it keeps the windows and records the releases newer than them with the failing tests, which ``hf-zero check`` and
docs/versions.md then show. Neither exits non-zero on a red run: a new upstream release must not block a landing.
"""

import datetime
import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from importlib import metadata
from pathlib import Path

from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "hf_zero" / "compat" / "newest_tested.py"
VERSIONS_PAGE = REPO / "docs" / "versions.md"
# docs/versions.md holds the record's words between these lines
BEGIN, END = "<!-- newest-run: written by .ci/record_tested.py -->", "<!-- /newest-run -->"
HEADER = ('"""The releases hf_zero\'s tests last passed on, and the last failing run of the newest releases: written by\n'
          '.ci/record_tested.py (make lock, make test-newest), not by hand. hf-zero check and docs/versions.md read it."""\n\n')


def _installed(package: str) -> Version | None:
    try:
        return Version(Version(metadata.version(package)).public)
    except metadata.PackageNotFoundError:
        return None


def read_record(path: Path | None = None) -> tuple[dict, dict | None]:
    namespace = {}
    exec((path or RECORD).read_text(), namespace)  # the record is our own generated module
    return dict(namespace["NEWEST_TESTED"]), namespace.get("NEWEST_FAILING")


def write_record(tested: dict, failing: dict | None) -> None:
    RECORD.write_text(HEADER + "NEWEST_TESTED = " + json.dumps(tested, indent=4) + "\n\n"
                    "# The last make test-newest whose tests failed, while no later run passed: its date, the releases it ran\n"
                    "# that are newer than NEWEST_TESTED, and the failing tests; None when the last run passed.\n"
                    "NEWEST_FAILING = " + ("None" if failing is None else json.dumps(failing, indent=4)) + "\n")


def installed_releases(packages) -> dict[str, Version]:
    """{package: installed release} for every package of the record; stops naming any that is missing, since a
    record without it would claim a test that did not run."""
    found = {package: _installed(package) for package in packages}
    missing = sorted(package for package, version in found.items() if version is None)
    if missing:
        raise SystemExit(f"record_tested: {', '.join(missing)} not installed here; install the test extras "
                         "(pip install -e '.[test,finetune,plot]') before recording what was tested")
    return found


def widened(tested: dict, installed: dict) -> dict:
    return {package: str(max(Version(tested[package]), installed[package])) for package in tested}


def failed_tests(junit: Path) -> list[str] | None:
    """The ids of the failed and errored tests of a pytest --junitxml report; None when there is no report or it
    holds no test (pytest stopped before running any)."""
    if not junit.exists():
        return None
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    failed, count = [], 0
    for case in cases:
        count += 1
        if case.find("failure") is not None or case.find("error") is not None:
            path = case.get("classname", "").replace(".", "/")
            failed.append(f"{path}.py::{case.get('name')}")
    return failed if count else None


def page_lines(tested: dict, failing: dict | None) -> str:
    """What docs/versions.md says of the last newest-release run, between BEGIN and END."""
    if failing is None:
        return "The last `make test-newest` passed: the newest releases it ran are the \"newest tested\" column above."
    releases = ", ".join(f"{package} {release}" for package, release in failing["releases"].items()) or "no release newer than the table"
    tests = "; ".join(f"`{test}`" for test in failing["failed"][:5])
    more = f" and {len(failing['failed']) - 5} more" if len(failing["failed"]) > 5 else ""
    return (f"**`make test-newest` failed on {failing['date']}** with {releases}: {tests}{more}. hf_zero runs on these "
            "releases, but they are not tested; `hf-zero check` names them. Pin the \"newest tested\" release of each "
            "until a later run passes.")


def write_page(tested: dict, failing: dict | None) -> None:
    page = VERSIONS_PAGE
    text = page.read_text()
    lines = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].split(" ")[0] in tested:
            cells[2] = tested[cells[0].split(" ")[0]]
            line = "| " + " | ".join(cells) + " |"
        lines.append(line)
    text = "\n".join(lines) + "\n"
    block = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not block.search(text):
        raise SystemExit(f"record_tested: {page} has no {BEGIN} ... {END} block to write the newest run into")
    page.write_text(block.sub(lambda _: f"{BEGIN}\n{page_lines(tested, failing)}\n{END}", text))


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    tested, failing = read_record()
    installed = installed_releases(tested)
    if args == ["widen"]:
        tested = widened(tested, installed)
        if failing is not None and all(Version(release) <= Version(tested[package])
                                       for package, release in failing["releases"].items()):
            failing = None  # the lock now holds those releases and make test's suite passed on them
    elif len(args) == 2 and args[0] == "newest":
        failed = failed_tests(Path(args[1]))
        if failed == []:
            tested, failing = widened(tested, installed), None
            print("make test-newest: every test passed; the newest tested releases are recorded")
        else:
            newer = {package: str(release) for package, release in installed.items() if release > Version(tested[package])}
            failing = {"date": datetime.date.today().isoformat(), "releases": newer,
                       "failed": failed if failed is not None else ["pytest wrote no report (it stopped before any test ran)"]}
            print("make test-newest FAILED with the newest releases (not blocking: make test runs the locked ones):\n"
                  f"  newer than tested: {newer or 'none'}\n  failed: " + "\n          ".join(failing["failed"]) +
                  "\n  recorded in hf_zero/compat/newest_tested.py and docs/versions.md: commit them so the next change sees it")
    else:
        print("usage: python .ci/record_tested.py widen | newest JUNIT.xml", file=sys.stderr)
        return 2
    write_record(tested, failing)
    write_page(tested, failing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
