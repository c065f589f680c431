"""generate under ZeRO-3 on several ranks: every rank keeps stepping until all are done.

A ZeRO-3 forward gathers each module's parameters from every rank. When ranks generate different numbers of
tokens (their prompts end at different lengths) and ``synced_gpus`` is False, the rank that finishes first leaves
the others inside a gather that never completes: a silent hang until the process group's timeout. transformers
turns ``synced_gpus`` on by itself under ZeRO-3 unless the caller passes it; ``keep_generation_in_step`` makes an
explicit ``synced_gpus=False`` (a TRL or user loop's) on too, with one warning: the finished ranks then run dummy
forwards until the last one ends, which changes no rank's output.
"""

import functools
import logging

from .divergence import zero3_on_several_ranks

logger = logging.getLogger("hf_zero")


def keep_generation_in_step(engine) -> bool:
    """Under ZeRO-3 on several ranks, make the engine's model's ``generate`` always pass ``synced_gpus=True``;
    returns whether it changed anything (nothing for another stage, one rank, or simulated ranks)."""
    if not zero3_on_several_ranks(engine):
        return False
    model = engine.module
    generate = getattr(model, "generate", None)
    if generate is None or getattr(generate, "hf_zero_synced", False):
        return False
    warned = []

    @functools.wraps(generate)
    def generate_in_step(*args, **kwargs):
        if kwargs.get("synced_gpus") is False and not warned:
            warned.append(True)
            logger.warning("hf_zero: generate(synced_gpus=False) under ZeRO-3 on several ranks would hang when ranks "
                           "finish at different lengths (each forward gathers parameters from every rank); generating "
                           "with synced_gpus=True, which gives the same tokens.")
        kwargs["synced_gpus"] = True
        return generate(*args, **kwargs)

    generate_in_step.hf_zero_synced = True
    model.generate = generate_in_step  # an instance attribute: the class's generate stays as it is
    return True
