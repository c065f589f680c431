"""Installed package versions, read from package metadata: no import (importing DeepSpeed sets up its accelerator)."""

from importlib import metadata

from packaging.version import Version


def deepspeed_version(given: str | None = None) -> Version | None:
    """``given`` (tests pass other releases), else the installed DeepSpeed's; None when it is not installed."""
    if given is not None:
        return Version(given)
    try:
        return Version(metadata.version("deepspeed"))
    except metadata.PackageNotFoundError:
        return None
