"""The options both doors take (ZeroCallback(...), hf_zero.attach(trainer, ...), hf_zero.prepare(...)), checked in
one place before anything is built."""

from ..engine_fixes import step_chunk_problem
from ..errors import ConfigError
from ..zero3.divergence import divergence_check_problem
from ..zero3.modalities import vision_in_step_problem
from ..zero3.moe import moe_leaves_problem
from .catalog import CHECK_IDS
from .pipeline import skip_problem


def option_problems(*, offload_step_chunk=None, divergence_check="whole_run", vision_in_step="keep",
                    moe_leaves="auto", skip_checks=()) -> list:
    found = [step_chunk_problem(offload_step_chunk), divergence_check_problem(divergence_check),
             vision_in_step_problem(vision_in_step), moe_leaves_problem(moe_leaves), skip_problem(skip_checks, CHECK_IDS)]
    return [problem for problem in found if problem]


def check_options(**options) -> None:
    problems = option_problems(**options)
    if problems:
        raise ConfigError(problems)
