"""A command's stdout carries its answer alone: DeepSpeed's log lines go to stderr.

DeepSpeed's logger writes through a handler bound to the ``sys.stdout`` of the moment DeepSpeed is first imported, so
``$(hf-zero presets zero3 --accelerate-config f.yaml)`` captured its "Setting accelerator to CPU" warning with the
path. Redirecting stdout around a command's work does not reach a handler bound earlier; re-pointing it does.
"""

import contextlib
import logging
import sys

from ..distributed import name_cpu_accelerator

__all__ = ["deepspeed_logs_on_stderr"]


@contextlib.contextmanager
def deepspeed_logs_on_stderr():
    """While the block runs, DeepSpeed's log lines (and what it prints while it is imported) go to stderr."""
    name_cpu_accelerator()  # no accelerator guess, so no warning about it
    with contextlib.redirect_stdout(sys.stderr):  # a first import binds its handler to stderr
        import deepspeed  # noqa: F401
    handlers = [h for h in logging.getLogger("DeepSpeed").handlers
                if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.__stdout__)]
    previous = [h.setStream(sys.stderr) for h in handlers]  # setStream returns the stream it replaced
    try:
        yield
    finally:
        for handler, stream in zip(handlers, previous):
            handler.setStream(stream)
