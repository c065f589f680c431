"""Imported by the tests and their worker processes: a DeprecationWarning or FutureWarning that hf_zero's own code
causes by calling a deprecated name of a dependency fails the run, so the next rename is caught in CI, not by a user.

setup.cfg ignores DeprecationWarning in general: the dependencies' uses of each other are not hf_zero's to fix.
"""

import sys
import warnings


class HfZeroCallsDeprecatedApi(AssertionError):
    """hf_zero called a name its dependency deprecates: the next release removes it, and users would find out."""


_warn = warnings.warn


def _escalate_hf_zero_deprecations(message, category=None, stacklevel=1, source=None):
    """``warnings.warn``, except that a DeprecationWarning or FutureWarning raised where hf_zero's own code called into
    the warning's package (the first frame outside that package is an hf_zero module) raises instead."""
    category = category or (type(message) if isinstance(message, Warning) else UserWarning)
    if issubclass(category, (DeprecationWarning, FutureWarning)):
        frame = sys._getframe(1)
        package = frame.f_globals.get("__name__", "").split(".")[0]
        while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == package:
            frame = frame.f_back
        caller = frame.f_globals.get("__name__", "") if frame is not None else ""
        if caller.split(".")[0] == "hf_zero" and package != "hf_zero":
            raise HfZeroCallsDeprecatedApi(f"{caller} (line {frame.f_lineno}) calls a deprecated {package} API: {message}")
    return _warn(message, category, stacklevel + 1, source)


# modules look warnings.warn up when they call it (transformers, accelerate, torch and DeepSpeed do)
warnings.warn = _escalate_hf_zero_deprecations
