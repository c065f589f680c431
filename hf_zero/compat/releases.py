"""The releases hf_zero supports and was tested on, and the installed ones (from package metadata: no import,
since importing DeepSpeed sets up its accelerator)."""

from importlib import metadata

from packaging.version import Version

# The newest release of each package that hf_zero's tests passed on (make lock, make test-newest) and the last failing
# run of the newest releases, as .ci/record_tested.py wrote them; a newer release is untested, not refused
from .newest_tested import NEWEST_FAILING, NEWEST_TESTED

# The oldest release of each package hf_zero runs on: setup.cfg declares exactly these (a test compares the two),
# and CI's floor environment installs exactly these. Why each floor is where it is: docs/versions.md.
FLOORS = {
    "torch": "2.6.0",
    "transformers": "5.0.0",
    "accelerate": "1.12.0",
    "deepspeed": "0.18.0",
    "safetensors": "0.4.3",
    "peft": "0.18.0",
    "trl": "1.16.0",
    "datasets": "4.7.0",
    "evaluate": "0.4.6",
}
# Imported by hf_zero itself (install_requires); the others only by the features that use them (extras)
REQUIRED = ("torch", "transformers", "accelerate", "deepspeed", "safetensors")


def installed_version(package: str) -> Version | None:
    """The installed release of ``package`` (its local part, such as torch's "+cpu", dropped); None if absent."""
    try:
        return Version(Version(metadata.version(package)).public)
    except metadata.PackageNotFoundError:
        return None


def deepspeed_version(given: str | None = None) -> Version | None:
    """``given`` (tests pass other releases), else the installed DeepSpeed's; None when it is not installed."""
    return Version(given) if given is not None else installed_version("deepspeed")


def below_floor(packages=REQUIRED) -> list[str]:
    """One line for each of ``packages`` that is missing or older than hf_zero's floor; [] when all are fine."""
    problems = []
    for package in packages:
        installed, floor = installed_version(package), Version(FLOORS[package])
        if installed is None:
            problems.append(f"hf_zero needs {package}>={floor}, which is not installed. Fix: pip install '{package}>={floor}'")
        elif installed < floor:
            problems.append(f"hf_zero needs {package}>={floor}, but {package} {installed} is installed. "
                            f"Fix: pip install '{package}>={floor}'")
    return problems


def require_supported_releases() -> None:
    """Stop ``import hf_zero`` with one line (no traceback) when a package it imports is older than its floor
    (installed with --no-deps, or pinned by a cluster): the alternative is an ImportError deep inside a run."""
    problems = below_floor()
    if problems:
        raise SystemExit(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def untested_releases(packages=REQUIRED) -> list[tuple[str, Version, str]]:
    """(package, installed, newest tested) for each of ``packages`` installed in a release newer than CI tested."""
    found = []
    for package in packages:
        installed = installed_version(package)
        if installed is not None and installed > Version(NEWEST_TESTED[package]):
            found.append((package, installed, NEWEST_TESTED[package]))
    return found


def failed_with(package: str, installed: Version) -> str | None:
    """The release of ``package`` at or below ``installed`` that the last failing newest-release run named (hf_zero's
    tests failed on it, on the date the record gives); None when that run named none."""
    failed = (NEWEST_FAILING or {}).get("releases", {}).get(package)
    return failed if failed is not None and Version(failed) <= installed else None


def stack_report() -> list[tuple[str, str, str]]:
    """(package, installed release or "not installed", verdict) for every package hf_zero knows, where the verdict
    places the release against the tested window: "tested window", "newer than tested (N)", "below the floor (F)",
    and for a release at or past one the last newest-release run failed on, that it failed."""
    rows = []
    for package, floor in FLOORS.items():
        installed = installed_version(package)
        if installed is None:
            verdict = "required, missing" if package in REQUIRED else "optional"
        elif installed < Version(floor):
            verdict = f"below the floor ({floor})"
        elif installed > Version(NEWEST_TESTED[package]):
            verdict = f"newer than tested ({floor} to {NEWEST_TESTED[package]})"
            failed = failed_with(package, installed)
            if failed is not None:
                verdict += f"; hf_zero's tests failed on {package} {failed} ({NEWEST_FAILING['date']}, docs/versions.md)"
        else:
            verdict = f"tested window ({floor} to {NEWEST_TESTED[package]})"
        rows.append((package, str(installed) if installed else "not installed", verdict))
    return rows
